"""Train a Hugging Face causal LM on sftree's tree form (`sft.tree.jsonl`, docs/outputs.md "The tree form"). torch
only: import it where the trainer runs, or copy this file.

`collate(lines)` turns lines (JSON objects, as a `datasets` row or `sftree.records.tree_packed.TreeLine.to_dict()`
gives them; `records.tree_packed.iter_tree_lines` reads a file checking every line) into a batch the model takes:
- `input_ids`, `position_ids` (each token's position in its own path), padded;
- `attention_mask`: a 4D additive mask `(batch, 1, L, L)`, 0 where token i may attend to token j (j is i or one
  of its ancestors, by `parent`), the dtype's minimum elsewhere; transformers uses a 4D mask as given, with
  `attn_implementation="eager"` or `"sdpa"` (not flash attention, which takes no mask);
- `tree_parent`, `tree_weight`: what `tree_loss` needs (-1 and 0 on padding).

`tree_loss(logits, batch)` is `sum_i w_i * -log softmax(logits[parent_i])[id_i]`: each token predicted from its
parent's logits (a branch point's logits predict each of its children). Its sum over the lines is the path form's
objective (the sum over paths of their trained tokens' losses); `/ batch["tree_weight"].sum()` makes it the
token-mean loss of a batch of those paths.

With TRL's SFTTrainer: `TreeCollator` as `data_collator`, `remove_unused_columns=False` (the trainer would drop
`parent` and `loss_weight`, which the model's forward does not name), and `TreeLossMixin` before the trainer class
(its `compute_loss` takes the batch's tree fields out before the model runs and returns `tree_loss`):
`class TreeSFTTrainer(TreeLossMixin, SFTTrainer): pass` (a runnable recipe: docs/outputs.md).
"""

from __future__ import annotations

from typing import Any

import torch

TREE_FIELDS = ("tree_parent", "tree_weight")


def ancestor_mask(parent: list[int], size: int | None = None) -> torch.Tensor:
    """(size, size) bool: row i is True at i and at each of its ancestors (`parent` before child, -1: none)."""
    n = len(parent)
    size = size or n
    allowed = torch.zeros(size, size, dtype=torch.bool)
    for i, p in enumerate(parent):
        if p >= 0:
            allowed[i, :i] = allowed[p, :i]  # a parent comes first: its row is done
        allowed[i, i] = True
    for i in range(n, size):  # padding attends to itself only (no row without a key: no NaN)
        allowed[i, i] = True
    return allowed


def collate(lines: list[dict], pad_id: int = 0, dtype: torch.dtype = torch.float32) -> dict:
    """A batch of tree-form lines (see the module)."""
    size = max(len(x["input_ids"]) for x in lines)

    def padded(key: str, fill: int, kind: torch.dtype) -> torch.Tensor:
        return torch.tensor([list(x[key]) + [fill] * (size - len(x[key])) for x in lines], dtype=kind)

    allowed = torch.stack([ancestor_mask(list(x["parent"]), size) for x in lines])
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return {
        "input_ids": padded("input_ids", pad_id, torch.long),
        "position_ids": padded("position_ids", 0, torch.long),
        "attention_mask": mask[:, None],
        "tree_parent": padded("parent", -1, torch.long),
        "tree_weight": padded("loss_weight", 0, torch.float32),
    }


class TreeCollator:
    """`collate` as a trainer's `data_collator` (features: dataset rows with the tree form's fields)."""

    def __init__(self, pad_id: int = 0, dtype: torch.dtype = torch.float32):
        self.pad_id, self.dtype = pad_id, dtype

    def __call__(self, features: list[dict]) -> dict:
        return collate(features, self.pad_id, self.dtype)


def tree_loss(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """The weighted sum of each token's loss, predicted from its parent's logits (see the module)."""
    parent, weight, ids = batch["tree_parent"], batch["tree_weight"], batch["input_ids"]
    weight = weight.to(logits.device) * (parent >= 0)
    rows = torch.arange(ids.shape[0], device=logits.device)[:, None]
    src = parent.clamp(min=0).to(logits.device)
    # token i's id read in the log-probabilities at its parent's row: a branch point's row predicts each child
    logp = torch.log_softmax(logits.float(), dim=-1)[rows, src, ids.to(logits.device)]
    return -(logp * weight).sum()


class TreeLossMixin:
    """Before a transformers Trainer class (e.g. TRL's SFTTrainer): the loss of a batch is `tree_loss` divided by
    the batch's weight (the token mean over the paths it holds)."""

    def compute_loss(self, model: Any, inputs: dict, return_outputs: bool = False, num_items_in_batch=None):
        tree = {k: inputs.pop(k) for k in TREE_FIELDS}
        outputs = model(**inputs)
        loss = tree_loss(outputs.logits, {**tree, "input_ids": inputs["input_ids"]})
        loss = loss / tree["tree_weight"].sum().clamp(min=1)
        return (loss, outputs) if return_outputs else loss
