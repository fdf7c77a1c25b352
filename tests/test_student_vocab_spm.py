"""A SentencePiece-style Student GGUF (`tokenizer.ggml.model` llama or gemma4) read into a `tokenizers.Tokenizer`
gives llama.cpp's ids (dataset/vocab_spm.py): every test line llama.cpp ships for Llama 2's, Phi-3's and Gemma 4's
vocabularies (models/ggml-vocab-*.gguf with .inp texts and the .out ids of tests/test-tokenizer-0.cpp, which
tokenizes with add_special=false, parse_special=false), and texts whose ids llama.cpp gave (a program linked to
the sdist's libllama: llama_tokenize) with special tokens parsed and not, where the test lines hold none."""

from __future__ import annotations

import heapq
import random
from typing import Any

import pytest
from helpers.templates import gguf_vocab, llama_models

from sftree.dataset.vocab_spm import gguf_merges, spm_tokenizer

MODELS = llama_models()
NEEDS_SDIST = pytest.mark.skipif(
    MODELS is None, reason="llama.cpp sdist absent: run scripts/install_llm_server.sh (models/ggml-vocab-*)"
)
# Gemma 4's 262k tokens take 17 s or more to read from its GGUF: slow; Llama 2's and Phi-3's 2 s each
VOCABS = [
    pytest.param("llama-spm", marks=[NEEDS_SDIST, pytest.mark.slow]),
    pytest.param("phi-3", marks=[NEEDS_SDIST, pytest.mark.slow]),
    pytest.param("gemma-4", marks=[NEEDS_SDIST, pytest.mark.slow]),
]


@pytest.fixture(scope="module", params=VOCABS)  # module scope: pytest runs each vocabulary's tests together
def vocab(request: pytest.FixtureRequest) -> tuple[str, Any]:
    """A vocabulary's name and its tokenizer, as the Student loads a GGUF (every test line of each is checked
    through the same loader by tests/test_student_vocab.py)."""
    pytest.importorskip("gguf", reason="gguf not installed (pyproject.toml pins it)")
    assert MODELS is not None
    return request.param, gguf_vocab(MODELS / f"ggml-vocab-{request.param}.gguf")


# text: (ids with parse_special=false, ids with parse_special=true), as llama.cpp's llama_tokenize gave them
KNOWN: dict[str, dict[str, tuple[list[int], list[int]]]] = {
    "llama-spm": {
        # a run of equal-score spaces grows from the left: 16 + 16 + 7 (+ the prefix space)
        "a" + " " * 40 + "b": ([263, 462, 462, 4706, 289], [263, 462, 462, 4706, 289]),
        "<s>hi</s> <unk>!": (
            [529, 29879, 29958, 2918, 829, 29879, 29958, 529, 2960, 29958, 29991],
            [1, 7251, 2, 259, 0, 1738],  # the space prefix again after each matched token
        ),
        "<0x0A>\n": (
            [529, 29900, 29916, 29900, 29909, 29958, 13],
            [529, 29900, 29916, 29900, 29909, 29958, 13],
        ),
    },
    "phi-3": {
        # </s> is user-defined in the GGUF but control to llama.cpp (an end-of-generation text)
        "зиден</s>\t": ([754, 29917, 4466, 829, 29879, 29958, 12], [754, 29917, 4466, 2]),
        # Phi-3's special tokens swallow the whitespace after them, <s> and <|endoftext|> do not
        "<|user|>\n  hi<|end|>\n<|assistant|>": (
            [529, 29989, 1792, 29989, 29958, 13, 29871, 7251, 29966, 29989, 355, 29989, 29958, 13]
            + [29966, 29989, 465, 22137, 29989, 29958],
            [32010, 7251, 32007, 32001],
        ),
        "<s> x<|endoftext|>  y": (
            [529, 29879, 29958, 921, 29966, 29989, 355, 974, 726, 29989, 29958, 29871, 343],
            [1, 29871, 921, 32000, 259, 343],
        ),
    },
    "gemma-4": {
        # a text that is a token is merged all the same (no ignore_merges)
        "<unused0> [multimodal]": ([236820, 63634, 236771, 236813, 870, 8606, 98624, 236842],) * 2,
        "\n" * 40 + "x": ([137, 115, 236781], [137, 115, 236781]),
        "<|turn>user\nhi<turn|>\n": (
            [236820, 236909, 887, 236813, 2364, 107, 2202, 236820, 887, 111038, 107],
            [105, 2364, 107, 2202, 106, 107],
        ),
        # user-defined tokens are matched with special tokens parsed or not
        "<|tool_call>call:f{}<tool_call|>  ok": ([48, 6639, 236787, 236760, 16454, 49, 138, 680],) * 2,
        "  a  b\n\n  ": ([138, 236746, 138, 236763, 108, 138], [138, 236746, 138, 236763, 108, 138]),
    },
}


