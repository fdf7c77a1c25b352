"""A Student given as a GGUF tokenizes as llama.cpp does: every chat-model vocabulary llama.cpp ships with its own
test data (models/ggml-vocab-*.gguf with .inp texts and the .out ids its tokenizer must give; the BERT embedding
one aside) gives llama.cpp's ids for every test line, read through the Student's own loader (`gguf_tokenizer`):
byte-level BPE by dataset/vocab.py (the pre-tokenizer per `tokenizer.ggml.pre` as src/llama-vocab.cpp defines
it), SentencePiece (Llama 2, Mistral, Phi-3) and Gemma 4 by dataset/vocab_spm.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.templates import gguf_vocab, llama_models

from sftree.dataset.vocab import read_tests

pytest.importorskip("gguf", reason="gguf not installed (pyproject.toml pins it)")
MODELS = llama_models()
pytestmark = pytest.mark.skipif(
    MODELS is None, reason="llama.cpp sdist absent: run scripts/install_llm_server.sh (models/ggml-vocab-*)"
)
VOCABS = (
    sorted(
        p
        for p in MODELS.glob("ggml-vocab-*.gguf")
        if Path(f"{p}.inp").is_file() and Path(f"{p}.out").is_file() and "bert" not in p.name
    )
    if MODELS
    else []
)


def test_the_folder_holds_the_vocabularies_with_test_data():
    assert len(VOCABS) >= 14, [p.name for p in VOCABS]


@pytest.mark.parametrize(
    "vocab", VOCABS, ids=lambda p: p.name.removeprefix("ggml-vocab-").removesuffix(".gguf")
)
def test_every_vocabulary_gives_llama_cpps_ids_for_every_test_line(vocab: Path):
    pairs = read_tests(Path(f"{vocab}.inp").read_bytes().decode("utf-8"), Path(f"{vocab}.out").read_text())
    tok = gguf_vocab(vocab)
    wrong = [(text, ids) for text, ids in pairs if tok.encode(text, add_special_tokens=False).ids != ids]
    assert not wrong, f"{len(wrong)} of {len(pairs)} lines differ, first {wrong[0][0]!r}"
