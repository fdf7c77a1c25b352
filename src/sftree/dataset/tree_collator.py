"""Batches of sftree's tree form (`sft.tree.jsonl`, docs/outputs.md "The tree form") for a Hugging Face causal LM.
torch only: import it where the trainer runs, or copy it with its two neighbours (`tree_attention.py`, which
builds the mask where the model runs, and `tree_loss.py`, the loss and `TreeLossMixin`).

`collate(lines)` turns lines (JSON objects, as a `datasets` row or `sftree.records.tree_packed.TreeLine.to_dict()`
gives them; `records.tree_packed.iter_tree_lines` reads a file checking every line) into per-token vectors, each
`(batch, L)`, padded to the longest line:
- `input_ids`, `position_ids` (each token's position in its own path);
- `tree_parent`: the index of the token's parent in its line (-1: a branch's first token, and padding);
- `tree_weight`: the token's loss weight (0: context only, and padding);
- `tree_end`: the end of the token's subtree (exclusive). A line is depth-first, so a token's subtree is the
  interval `[k, tree_end[k])` and its ancestors are the tokens whose intervals hold it: key k is visible to query q
  iff `k <= q < tree_end[k]` (the DFS intervals). A padding token's interval is itself alone.

No mask: it is `L x L` and the attention implementations each take another form of it, so `tree_attention` builds
it from `tree_end` where the model runs (a FlexAttention `BlockMask` that never holds a dense mask, or a dense
mask for sdpa and eager). The batch is O(L): five `(batch, L)` vectors.
"""

from __future__ import annotations

from typing import Any

import torch

LINE_FIELDS = ("input_ids", "position_ids", "parent", "loss_weight")  # one entry per token (the file's)
TREE_FIELDS = ("tree_parent", "tree_weight", "tree_end")  # what the model's forward does not take


def subtree_end(parent: list[int]) -> list[int]:
    """Each token's subtree end (exclusive) in a depth-first line: one pass from the last token, each token's end
    and size handed to its parent. ValueError naming the token when a parent is not an earlier token or -1, or when
    a subtree is not one interval (the line is not depth-first: its intervals would not be its ancestors)."""
    n = len(parent)
    end, size = list(range(1, n + 1)), [1] * n
    for i in range(n - 1, -1, -1):
        p = parent[i]
        if not -1 <= p < i:
            raise ValueError(f"token {i}: parent {p!r} is not an earlier token or -1")
        if p >= 0:
            size[p] += size[i]
            end[p] = max(end[p], end[i])
    # every descendant lies in [k, end): the interval is the subtree iff it holds no other token
    for k in range(n):
        if end[k] - k != size[k]:
            raise ValueError(f"token {k}: its subtree is not one interval (the line is not depth-first)")
    return end


def collate(lines: list[dict[str, Any]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """A batch of tree-form lines (see the module); ValueError naming the line when its lists differ in length or
    it is not depth-first."""
    size = max(len(x["input_ids"]) for x in lines)

    def padded(values: list[list[int]], fill: int | None, kind: torch.dtype) -> torch.Tensor:
        # fill None: the padding's own index + 1 (a padding token's interval is itself)
        rows = [
            v + (list(range(len(v) + 1, size + 1)) if fill is None else [fill] * (size - len(v)))
            for v in values
        ]
        return torch.tensor(rows, dtype=kind)

    ends = []
    for n, x in enumerate(lines):
        try:
            if len({len(x[k]) for k in LINE_FIELDS}) != 1:
                raise ValueError(f"{', '.join(LINE_FIELDS)} of different lengths")
            ends.append(subtree_end(list(x["parent"])))
        except ValueError as exc:
            raise ValueError(f"tree-form batch, line {n}: {exc}") from None
    return {
        "input_ids": padded([list(x["input_ids"]) for x in lines], pad_id, torch.long),
        "position_ids": padded([list(x["position_ids"]) for x in lines], 0, torch.long),
        "tree_parent": padded([list(x["parent"]) for x in lines], -1, torch.long),
        "tree_weight": padded([list(x["loss_weight"]) for x in lines], 0, torch.float32),
        "tree_end": padded(ends, None, torch.long),
    }


class TreeCollator:
    """`collate` as a trainer's `data_collator` (features: dataset rows with the tree form's fields)."""

    def __init__(self, pad_id: int = 0):
        self.pad_id = pad_id

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return collate(features, self.pad_id)