def test_special_tokens_parsed_or_not_give_llama_cpps_ids(vocab: tuple[str, Any]):
    name, tok = vocab
    for text, (plain, parsed) in KNOWN[name].items():
        assert tok.encode(text, add_special_tokens=False).ids == parsed, text
        tok.encode_special_tokens = True  # parse_special=false: control tokens are text
        try:
            assert tok.encode(text, add_special_tokens=False).ids == plain, text
        finally:
            tok.encode_special_tokens = False


def _llama_cpp_spm(text: str, vocab: dict[str, int], scores: list[float]) -> list[int]:
    """llama.cpp's llm_tokenizer_spm_session, as written there: merge the adjacent pair forming the token of
    highest score (leftmost on a tie) until none does; a symbol no token covers becomes `<0xXX>` tokens."""
    syms = list(text)
    nxt = list(range(1, len(syms))) + [-1]
    prv = list(range(-1, len(syms) - 1))
    queue: list[tuple[float, int, int, int]] = []

    def push(left: int, right: int) -> None:
        if left >= 0 and right >= 0 and (t := syms[left] + syms[right]) in vocab:
            heapq.heappush(queue, (-scores[vocab[t]], left, right, len(t)))

    for i in range(1, len(syms)):
        push(i - 1, i)
    while queue:
        _, left, right, size = heapq.heappop(queue)
        if not syms[left] or not syms[right] or len(syms[left]) + len(syms[right]) != size:
            continue
        syms[left], syms[right] = syms[left] + syms[right], ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        push(prv[left], left)
        push(left, nxt[left])
    out: list[int] = []
    for s in filter(None, syms):
        out += [vocab[s]] if s in vocab else [vocab[f"<0x{b:02X}>"] for b in s.encode("utf-8")]
    return out


def test_a_small_vocabulary_with_equal_scores_tokenizes_as_llama_cpps_algorithm():
    """Without the sdist: runs of U+2581 of equal score (Llama 2's) and pieces of one letter repeated, on random
    texts, against llama.cpp's algorithm written out above."""
    spaces = ["▁" * n for n in range(2, 7)]
    pieces = ["a", "b", "ab", "ba", "aa", "aaa", "bab", "▁", "▁a", "▁ab", "▁b", *spaces]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    scores[-len(spaces) :] = [-1e9] * len(spaces)  # the runs of spaces: all one score, as in Llama 2
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    tok = spm_tokenizer(tokens, scores, types, add_space_prefix=True, model="llama")
    vocab = {t: i for i, t in enumerate(tokens)}
    rnd = random.Random(0)
    for _ in range(2000):
        text = "".join(rnd.choice(["a", "b", " ", "  ", "é", "c"]) for _ in range(rnd.randint(1, 20)))
        want = _llama_cpp_spm("▁" + text.replace(" ", "▁"), vocab, scores)
        assert tok.encode(text, add_special_tokens=False).ids == want, text
    assert tok.decode(tok.encode(" ab  é").ids) == " ab  é"


def test_gguf_merges_split_at_the_first_space_after_the_first_character():
    assert gguf_merges(["a b", "  a", "▁▁ ▁", "bad"]) == [("a", "b"), (" ", "a"), ("▁▁", "▁")]


def test_other_models_are_refused():
    with pytest.raises(ValueError, match="gpt2"):
        spm_tokenizer(["a"], [0.0], [1], add_space_prefix=False, model="gpt2")
