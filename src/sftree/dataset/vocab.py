"""A GGUF Student's byte-level BPE vocabulary as llama.cpp tokenizes it: the pre-tokenizer its `tokenizer.ggml.pre`
names, as llama.cpp's src/llama-vocab.cpp defines it (`llm_tokenizer_bpe`: a sequence of regexes, each splitting
the pieces the one before left, the text between matches kept as pieces), and whether whole words found in the
vocabulary skip the merges (`ignore_merges`, Llama 3's rule). Checked against llama.cpp's own test data
(models/ggml-vocab-*.gguf.inp/.out: tests/test_student_vocab.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's letter ranges, written as escapes (the characters themselves would not survive Unicode normalisation)
_DEEPSEEK_LLM = (
    "[\r\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102"
    "\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    "\\p{N}+",
)
_DEEPSEEK3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)
_DEEPSEEK_CODER = (
    "[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}",
)
_FALCON = (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")
_STARCODER = (r"\p{N}", _GPT2)
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreTokenizer:
    """llama.cpp's pre-tokenization of one `tokenizer.ggml.pre`: its regexes in order, Llama 3's `ignore_merges`."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False


# tokenizer.ggml.pre -> llama.cpp's pre-tokenizer (llama_vocab::impl::load, llm_tokenizer_bpe). `gpt2` is the name
# this project read before (GPT-2's own regex, as `gpt-2`).
GGUF_PRE: dict[str, PreTokenizer] = {
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
        PreTokenizer((_LLAMA3,), ignore_merges=True),
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), PreTokenizer((_LLAMA3,))),
    "deepseek-llm": PreTokenizer(_DEEPSEEK_LLM),
    "deepseek-coder": PreTokenizer(_DEEPSEEK_CODER),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense", "joyai-llm"), PreTokenizer(_DEEPSEEK3)),
    "falcon": PreTokenizer(_FALCON),
    **dict.fromkeys(
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"),
        PreTokenizer(_STARCODER),
    ),
    **dict.fromkeys(
        ("gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "gigachat", "mellum"),
        PreTokenizer((_GPT2,)),
    ),
    **dict.fromkeys(
        ("qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "solar-open"), PreTokenizer((_QWEN2,))
    ),
    "qwen35": PreTokenizer((_QWEN35,)),
    "default": PreTokenizer(_DEFAULT),
}


def pre_tokenizer(pre: PreTokenizer) -> Any:  # a tokenizers.pre_tokenizers.PreTokenizer
    """The `tokenizers` pre-tokenizer doing what llama.cpp's does: each regex splits (matches and the text between
    them kept), then the byte-level mapping without GPT-2's own regex."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )


def read_tests(inp: str, out: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenizer test pairs (tests/test-tokenizer-0.cpp): the texts of `.inp`, separated by a line
    `__ggml_vocab_test__`, and the ids of `.out`, one line per text."""
    texts = inp.split("\n__ggml_vocab_test__\n")
    if texts and texts[-1] == "":
        texts = texts[:-1]
    lines = out.split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    if len(texts) != len(lines):
        raise ValueError(f"{len(texts)} texts, {len(lines)} id lines")
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]
