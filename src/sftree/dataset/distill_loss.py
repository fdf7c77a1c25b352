"""A distillation loss on the Teacher's stored tokens (`teacher.logprobs: K`; docs/outputs.md, "Teacher tokens"):
for a Student that shares the Teacher's tokenizer. torch only: import it where the trainer runs, or copy this file.

Per trained position t (the Student's logits `z_t` predicting the Teacher's sampled token `y_t`, with the Teacher's
top-K ids `a_t1..a_tK` and their logprobs `l_t1..l_tK`):

- `nll_t = -log softmax(z_t)[y_t]`: the sampled-token loss (what SFT on the Teacher's ids trains);
- `kl_t = sum_k q_tk * (log q_tk - log softmax(z_t)[a_tk])` with `q_t = softmax(l_t)`: the forward KL from the
  Teacher's top-K, renormalised over the K kept alternatives (the rest of its distribution was never stored), to
  the Student's full distribution read at those K ids. It is >= 0, and 0 exactly when the Student puts q_t on the
  K ids and nothing elsewhere (the Student's mass outside them counts as a miss);
- `loss = sum_t w_t * (alpha * kl_t + (1 - alpha) * nll_t) / sum_t w_t`: the documented mix, `alpha = 0.5` by
  default (`alpha = 0`: plain SFT on the sampled ids; `alpha = 1`: top-K distillation alone). `w_t` is 1 on
  trained positions and 0 elsewhere (padding, the prompt, a position whose Teacher tokens were not kept), so a
  batch's loss is the token mean over what it trains.

Shapes: `logits (B, L, V)` for positions that predict the next token (shift them as the model's own loss does:
`logits[:, :-1]` against ids `[:, 1:]`), `target (B, L)` long, `top_ids (B, L, K)` long, `top_logprobs (B, L, K)`
float, `weight (B, L)` float. A padded alternative (a position with fewer than K kept) has logprob `-inf`: it
gets q = 0 and adds nothing.
"""

from __future__ import annotations

import torch

DEFAULT_ALPHA = 0.5


def distill_terms(
    logits: torch.Tensor, target: torch.Tensor, top_ids: torch.Tensor, top_logprobs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kl, nll), each (B, L): the per-position terms of the module docstring."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    q_log = torch.log_softmax(top_logprobs.float(), dim=-1)
    q = q_log.exp()
    # a padded alternative (q = 0) adds 0 * (0 - log p): its -inf logprob never meets a 0 (no nan, value or grad)
    q_log = torch.where(q > 0, q_log, torch.zeros_like(q_log))
    kl = (q * (q_log - logp.gather(-1, top_ids))).sum(-1)
    return kl, nll


def distill_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    top_ids: torch.Tensor,
    top_logprobs: torch.Tensor,
    weight: torch.Tensor,
    alpha: float = DEFAULT_ALPHA,
) -> torch.Tensor:
    """The weighted token mean of `alpha * kl + (1 - alpha) * nll` (module docstring); 0 for a batch with no
    trained position."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be within [0, 1], not {alpha}")
    kl, nll = distill_terms(logits, target, top_ids, top_logprobs)
    w = weight.float()
    per = alpha * kl + (1.0 - alpha) * nll
    return (per * w).sum() / w.sum().clamp(min=1.0)
