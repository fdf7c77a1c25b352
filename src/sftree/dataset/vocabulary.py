"""A tokenizer's vocabulary identity: which string each token id stands for (`vocabulary_sha256`), so the Teacher's
sampled ids can be checked to mean the same tokens under the Student (`export.teacher_tokens`, docs/outputs.md).

The digest is of the id -> token-string map alone (added tokens included), not of the tokenizer's whole JSON: the
same vocabulary read from an HF folder and from a GGUF (rebuilt by dataset/student.py) gives the same digest,
while a pre-tokenizer or normaliser difference (which changes how text is split, not what an id means) does not
count. Token strings are the tokenizer's own forms (byte-level `Ġ`, SentencePiece `▁`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used, to keep this module's import light
    from tokenizers import Tokenizer

    from sftree.records.tree import SchemaDoc


@dataclass(frozen=True)
class Vocabulary:
    """A vocabulary's identity as tree.json keeps it (`teacher_vocab`): its digest, its size, where it was read."""

    sha256: str
    size: int
    source: str

    def to_doc(self) -> SchemaDoc:
        return {"sha256": self.sha256, "size": self.size, "source": self.source}


def vocabulary_sha256(tokenizer: Tokenizer) -> str:
    """sha256 of the vocabulary's `[[id, token], ...]` in id order, as compact JSON (the module)."""
    pairs = sorted((i, t) for t, i in tokenizer.get_vocab(with_added_tokens=True).items())
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def vocabulary_of(tokenizer: Tokenizer, source: str) -> Vocabulary:
    return Vocabulary(vocabulary_sha256(tokenizer), tokenizer.get_vocab_size(with_added_tokens=True), source)


def read_vocabulary(path: str | Path) -> Vocabulary:
    """The vocabulary of an HF model folder (tokenizer.json) or a .gguf file, read as the Student reads it;
    StudentError naming the path when it is neither."""
    from tokenizers import Tokenizer

    from sftree.dataset.rendering import StudentError
    from sftree.dataset.student import gguf_tokenizer

    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return vocabulary_of(gguf_tokenizer(p), str(path))
    if (p / "tokenizer.json").is_file():
        return vocabulary_of(Tokenizer.from_file(str(p / "tokenizer.json")), str(path))
    raise StudentError(f"{path}: neither an HF model folder with tokenizer.json nor a .gguf file")
