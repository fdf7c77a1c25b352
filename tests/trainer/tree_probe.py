"""Run inside the trainer venv (scripts/install_trainer.sh): the tree form (`sft.tree.jsonl`) against the path form on
a real model, on CPU, in float32, through both paths of `tree_loss.forward_loss`: sdpa (the CPU path: its dense
mask) and FlexAttention (the GPU path: its `BlockMask`; forward only, torch has no FlexAttention backward on CPU).

Usage: python tree_probe.py CONFIG_JSON OUT_JSON, CONFIG = {"model_dir", "gguf", "template", "tree": JSONL,
"paths": JSONL (the path form's records; each tree line's `metadata.paths[].id` names them), "layers": N (the
model's first N decoder layers, default 2), "flex": bool (default true)}. Per tree line, under sdpa: the weighted
loss of the line (one forward) and its gradients on the trained layers, and the path form's objective (each path a
forward of its own, its trained tokens by `token_labels`, the sum of their losses) and its gradients; the same line
under a plain causal mask (the mask must matter). Under FlexAttention: all the lines in one padded batch, its loss
(one compile of the kernel for the one shape). Then one step of TRL's SFTTrainer with `TreeCollator` and
`TreeLossMixin` (the recipe of docs/outputs.md) on the lines: its first logged loss.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from sftree.dataset.trainer_labels import token_labels  # PYTHONPATH=src: standard library only
from sftree.dataset.tree_collator import TreeCollator, collate  # torch only
from sftree.dataset.tree_loss import TreeLossMixin, forward_loss, tree_loss


def trained_params(model, layers: int) -> list:
    """The model cut to its first `layers` decoder layers (the equality holds for any depth; CPU time is what the
    whole model would cost), the last of them and the final norm trained: the gradients compared."""
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    for p in model.parameters():
        p.requires_grad_(False)
    params = [*model.model.layers[-1].parameters(), *model.model.norm.parameters()]
    for p in params:
        p.requires_grad_(True)
    return params


def path_objective(model, params, rows: list[dict]) -> tuple[float, list]:
    """The path form's objective: the sum over paths of their trained tokens' losses, and its gradients."""
    total, grads = 0.0, [torch.zeros_like(p) for p in params]
    for row in rows:
        ids = torch.tensor([row["input_ids"]])
        logits = model(input_ids=ids).logits[0]
        mask = torch.tensor(row["completion_mask"][1:], dtype=torch.float32)
        logp = torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
        loss = -(logp * mask).sum()
        for g, d in zip(grads, torch.autograd.grad(loss, params), strict=True):
            g += d
        total += loss.item()
    return total, grads


def tree_objective(model, params, line: dict, mask: bool = True) -> tuple[float, list]:
    """The line's weighted loss and its gradients: through `forward_loss` (the tree's mask), or under the model's
    plain causal mask."""
    batch = collate([line])
    if mask:
        loss, _ = forward_loss(model, batch)
    else:
        out = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], output_hidden_states=True
        )
        loss = tree_loss(out.hidden_states[-1], model.get_output_embeddings(), batch)
    return loss.item(), list(torch.autograd.grad(loss, params))


def flex_loss(model, lines: list[dict]) -> float:
    """The loss of all the lines in one padded batch under FlexAttention (forward only)."""
    model.set_attn_implementation("flex_attention")
    try:
        with torch.no_grad():
            loss, _ = forward_loss(model, collate(lines))
    finally:
        model.set_attn_implementation("sdpa")
    return loss.item()


def rel(a: list, b: list) -> float:
    num = sum(float((x - y).pow(2).sum()) for x, y in zip(a, b, strict=True)) ** 0.5
    return num / max(sum(float(y.pow(2).sum()) for y in b) ** 0.5, 1e-30)


class TreeSFTTrainer(TreeLossMixin, SFTTrainer):
    pass


def trl_step(model, tok, tree_file: str, accumulate: int = 1) -> float:
    """One step of SFTTrainer on the tree form's first `accumulate` lines, batch 1, accumulating the gradients of
    `accumulate` micro-batches (docs/outputs.md's recipe): the first logged loss."""
    ds = load_dataset("json", data_files=tree_file, split="train").select(range(accumulate))
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out,
            max_steps=1,
            per_device_train_batch_size=1,
            gradient_accumulation_steps=accumulate,
            learning_rate=1e-4,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            bf16=False,  # TRL's default on CPU autocasts to bfloat16, whose matmuls fall back to a slow loop without AMX
            gradient_checkpointing=False,  # TRL's default recomputes the whole model in every backward
            dataloader_num_workers=0,
            remove_unused_columns=False,  # the collator needs `parent` and `loss_weight`
            max_length=None,
            pad_token="<|endoftext|>",
            dataset_kwargs={"skip_prepare_dataset": True},  # already tokens
        )
        t = TreeSFTTrainer(
            model=model, args=args, train_dataset=ds, processing_class=tok, data_collator=TreeCollator()
        )
        t.train()
        return next(h["loss"] for h in t.state.log_history if "loss" in h)


def main(cfg_file: str, out_file: str) -> None:
    cfg = json.loads(open(cfg_file).read())
    t0 = time.time()

    def note(what: str) -> None:
        print(f"{time.time() - t0:7.1f}s {what}", file=sys.stderr, flush=True)

    torch.manual_seed(0)
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(cfg["model_dir"], gguf_file=cfg["gguf"])
    tok.chat_template = open(cfg["template"]).read()
    model = AutoModelForCausalLM.from_pretrained(
        cfg["model_dir"], gguf_file=cfg["gguf"], dtype=torch.float32, attn_implementation="sdpa"
    )
    model.eval()  # no dropout: the two forms' forwards must be the same function
    params = trained_params(model, cfg.get("layers", 2))
    note("model loaded")
    records = {}
    for line in open(cfg["paths"]):
        rec = json.loads(line)
        records[rec["metadata"]["id"]] = rec
    result = {"attn_implementation": model.config._attn_implementation, "lines": []}
    lines = [json.loads(x) for x in open(cfg["tree"])]
    for line in lines:
        rows = [token_labels(records[p["id"]], tok) for p in line["metadata"]["paths"]]
        loss_p, grads_p = path_objective(model, params, rows)
        loss_t, grads_t = tree_objective(model, params, line)
        loss_causal, _ = tree_objective(model, params, line, mask=False)
        result["lines"].append(
            {
                "part": line["metadata"]["part"],
                "path_input_ids": [r["input_ids"] for r in rows],
                "path_loss": loss_p,
                "tree_loss": loss_t,
                "causal_loss": loss_causal,
                "grad_rel_diff": rel(grads_t, grads_p),
                "grad_norm": sum(float(g.pow(2).sum()) for g in grads_p) ** 0.5,
                "weight": sum(line["loss_weight"]),
            }
        )
        grad = result["lines"][-1]["grad_rel_diff"]
        note(f"part {line['metadata']['part']}: path {loss_p:.6f} tree {loss_t:.6f} gradients {grad:.1e}")
    if cfg.get("flex", True):
        result["flex_loss"] = flex_loss(model, lines)
        note(f"FlexAttention, {len(lines)} lines in one batch: {result['flex_loss']:.6f}")
    if cfg.get("trl", True):
        result["trl_first_loss"] = trl_step(model, tok, cfg["tree"])
        note("TRL step")
    with open(out_file, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(*sys.argv[1:3])
