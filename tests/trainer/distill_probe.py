"""Run with the trainer venv's python (PYTHONPATH=src): `sftree.dataset.distill_loss` against its definition
computed term by term, its limits (alpha 0 is torch's cross entropy; a Student equal to the Teacher's top-K has
KL 0; padded alternatives add nothing) and a few gradient steps; prints what it found as JSON."""

from __future__ import annotations

import json
import math

import torch

from sftree.dataset.distill_loss import distill_loss

torch.manual_seed(0)
B, L, V, K = 2, 5, 11, 3
logits = torch.randn(B, L, V)
target = torch.randint(0, V, (B, L))
top_ids = torch.stack([torch.randperm(V)[:K] for _ in range(B * L)]).view(B, L, K)
top_lp = torch.log_softmax(torch.randn(B, L, K), -1) - 0.3  # a top-K holding e^-0.3 of the Teacher's mass
weight = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.float)


def by_hand(alpha: float) -> float:
    total, n = 0.0, 0.0
    for b in range(B):
        for t in range(L):
            if not weight[b, t]:
                continue
            logz = math.log(sum(math.exp(x) for x in logits[b, t].tolist()))
            logp = [x - logz for x in logits[b, t].tolist()]
            lps = top_lp[b, t].tolist()
            mass = sum(math.exp(x) for x in lps)
            q = [math.exp(x) / mass for x in lps]
            kl = sum(
                qk * (math.log(qk) - logp[int(a)]) for qk, a in zip(q, top_ids[b, t].tolist(), strict=True)
            )
            total += alpha * kl + (1 - alpha) * -logp[int(target[b, t])]
            n += 1
    return total / n


out = {"cases": []}
for alpha in (0.0, 0.5, 1.0):
    got = distill_loss(logits, target, top_ids, top_lp, weight, alpha).item()
    out["cases"].append({"alpha": alpha, "loss": got, "by_hand": by_hand(alpha)})
mask = weight.bool()
out["cross_entropy"] = torch.nn.functional.cross_entropy(logits[mask], target[mask]).item()
out["alpha0"] = distill_loss(logits, target, top_ids, top_lp, weight, 0.0).item()
# a Student equal to the Teacher's renormalised top-K, nothing elsewhere: KL 0
same = torch.full((B, L, V), -1e4)
same.scatter_(-1, top_ids, torch.log_softmax(top_lp, -1))
out["kl_of_the_teacher_itself"] = distill_loss(same, target, top_ids, top_lp, weight, 1.0).item()
# one alternative padded (-inf) at every position: as if only K-1 were kept
pad_lp = top_lp.clone()
pad_lp[..., -1] = float("-inf")
out["padded"] = distill_loss(logits, target, top_ids, pad_lp, weight, 1.0).item()
out["dropped"] = distill_loss(logits, target, top_ids[..., :-1], top_lp[..., :-1], weight, 1.0).item()
# gradient steps on the logits: finite gradients, the loss falls
z = logits.clone().requires_grad_(True)
opt = torch.optim.SGD([z], lr=1.0)
losses = []
for _ in range(20):
    opt.zero_grad()
    loss = distill_loss(z, target, top_ids, pad_lp, weight)
    loss.backward()
    assert torch.isfinite(z.grad).all()
    opt.step()
    losses.append(loss.item())
out["losses"] = losses
print(json.dumps(out))
