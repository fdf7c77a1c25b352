"""The Teacher's vocabulary, as explore records it in tree.json `teacher_vocab` (docs/outputs.md, "Teacher tokens"):
which tokenizer is the Teacher's (`teacher_tokenizer`: `teacher.tokenizer`, else the GGUF `teacher.launch` serves)
and the identity of its vocabulary, so the export can check that the Student reads the sampled ids as the same
tokens (`export.teacher_tokens`).

The identity is the sha256 of the id -> token-string map as `[[id, token], ...]` in id order, compact JSON, added
tokens included (`map_sha256`): what an id means, not how text is split, so the same vocabulary read from an HF
folder and from a GGUF gives one digest. Explore reads it here, below the stages (scripts/check_design.py, floors):
an HF folder's tokenizer.json through `tokenizers`, a GGUF's map straight from `tokenizer.ggml.tokens` (the string
of id i is its i-th entry, which the Student's GGUF tokenizer rebuilt from that list holds); the export takes the
Student's with `vocabulary_sha256`. tests/test_teacher_vocab_recorded.py pins that the two agree.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sftree.errors import InputError
from sftree.settings import TeacherSettings

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from sftree.records.tree import SchemaDoc


@dataclass(frozen=True)
class TokenizerRef:
    """The Teacher's tokenizer: its file or folder, and the config key that names it (for errors)."""

    key: str  # teacher.tokenizer | teacher.launch.model
    path: Path


@dataclass(frozen=True)
class Vocabulary:
    """A vocabulary's identity as tree.json keeps it (`teacher_vocab`): its digest, its size, where it was read."""

    sha256: str
    size: int
    source: str

    def to_doc(self) -> SchemaDoc:
        return {"sha256": self.sha256, "size": self.size, "source": self.source}


def teacher_tokenizer(teacher: TeacherSettings) -> TokenizerRef | None:
    """Which tokenizer is the Teacher's: `teacher.tokenizer` when set (relative: from the repository root, as
    `teacher.launch`'s paths); else the model `teacher.launch` starts (when teacher-sim does not stand in: explore
    starts the sim first, edge.start_teacher); else None (a server at `base_url` whose files sftree does not have)."""
    from sftree.teacher.llm_server import LaunchSpec, repo_path

    if teacher.tokenizer is not None:
        return TokenizerRef("teacher.tokenizer", repo_path(teacher.tokenizer))
    if teacher.launch is not None and teacher.sim is None:
        return TokenizerRef("teacher.launch.model", LaunchSpec.from_config(teacher.launch).model)
    return None


def map_sha256(vocab: Mapping[str, int]) -> str:
    """The digest of a token -> id map (the module), less llama.cpp's padding entries: its converter fills a
    vocabulary up to the model's embedding size with `[PAD<id>]` tokens (UNUSED: never sampled, never in text), so
    a GGUF and the HF folder it was made from hold the same vocabulary with and without them."""
    pairs = sorted((i, t) for t, i in vocab.items() if t != f"[PAD{i}]")
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def vocabulary_sha256(tokenizer: Tokenizer) -> str:
    """The digest of a `tokenizers` tokenizer's vocabulary, added tokens included (the export's Student)."""
    return map_sha256(tokenizer.get_vocab(with_added_tokens=True))


def read_teacher_vocab(teacher: TeacherSettings) -> Vocabulary | None:
    """The vocabulary of the Teacher's tokenizer (`teacher_tokenizer`), or None when none is known; InputError naming
    the config key and the path when it cannot be read."""
    ref = teacher_tokenizer(teacher)
    return None if ref is None else read_vocabulary_at(ref)


def read_vocabulary_at(ref: TokenizerRef) -> Vocabulary:
    p = ref.path
    where = f"{ref.key} {p}"
    if p.is_file() and p.suffix == ".gguf":
        tokens = _gguf_tokens(p, where)
        return Vocabulary(map_sha256({t: i for i, t in enumerate(tokens)}), len(tokens), str(p))
    if (p / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(p / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises a bare Exception for a file it cannot parse
            raise InputError(f"{where}: tokenizer.json is not a readable tokenizer ({exc})") from None
        vocab = tok.get_vocab(with_added_tokens=True)
        return Vocabulary(map_sha256(vocab), tok.get_vocab_size(with_added_tokens=True), str(p))
    what = (
        "not found" if not p.exists() else "neither an HF model folder with tokenizer.json nor a .gguf file"
    )
    raise InputError(f"{where}: {what} (the Teacher's tokenizer, recorded in tree.json `teacher_vocab`)")


def _gguf_tokens(path: Path, where: str) -> list[str]:
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).fields.get("tokenizer.ggml.tokens")
    except Exception as exc:  # not a GGUF file, or a damaged one
        raise InputError(f"{where}: not a readable GGUF file ({exc})") from None
    tokens = None if field is None else field.contents()
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise InputError(f"{where}: the GGUF has no tokenizer.ggml.tokens list")
    return tokens
