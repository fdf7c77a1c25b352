"""A Student's SentencePiece-style GGUF vocabulary as a `tokenizers.Tokenizer` that gives llama.cpp's ids.

Reads what llama.cpp's src/llama-vocab.cpp reads for these `tokenizer.ggml.model`s (`SPM_MODELS`):
`tokenizer.ggml.tokens`, `.scores`, `.token_type`, `.add_space_prefix`, `.merges` (Gemma 4 only) and
`general.name` (Phi-3's strip rule), and rebuilds the tokenizer from `tokenizers`' building blocks:

- `llama` (Llama 2, Mistral, Phi-3, Gemma 1-3): llama.cpp's `llm_tokenizer_spm_session` merges, within each text
  between matched tokens, the adjacent pair whose concatenation is the vocabulary token of highest score
  (leftmost on a tie), and spells a symbol no token covers as `<0xXX>` byte tokens. That is a BPE whose merges are
  every split of every token into two tokens, ranked by the token's score, with byte fallback; a space prefix
  (`add_space_prefix`) goes before every text between matched tokens, and spaces are U+2581.
- `gemma4`: a BPE over the GGUF's own merges on raw UTF-8 (no byte-level alphabet), spaces as U+2581, split
  only into runs of newlines and runs of other text, with `<0xXX>` byte fallback. llama.cpp takes a run of
  newlines that is a token whole; the merges reach those tokens anyway, so no `ignore_merges`, which would also
  take whole any other text that is a token (`<unused0>`: 6302 of Gemma 4's tokens) where llama.cpp merges.

Checked, not assumed: tests/test_student_vocab_spm.py compares the ids for every test line llama.cpp ships for
these vocabularies (models/ggml-vocab-{llama-spm,phi-3,gemma-4}.gguf with .inp/.out), and for texts with special
tokens, parsed (`encode`) and not (`encode_special_tokens`), whose ids llama.cpp's llama_tokenize gave. One gap
is known: with special tokens parsed, llama.cpp strips only ASCII whitespace after Phi-3's tokens, `tokenizers`'
`rstrip` any Unicode whitespace (U+00A0, U+3000 after `<|user|>` tokenize differently).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# `tokenizer.ggml.model` values read here; "gpt2" (byte-level BPE) is dataset/student.py's `_bpe`.
SPM_MODELS = frozenset({"llama", "gemma4"})

# GGUF token types (llama.cpp's llama_token_type)
_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4

# Tokens llama.cpp makes control by their text whatever their GGUF type (llama_vocab::impl::load: the EOT, EOM,
# FIM and end-of-generation look-ups), so that they are not matched when special tokens are not parsed. (llama.cpp
# looks a FIM text up only where the GGUF names no token for that role, and takes the first it finds.)
_CONTROL_BY_TEXT = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
        "_<EOT>", "[EOT]", "[EOS]", "<｜end▁of▁sentence｜>", "<end_of_utterance>", "<|eom_id|>", "<|return|>",
        "<|call|>", "<|flush|>", "<|calls|>", "</s>", "<eos>", "<turn|>", "<|tool_response>", "[e~[",
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
        "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
        "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>",
        "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
        "[PAD]", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
    }
)  # fmt: skip
# Phi-3 (general.name contains "phi-3"/"phi3"): every matched token swallows the whitespace after it, but these.
_PHI3_NO_RSTRIP = frozenset({"<unk>", "<s>", "<|endoftext|>"})
_SPACE = "\u2581"  # SentencePiece's visible space, what llama_escape_whitespace writes for " "


def spm_tokenizer(
    tokens: list[str],
    scores: list[float],
    types: list[int],
    *,
    add_space_prefix: bool,
    model: str,
    merges: list[str] | None = None,
    name: str = "",
) -> Any:  # a tokenizers.Tokenizer (tokenizers ships no type information)
    """The `tokenizers.Tokenizer` giving llama.cpp's ids for a `tokenizer.ggml.model` in `SPM_MODELS`.

    `merges` is `tokenizer.ggml.merges` (needed for `gemma4`, unused for `llama`, whose merges follow from the
    scores); `name` is `general.name` (llama.cpp strips whitespace after Phi-3's special tokens by it)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tokens)}
    if model == "llama":
        tok = Tokenizer(
            models.BPE(vocab=vocab, merges=spm_merges(tokens, scores), byte_fallback=True, fuse_unk=False)
        )
        escape = [normalizers.Replace(" ", _SPACE)]
        # Prepend, not Metaspace: llama.cpp adds the space even where the text already starts with one
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend(_SPACE), *escape] if add_space_prefix else escape
        )
    elif model == "gemma4":
        if not merges:
            raise ValueError("gemma4 vocabulary without tokenizer.ggml.merges")
        tok = Tokenizer(
            models.BPE(vocab=vocab, merges=gguf_merges(merges), byte_fallback=True, fuse_unk=False)
        )
        add_space_prefix = False  # a BPE vocabulary to llama.cpp: the key is read but never prefixes
        tok.normalizer = normalizers.Replace(" ", _SPACE)
        tok.pre_tokenizer = pre_tokenizers.Split(Regex("\n+"), behavior="isolated")
    else:
        raise ValueError(f"tokenizer.ggml.model {model!r} is not one of {sorted(SPM_MODELS)}")
    steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if add_space_prefix else steps)
    _add_matched(tok, tokens, types, name)
    return tok


def spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, the token of higher score first: llama.cpp's SPM merge order.

    Among tokens of equal score (Llama 2's runs of U+2581, all -1e9) llama.cpp merges the leftmost pair; a BPE
    ranks them, so the longer token goes first: a run then grows from its left, as llama.cpp's leftmost rule
    grows it, instead of pairing up everywhere at once."""
    vocab = set(tokens)
    # the tokens sorted, not their 2x as many splits: 262k tokens in about a second
    order = sorted(range(len(tokens)), key=lambda i: (-scores[i], -len(tokens[i]), i))
    merges = []
    for i in order:
        t = tokens[i]
        for k in range(1, len(t)):
            if t[:k] in vocab and t[k:] in vocab:
                merges.append((t[:k], t[k:]))
    return merges


def gguf_merges(merges: list[str]) -> list[tuple[str, str]]:
    """`tokenizer.ggml.merges` as pairs, split where llama.cpp splits them: the first space after the first
    character (a left part may itself begin with a space). A line without one is left out: llama.cpp ranks it
    as a pair of empty strings, which never occurs, and leaving it out keeps the others' order."""
    pairs = []
    for m in merges:
        at = m.find(" ", 1)
        if at >= 0:
            pairs.append((m[:at], m[at + 1 :]))
    return pairs


def _add_matched(tok: Any, tokens: list[str], types: list[int], name: str) -> None:
    """The tokens llama.cpp matches in the text before tokenizing it (tokenizer_st_partition): control and
    unknown ones only where special tokens are parsed (as `tokenizers`' special added tokens, which
    `encode_special_tokens` turns off), user-defined ones always (plain added tokens)."""
    from tokenizers import AddedToken

    lowered = name.lower()
    phi3 = "phi-3" in lowered or "phi3" in lowered
    special: list[Any] = []  # tokenizers.AddedToken
    plain: list[Any] = []
    for t, ty in zip(tokens, types, strict=True):
        if not t or ty not in (_UNKNOWN, _CONTROL, _USER_DEFINED):
            continue
        control = ty != _USER_DEFINED or t in _CONTROL_BY_TEXT
        added = AddedToken(t, special=control, normalized=False, rstrip=phi3 and t not in _PHI3_NO_RSTRIP)
        (special if control else plain).append(added)
    tok.add_special_tokens(special)
    tok.add_tokens(plain)


def spm_from_gguf(field: Callable[..., Any]) -> Any:  # a tokenizers.Tokenizer
    """The tokenizer of a GGUF whose `tokenizer.ggml.model` is in `SPM_MODELS`, its fields read by
    `field(key, default)` (dataset/student.py's `_from_gguf` reader). llama.cpp's default for a missing
    `add_space_prefix` is true for SentencePiece; missing scores are 0 and missing types normal, as there."""
    tokens = field("tokenizer.ggml.tokens")
    return spm_tokenizer(
        tokens,
        field("tokenizer.ggml.scores") or [0.0] * len(tokens),
        field("tokenizer.ggml.token_type") or [1] * len(tokens),
        add_space_prefix=bool(field("tokenizer.ggml.add_space_prefix", True)),
        model=field("tokenizer.ggml.model"),
        merges=field("tokenizer.ggml.merges"),
        name=field("general.name", "") or "",
    )
