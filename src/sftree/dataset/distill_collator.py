"""Batches for the distillation loss (dataset/distill_loss.py) from the same-tokenizer export's rows
(`export.teacher_tokens`: `input_ids`, `completion_mask`, `teacher_logprobs`, `teacher_top_ids`,
`teacher_top_logprobs`, the three Teacher columns one entry per trained token; docs/outputs.md). torch only, as
`tree_collator`: import it where the trainer runs, or copy this file.

`distill_batch(rows, pad_id)` gives, right-padded to the longest row:
- `input_ids (B, L)`, `attention_mask (B, L)`: what the model reads;
- for the L - 1 positions that predict a next token (use `logits[:, :-1]`): `target (B, L-1)` the next id,
  `weight (B, L-1)` 1 where that id is trained, `top_ids (B, L-1, K)` and `top_logprobs (B, L-1, K)` the Teacher's
  top-K there, K the widest row's (a shorter list padded with id 0 and logprob -inf, which adds nothing; an
  untrained position holds a one-hot on id 0, weighted 0).

A trained token without a Teacher column (the template's own turn end, a render kept: its logprob is null) has
the Teacher's distribution taken as all on the trained id (`top_ids = [id]`, logprob 0): its KL term is then its
NLL, so every trained token is trained by the same mix and none is left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def distill_batch(rows: Sequence[Mapping[str, Any]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """The batch of the module docstring; ValueError naming the row when its Teacher columns do not fit its
    trained tokens."""
    n = max(len(r["input_ids"]) for r in rows)
    k = max([1] + [len(top) for r in rows for top in r["teacher_top_ids"]])
    b = len(rows)
    ids = torch.full((b, n), pad_id, dtype=torch.long)
    attention = torch.zeros((b, n), dtype=torch.long)
    weight = torch.zeros((b, n - 1))
    top_ids = torch.zeros((b, n - 1, k), dtype=torch.long)
    top_lps = torch.full((b, n - 1, k), float("-inf"))
    top_lps[..., 0] = 0.0  # an untrained position: a one-hot on id 0 (weight 0; all -inf would make nan)
    for i, r in enumerate(rows):
        seq, mask = list(r["input_ids"]), list(r["completion_mask"])
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[i, : len(seq)] = 1
        trained = [t for t, m in enumerate(mask) if m]
        columns = (r["teacher_logprobs"], r["teacher_top_ids"], r["teacher_top_logprobs"])
        if any(len(c) != len(trained) for c in columns):
            raise ValueError(
                f"row {i}: the Teacher columns do not have one entry per trained token ({len(trained)})"
            )
        for t, lp, alts, alt_lps in zip(trained, *columns, strict=True):
            if t == 0:
                continue  # the first token is never predicted
            weight[i, t - 1] = 1.0
            if lp is None or not alts:
                top_ids[i, t - 1, 0], top_lps[i, t - 1, 0] = seq[t], 0.0
                continue
            top_lps[i, t - 1, 0] = float("-inf")
            top_ids[i, t - 1, : len(alts)] = torch.tensor(alts, dtype=torch.long)
            top_lps[i, t - 1, : len(alts)] = torch.tensor(alt_lps, dtype=torch.float)
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "target": ids[:, 1:].clone(),
        "weight": weight,
        "top_ids": top_ids,
        "top_logprobs": top_lps,
    }
