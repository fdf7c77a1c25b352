"""Run inside the trainer venv: the tree form through a small Llama made here (random weights, no download), a batch
of two lines with padding: `forward_loss` equals the path form's objective computed one path at a time, under
eager attention and sdpa (their dense mask); TRL's SFTTrainer with `TreeCollator` and `TreeLossMixin`
(docs/outputs.md's recipe), accumulating the gradients of the two lines as two micro-batches, logs the path form's
token mean over both (their summed losses over their summed weights, `num_items_in_batch`); a model whose forward
makes its logits otherwise than its output embeddings is refused.

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

from sftree.dataset.tree_collator import collate
from sftree.dataset.tree_loss import forward_loss
from sftree.dataset.tree_packed import PathTokens, pack_paths

PATHS = [  # two sharing a prefix, one a prefix of the first, one alone
    ([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1]),
    ([1, 2, 3, 4, 7, 8, 9], [0, 0, 1, 1, 0, 1, 1]),
    ([1, 2, 3, 4], [0, 0, 1, 1]),
    ([10, 11, 12], [0, 1, 1]),
]


def loss_of(model, lines: list[dict]) -> float:
    with torch.no_grad():
        return float(forward_loss(model, collate(lines))[0])


def refusal(model, lines: list[dict]) -> str:
    """A Llama told it caps its logits (it does not): the loss made from its hidden states would differ."""
    model.config.final_logit_softcapping = 1e-3  # far below its logits: capped, they differ
    try:
        loss_of(model, lines)
    except ValueError as exc:
        return str(exc)
    finally:
        model.config.final_logit_softcapping = None
    return ""


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
    with torch.no_grad():
        for ids, trained in PATHS:
            x = torch.tensor([ids])
            logp = torch.log_softmax(model(input_ids=x).logits[0, :-1], -1).gather(-1, x[0, 1:, None])[:, 0]
            want -= float((logp * torch.tensor(trained[1:], dtype=torch.float32)).sum())
    result: dict = {"parts": len(lines), "path_objective": want, "tree_loss": {}}
    for attn in ("eager", "sdpa"):
        model.set_attn_implementation(attn)
        result["tree_loss"][attn] = loss_of(model, lines)  # padded to the longer line
    each = [loss_of(model, [x]) for x in lines]
    weights = [sum(x["loss_weight"]) for x in lines]
    result["token_mean"] = sum(each) / sum(weights)  # the path form's, over both parts
    result["mean_of_means"] = sum(e / w for e, w in zip(each, weights, strict=True)) / len(lines)
    result["refusal"] = refusal(model, lines)
    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "sft.tree.jsonl")
        with open(f, "w") as fh:
            fh.write("".join(json.dumps(x) + "\n" for x in lines))
        vocab = Tokenizer(models.WordLevel({f"t{i}": i for i in range(64)}, unk_token="t0"))
        tok = PreTrainedTokenizerFast(tokenizer_object=vocab, eos_token="t1", pad_token="t0")
        result["trl_accumulated"] = trl_step(model, tok, f, accumulate=2)
    with open(out_file, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1])
