"""Run with the trainer venv's python (PYTHONPATH=src): `python distill_batch_probe.py CFG OUT` (CFG: {"records":
the jsonl, "vocab": its vocabulary size}).
The same-tokenizer export's records, loaded by `datasets` (the consumer's own reader), batched by
`sftree.dataset.distill_collator.distill_batch` and fed to a small randomly initialised Llama (transformers) and
`sftree.dataset.distill_loss`; prints as JSON: the loss at alpha 0 and transformers' own loss with labels -100 off
the trained tokens (equal when the batch marks exactly the trained tokens), the loss at alpha 1 and 0.5, the
gradient norm, and whether each trained token's Teacher top-K in the batch is the record's (to OUT)."""

from __future__ import annotations

import json
import sys

import torch
from datasets import load_dataset
from transformers import LlamaConfig, LlamaForCausalLM

from sftree.dataset.distill_collator import distill_batch
from sftree.dataset.distill_loss import distill_loss

cfg = json.loads(open(sys.argv[1]).read())
path, vocab = cfg["records"], int(cfg["vocab"])
columns = ["input_ids", "completion_mask", "teacher_logprobs", "teacher_top_ids", "teacher_top_logprobs"]
ds = load_dataset("json", data_files=path, split="train").select_columns(columns)
rows = [ds[i] for i in range(min(len(ds), 4))]
batch = distill_batch(rows)
torch.manual_seed(0)
model = LlamaForCausalLM(
    LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    )
)
logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
args = (logits, batch["target"], batch["top_ids"], batch["top_logprobs"], batch["weight"])
labels = batch["input_ids"].clone()
for i, r in enumerate(rows):
    m = torch.zeros(labels.shape[1], dtype=torch.bool)
    m[: len(r["completion_mask"])] = torch.tensor(r["completion_mask"], dtype=torch.bool)
    labels[i, ~m] = -100
out = {
    "rows": len(rows),
    "trained": int(batch["weight"].sum()),
    "alpha0": distill_loss(*args, alpha=0.0).item(),
    "transformers": model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels
    ).loss.item(),
    "alpha1": distill_loss(*args, alpha=1.0).item(),
}
loss = distill_loss(*args)
loss.backward()
out["alpha05"] = loss.item()
out["grad_norm"] = float(sum(p.grad.norm() ** 2 for p in model.parameters() if p.grad is not None) ** 0.5)
same = True
for i, r in enumerate(rows):
    trained = [t for t, m in enumerate(r["completion_mask"]) if m]
    for t, lp, alts in zip(trained, r["teacher_logprobs"], r["teacher_top_ids"], strict=True):
        if t and lp is not None and alts:
            same &= batch["top_ids"][i, t - 1, : len(alts)].tolist() == alts
out["top_ids_are_the_records"] = same
with open(sys.argv[2], "w") as f:
    json.dump(out, f)
