"""A small real Student for tests that need no downloaded model: a byte-level BPE trained here with the `tokenizers`
library (the Student's own library), the ChatML control tokens as special tokens and Qwen2.5's tool tags as added
tokens (as Qwen2.5's tokenizer.json has them), and Qwen2.5's chat template (tests/data/qwen2.5.jinja, from
llama.cpp's models/templates), saved as an HF model folder that `load_student` reads."""

from __future__ import annotations

import json
from pathlib import Path

TEMPLATE = Path(__file__).parents[1] / "data" / "qwen2.5.jinja"
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
CORPUS = [
    "system user assistant tool You are a helpful assistant. Tools function name arguments command filePath",
    'read bash coral eval -m "try" .opencode/notes/a.md step out call think first {"name": "bash"}',
    "def f(x):\n    return x ** 2  # the quick brown fox jumps over the lazy dog 0123456789",
]


def make_student(folder: Path) -> Path:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in ADDED])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"chat_template": TEMPLATE.read_text(), "eos_token": "<|im_end|>", "bos_token": None}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder
