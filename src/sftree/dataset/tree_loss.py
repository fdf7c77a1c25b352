"""The tree form's loss (docs/outputs.md "The tree form"): `sum_i w_i * -log softmax(head(h[parent_i]))[id_i]`, each
trained token predicted from its parent's row (a branch point's row predicts each of its children). Its sum over
the lines is the path form's objective (the sum over paths of their trained tokens' losses); divided by the weights'
sum it is the token mean of a batch of those paths. torch only.

No `(B, L, V)` logits: the model runs with `logits_to_keep` set to one row (its own head on that row checks ours)
and gives its last hidden states; the logits are made only at the trained tokens' parents' rows, a chunk of rows at
a time (`chunk_bytes` of float32 logits), each chunk under activation checkpointing, so that its logits are freed
after its forward and made again in its backward: the loss's memory is one chunk's logits, whatever L.

`forward_loss(model, batch)`: the mask (`tree_attention`, in the form of the model's attention implementation),
the forward and the weighted sum. `TreeLossMixin` before a transformers Trainer class (e.g. TRL's SFTTrainer):
`class TreeSFTTrainer(TreeLossMixin, SFTTrainer): pass` (a runnable recipe: docs/outputs.md).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from sftree.dataset.tree_attention import attention_mask
from sftree.dataset.tree_collator import TREE_FIELDS

CHUNK_BYTES = 32 * 2**20  # float32 logits per chunk; a chunk's backward holds about three times that


def trained_rows(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The trained tokens of a batch, in order: their line, their parent's index, their id and their weight."""
    parent, weight = batch["tree_parent"], batch["tree_weight"]
    line, token = ((weight > 0) & (parent >= 0)).nonzero(as_tuple=True)
    return line, parent[line, token], batch["input_ids"][line, token], weight[line, token]


def head_logits(head: torch.nn.Module, rows: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """The logits of hidden rows in float32, capped as the model's forward caps them (`final_logit_softcapping`)."""
    logits = head(rows).float()
    return logits if not softcap else softcap * torch.tanh(logits / softcap)


def _chunk_loss(
    head: torch.nn.Module, softcap: float | None, rows: torch.Tensor, ids: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    logits = head_logits(head, rows, softcap)
    return ((logits.logsumexp(-1) - logits.gather(-1, ids[:, None])[:, 0]) * weight).sum()


def tree_loss(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    softcap: float | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> torch.Tensor:
    """The weighted sum of the trained tokens' losses (see the module) from the last hidden states `(B, L, H)`
    and the model's output embeddings `head`, in float32."""
    line, src, ids, weight = (t.to(hidden.device) for t in trained_rows(batch))
    if not len(ids):  # nothing trained: a zero still in the graph (a backward gives zero gradients)
        return hidden.float().sum() * 0.0
    # (N, H): the parents' rows, one per trained token (a branch point's once per child)
    rows = hidden[line, src]
    vocab = head.weight.shape[0]
    step = max(1, chunk_bytes // (4 * vocab))
    loss = partial(_chunk_loss, head, softcap)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for s in range(0, len(ids), step):
        part = (rows[s : s + step], ids[s : s + step], weight[s : s + step].float())
        total = total + (
            checkpoint(loss, *part, use_reentrant=False) if torch.is_grad_enabled() else loss(*part)
        )
    return total


def forward_loss(
    model: Any, batch: dict[str, torch.Tensor], inner: Any = None, chunk_bytes: int = CHUNK_BYTES
) -> tuple[torch.Tensor, Any]:
    """A collated batch through `model` (a transformers causal LM, possibly wrapped: `inner` is the model itself,
    by default `model.module` or `model`): the weighted loss sum (`tree_loss`) and the model's outputs (logits of
    one row only). The mask is in the form of the model's attention implementation (`tree_attention`); ValueError
    when the model's own head differs from `get_output_embeddings()` (a forward that transforms the logits
    otherwise than `final_logit_softcapping`)."""
    inner = inner if inner is not None else getattr(model, "module", model)
    config = inner.config
    ids = batch["input_ids"]
    mask = attention_mask(batch, config._attn_implementation, inner.dtype)
    probe = torch.tensor([ids.shape[1] - 1], device=ids.device)  # one row of the model's own logits
    out = model(
        input_ids=ids,
        position_ids=batch["position_ids"],
        attention_mask=mask,
        logits_to_keep=probe,
        output_hidden_states=True,
        use_cache=False,
    )
    hidden, head = out.hidden_states[-1], inner.get_output_embeddings()
    softcap = getattr(config, "final_logit_softcapping", None)
    with torch.no_grad():
        ours, own = head_logits(head, hidden[:, probe], softcap), out.logits.detach().float()
    if not torch.allclose(ours, own, rtol=1e-3, atol=1e-3 * float(own.abs().max()) + 1e-6):
        raise ValueError(
            f"{type(inner).__name__}'s forward makes its logits otherwise than its output embeddings "
            "(and final_logit_softcapping): the tree loss cannot make them from its hidden states"
        )
    return tree_loss(hidden, head, batch, softcap, chunk_bytes), out


class TreeLossMixin:
    """Before a transformers Trainer class (e.g. TRL's SFTTrainer): the loss of a batch is its weighted loss sum
    over the weight of the optimizer step's batches (`num_items_in_batch`: all the micro-batches of a gradient
    accumulation, and of every process when `average_tokens_across_devices`), the path form's token mean over the
    paths they hold; over the batch's own weight where no count is given (evaluation).
    `tree_loss_chunk_bytes`: the float32 logits of one chunk of the loss."""

    tree_loss_chunk_bytes = CHUNK_BYTES

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # compute_loss divides by num_items_in_batch itself: the trainer must not divide by the accumulation steps
        self.model_accepts_loss_kwargs = True

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list[Any], Any]:
        """The trainer's micro-batches of one optimizer step and their weight (transformers counts `labels`,
        which the tree form has none of)."""
        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)  # type: ignore[misc]
        if batches and "tree_weight" in batches[0]:
            num_items = sum(b["tree_weight"].sum() for b in batches).to(device)
            if self.args.average_tokens_across_devices and self.args.world_size > 1:  # type: ignore[attr-defined]
                num_items = self.accelerator.gather(num_items).sum()  # type: ignore[attr-defined]
        return batches, num_items

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        tree = {k: inputs.pop(k) for k in TREE_FIELDS}
        accelerator: Any = getattr(self, "accelerator", None)  # the Trainer's, once it made one
        inner = accelerator.unwrap_model(model) if accelerator is not None else None
        loss, outputs = forward_loss(model, {**inputs, **tree}, inner, self.tree_loss_chunk_bytes)
        if num_items_in_batch is None:
            loss = loss / tree["tree_weight"].sum().clamp(min=1)
        else:
            loss = loss / torch.as_tensor(num_items_in_batch).clamp(min=1)
            if self.args.average_tokens_across_devices:  # type: ignore[attr-defined]
                loss = loss * accelerator.num_processes  # DDP averages the processes' gradients
        return (loss, outputs) if return_outputs else loss
