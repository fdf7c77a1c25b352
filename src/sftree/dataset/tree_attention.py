"""The tree form's attention mask, built where the model runs from a batch's DFS intervals (`tree_end` of
`tree_collator.collate`): key k is visible to query q iff `k <= q < tree_end[k]` (k is q or one of its ancestors).
torch only.

One mask per attention implementation, in the form it takes (transformers uses a 4D mask or a `BlockMask` as given):
- `flex_attention` (the GPU path): `block_mask`, a FlexAttention `BlockMask` made from the intervals block by block
  (each block of keys' least and greatest subtree end says whether a block of queries sees all, some or none of
  it) and a `mask_mod` that reads `tree_end`: O(L + (L / block)^2) memory, no dense mask ever, and the blocks no
  query sees are skipped (a part's branches do not attend to each other).
- `sdpa` and `eager` (the CPU path, small parts): `dense_mask`, the `(B, 1, L, L)` mask built by broadcasting (a
  block of query rows at a time, no loop over tokens) as an additive float mask in the model's dtype: 0 where
  visible, the dtype's minimum elsewhere.
  Not a boolean one: torch's sdpa converts a boolean mask to the query's dtype on every call, so each layer's
  backward would keep a copy of its own, where one additive mask is shared by all the layers; eager adds the mask
  to its scores and takes no boolean one.
- flash attention takes no mask: refused.

`attention_mask(batch, attn_implementation, dtype)` picks the form.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask

BLOCK_SIZE = 128  # FlexAttention's default block (its GPU kernels' tile)
DENSE = ("sdpa", "eager")


def dense_mask(end: torch.Tensor, dtype: torch.dtype = torch.float32, rows: int = 1024) -> torch.Tensor:
    """`(B, 1, L, L)` additive mask (see the module) from `tree_end` `(B, L)`, by broadcasting, `rows` query rows
    at a time (the boolean of a block of rows, never of the whole mask, beside the mask itself)."""
    size = end.shape[1]
    ar = torch.arange(size, device=end.device)
    mask = torch.empty(end.shape[0], 1, size, size, dtype=dtype, device=end.device)
    low = torch.finfo(dtype).min
    for r in range(0, size, rows):
        q = ar[r : r + rows, None]  # (rows, 1) against the keys (1, L) and their ends (B, 1, L)
        seen = (ar[None, :] <= q)[None] & (q[None] < end[:, None, :])
        mask[:, 0, r : r + rows] = torch.where(seen, 0.0, low)
    return mask


def _blocks_first(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A `(B, nQ, nK)` boolean block matrix as FlexAttention's (count, indices): each query block's key blocks,
    those in the mask first, in order."""
    order = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True)
    return blocks.sum(-1).to(torch.int32)[:, None], order.to(torch.int32)[:, None]


def block_mask(end: torch.Tensor, block_size: int = BLOCK_SIZE) -> BlockMask:
    """The FlexAttention `BlockMask` of a batch's DFS intervals `tree_end` `(B, L)` (see the module).

    Blocks of `block_size` queries and keys, nb = ceil(L / block_size) of each. A key block strictly before a
    query block [q0, q1) (every key before every query) is fully visible iff each key's subtree reaches q1
    (min end >= q1), partly iff one reaches q0 (max end > q0), else not at all; a diagonal block is partly
    visible (each token sees itself, not the keys after it; fully when it holds one token); a key block after the
    queries is never visible."""
    size = end.shape[1]
    nb = -(-size // block_size)
    # keys past L (the last block's tail) see themselves only, as padding does: mask_mod may read them
    tail = torch.arange(size + 1, nb * block_size + 1, device=end.device).expand(end.shape[0], -1)
    ends = torch.cat([end, tail], dim=1)
    per_block = ends.view(end.shape[0], nb, block_size)
    idx = torch.arange(nb, device=end.device)
    q0, q1 = idx * block_size, ((idx + 1) * block_size).clamp(max=size)
    before = (idx[None, :] < idx[:, None])[None]  # (1, nQ, nK): the key block ends before the query block
    diagonal = torch.eye(nb, dtype=torch.bool, device=end.device)[None]
    full = before & (per_block.min(-1).values[:, None, :] >= q1[None, :, None])
    full |= diagonal & (q1 - q0 == 1)[None, :, None]  # a block of one token: itself
    some = before & (per_block.max(-1).values[:, None, :] > q0[None, :, None])
    partial = (some | diagonal) & ~full

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return (k <= q) & (q < ends[b, k])

    kv_num, kv_idx = _blocks_first(partial)
    full_num, full_idx = _blocks_first(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(size, size)
    )


def attention_mask(
    batch: dict[str, torch.Tensor], attn_implementation: str, dtype: torch.dtype = torch.float32
) -> torch.Tensor | BlockMask:
    """The mask of a collated batch in the form `attn_implementation` takes (see the module); ValueError for one
    that takes no mask."""
    end = batch["tree_end"]
    if attn_implementation == "flex_attention":
        return block_mask(end)
    if attn_implementation in DENSE:
        return dense_mask(end, dtype)
    raise ValueError(
        f"attn_implementation {attn_implementation!r} takes no tree mask: load the model with "
        "attn_implementation='flex_attention' (GPU) or 'sdpa' (CPU, small parts)"
    )
