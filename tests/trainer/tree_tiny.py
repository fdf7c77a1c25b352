"""Run inside the trainer venv: the tree form through a small Llama made here (random weights, no download), batch of
two lines with padding: `tree_loss` equals the path form's objective computed one path at a time, and TRL's
SFTTrainer with `TreeCollator` and `TreeLossMixin` (docs/outputs.md's recipe) logs the batch's loss over its weight.

Usage: python tree_tiny.py OUT_JSON (PYTHONPATH=src and tests/trainer)."""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from tree_probe import trl_step

from sftree.dataset.tree_collator import collate, tree_loss
from sftree.dataset.tree_packed import PathTokens, pack_paths

PATHS = [  # two sharing a prefix, one a prefix of the first, one alone
    ([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1]),
    ([1, 2, 3, 4, 7, 8, 9], [0, 0, 1, 1, 0, 1, 1]),
    ([1, 2, 3, 4], [0, 0, 1, 1]),
    ([10, 11, 12], [0, 1, 1]),
]


def main(out_file: str) -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(cfg).float().eval()
    paths = [
        PathTokens(tuple(i), tuple(bool(x) for x in t), {"id": str(n)}) for n, (i, t) in enumerate(PATHS)
    ]
    parts, _ = pack_paths(paths, 9, "t")  # two parts: the shared trie (9 tokens) and the lone path
    lines = [x.to_dict() for x in parts]  # as a dataset's rows
    want = 0.0
    for ids, trained in PATHS:
        x = torch.tensor([ids])
        logp = torch.log_softmax(model(input_ids=x).logits[0, :-1], -1).gather(-1, x[0, 1:, None])[:, 0]
        want -= float((logp * torch.tensor(trained[1:], dtype=torch.float32)).sum())
    batch = collate(lines)  # padded to the longer line
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
    ).logits
    got = float(tree_loss(logits, batch))
    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "sft.tree.jsonl")
        with open(f, "w") as fh:
            fh.write("".join(json.dumps(x) + "\n" for x in lines))
        vocab = Tokenizer(models.WordLevel({f"t{i}": i for i in range(64)}, unk_token="t0"))
        tok = PreTrainedTokenizerFast(tokenizer_object=vocab, eos_token="t1", pad_token="t0")
        first = lines[0]
        b0 = collate([first])
        logits0 = model(
            input_ids=b0["input_ids"], attention_mask=b0["attention_mask"], position_ids=b0["position_ids"]
        ).logits
        mean0 = float(tree_loss(logits0, b0)) / sum(first["loss_weight"])
        trl = trl_step(model, tok, f)
    result = {"parts": len(lines), "path_objective": want, "tree_loss": got, "first_mean": mean0, "trl": trl}
    with open(out_file, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1])
