"""Run inside the trainer venv: the tree form's masks against the ancestor mask, on random depth-first trees.

Usage: python tree_mask_probe.py OUT_JSON [TREES] (PYTHONPATH=src). Each case is a batch of one to three random
lines (several roots, branches at random depths, lengths 1 to 300: padding and blocks cut at L) and a random
block size; the reference is the ancestor mask built from `parent` alone, row by row (a token sees itself and
what its parent sees; padding sees itself). Checked per case: `collate` gives `(B, L)` vectors only;
`dense_mask` is the reference; the `BlockMask` is the reference block for block (a block all visible is full, one
partly visible partial, one not visible absent) and element for element (a full block all visible, a partial one
where its `mask_mod` says, no other). And `collate` refuses a line that is not depth-first, naming line and token,
and one whose lists differ in length.
"""

from __future__ import annotations

import json
import random
import sys

import torch

from sftree.dataset.tree_attention import block_mask, dense_mask
from sftree.dataset.tree_collator import collate


def random_line(rng: random.Random, n: int) -> dict:
    """A depth-first line of n tokens: each token a child of the previous one or of one of its ancestors, or a
    new root."""
    parent: list[int] = []
    branch: list[int] = []  # the previous token and its ancestors
    for i in range(n):
        r = rng.random()
        if not branch or r < 0.02:
            branch = []
        elif r < 0.15:
            branch = branch[: rng.randrange(len(branch)) + 1]  # back up to an ancestor: a branch point
        parent.append(branch[-1] if branch else -1)
        branch.append(i)
    positions: list[int] = []
    for p in parent:
        positions.append(0 if p < 0 else positions[p] + 1)
    weight = [int(p >= 0 and rng.random() < 0.3) * rng.randint(1, 3) for p in parent]
    return {"input_ids": [rng.randrange(1000) for _ in parent], "position_ids": positions, "parent": parent,
            "loss_weight": weight}  # fmt: skip


def reference(lines: list[dict], size: int) -> torch.Tensor:
    """(B, L, L) bool: the ancestor mask from `parent` alone (the collator's former construction)."""
    out = torch.zeros(len(lines), size, size, dtype=torch.bool)
    for b, x in enumerate(lines):
        for i, p in enumerate(x["parent"]):
            if p >= 0:
                out[b, i, :i] = out[b, p, :i]
            out[b, i, i] = True
        for i in range(len(x["parent"]), size):
            out[b, i, i] = True
    return out


def block_kinds(bm, nb: int) -> torch.Tensor:
    """(B, nQ, nK) from a BlockMask's lists of key blocks per query block: 0 absent, 1 partial, 2 full."""
    counts = []
    for num, idx in ((bm.kv_num_blocks, bm.kv_indices), (bm.full_kv_num_blocks, bm.full_kv_indices)):
        listed = torch.arange(idx.shape[-1]) < num[..., None]  # the first num[q] entries of a row count
        cols = torch.where(listed, idx.long(), nb)[:, 0]  # the rest into a spare column
        counts.append(
            torch.zeros(cols.shape[0], nb, nb + 1, dtype=torch.long).scatter_add_(
                -1, cols, torch.ones_like(cols)
            )[..., :nb]
        )
    partial, full = counts
    assert partial.max() <= 1 and full.max() <= 1 and not (partial & full).any(), "a block listed twice"
    return (partial + 2 * full).to(torch.int8)


def reference_kinds(ref: torch.Tensor, bs: int) -> torch.Tensor:
    """(B, nQ, nK) from the reference over its L x L elements (the last blocks cut at L)."""
    size = ref.shape[-1]
    nb = -(-size // bs)
    pad = nb * bs - size
    seen = torch.nn.functional.pad(ref, (0, pad, 0, pad)).view(-1, nb, bs, nb, bs).sum((2, 4))
    q_len = torch.full((nb,), bs)
    q_len[-1] = size - (nb - 1) * bs
    cells = q_len[:, None] * q_len[None, :]
    return torch.where(seen == cells, 2, (seen > 0).long()).to(torch.int8)


def check(lines: list[dict], bs: int) -> None:
    batch = collate(lines)
    size = max(len(x["parent"]) for x in lines)
    assert all(t.shape == (len(lines), size) for t in batch.values()), {k: t.shape for k, t in batch.items()}
    ref = reference(lines, size)
    assert torch.equal(dense_mask(batch["tree_end"])[:, 0] == 0, ref)
    bm = block_mask(batch["tree_end"], bs)
    nb = -(-size // bs)
    kinds = block_kinds(bm, nb)
    assert torch.equal(kinds, reference_kinds(ref, bs)), "block kinds"
    q = torch.arange(size)
    per_elem = kinds.repeat_interleave(bs, 1).repeat_interleave(bs, 2)[:, :size, :size]
    for b in range(len(lines)):
        modded = bm.mask_mod(torch.tensor(b), torch.tensor(0), q[:, None], q[None, :])
        got = (per_elem[b] == 2) | ((per_elem[b] == 1) & modded)
        assert torch.equal(got, ref[b]), f"elements of line {b}"


def refuses_a_line_not_depth_first() -> str:
    # token 2 is a child of 0 and token 3 a child of 1: 1's subtree {1, 3} is not one interval
    bad = {
        "input_ids": [5, 6, 7, 8],
        "position_ids": [0, 1, 1, 2],
        "parent": [-1, 0, 0, 1],
        "loss_weight": [0] * 4,
    }
    try:
        collate([random_line(random.Random(1), 5), bad])
    except ValueError as exc:
        return str(exc)
    return ""


def refuses_lists_of_different_lengths() -> str:
    short = dict(random_line(random.Random(2), 6), parent=[-1, 0, 1])
    try:
        collate([short])
    except ValueError as exc:
        return str(exc)
    return ""


def main(out_file: str, trees: int = 1000) -> None:
    torch.set_num_threads(1)  # many small tensors
    rng = random.Random(51)
    cases = 0
    for _ in range(trees):
        lines = [random_line(rng, rng.randint(1, 300)) for _ in range(rng.choice((1, 1, 2, 3)))]
        check(lines, rng.choice((4, 16, 32, 64, 128)))
        cases += 1
    with open(out_file, "w") as fh:
        refusals = [refuses_a_line_not_depth_first(), refuses_lists_of_different_lengths()]
        json.dump({"cases": cases, "refusals": refusals}, fh)


if __name__ == "__main__":
    main(sys.argv[1], *(int(x) for x in sys.argv[2:3]))
