"""Shared by the probes: a byte-level tokenizer built in memory (no model download) with our chat template."""

from __future__ import annotations

from pathlib import Path

TEMPLATE = (Path(__file__).parent / "chat_template.jinja").read_text()
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]


def byte_tokenizer():
    """Every byte one token plus the special tokens: decoding any token span gives back its exact text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    fast.chat_template = TEMPLATE
    return fast
