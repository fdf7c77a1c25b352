#!/usr/bin/env python3
"""The tree form's GPU path on a CUDA device: FlexAttention with the `BlockMask` of `tree_attention`, forward AND
backward (torch has no FlexAttention backward on CPU, so the CPU tests check its forward only).

    PYTHONPATH=src python benchmarks/tree_flex_gpu.py [--lengths 8192,32768] [--json OUT]

Needs torch with CUDA and transformers (the versions of scripts/install_trainer.sh, with a CUDA torch); no
download (the models are made here with random weights). Two parts, printed as markdown:

1. Equality: a small Llama (4 layers, hidden 256, vocab 32,000, float32, TF32 off) and a random trie of paths
   packed into one tree line (`dataset.tree_packed.pack_paths`): the line's weighted loss and the gradients of
   every parameter under FlexAttention (`forward_loss`, compiled, forward and backward) against the path form's
   objective (each path a forward of its own, sdpa's causal mask). Passes at a relative difference <= 1e-4.
2. Cost: one `forward_loss` + backward on synthetic lines (`tree_long_parts.synthetic_line`) of each length, a
   Qwen2.5-0.5B-shaped Llama (24 layers, hidden 896, 14 heads, 2 KV heads, vocab 151,936, bfloat16, random
   weights, gradient checkpointing as a trainer runs it): FlexAttention against sdpa with the dense mask, peak
   GPU memory (`max_memory_allocated`) and time (after one warm-up step of the same length, which compiles).
   sdpa is skipped where its `L x L` mask alone would pass a quarter of the GPU.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def equality(device: str = "cuda", attn: str = "flex_attention") -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from sftree.dataset.tree_collator import collate
    from sftree.dataset.tree_loss import forward_loss
    from sftree.dataset.tree_packed import PathTokens, pack_paths

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32_000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")  # fmt: skip
    model = LlamaForCausalLM(cfg).float().to(device).eval()  # eval: no dropout, the two forms one function
    rng = random.Random(0)
    paths, prev = [], [rng.randrange(32_000) for _ in range(300)]
    for n in range(12):  # each path leaves the previous one at a random depth
        ids = prev[: rng.randint(50, len(prev))] + [
            rng.randrange(32_000) for _ in range(rng.randint(50, 400))
        ]
        trained = [i > 50 and (i // 40) % 2 == 1 for i in range(len(ids))]
        paths.append(PathTokens(tuple(ids), tuple(trained), {"id": str(n)}))
        prev = ids
    (line,), _ = pack_paths(paths, 10**6, "gpu")
    params = list(model.parameters())
    want, want_g = 0.0, [torch.zeros_like(p) for p in params]
    for p in paths:
        ids = torch.tensor([p.ids], device=device)
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1).gather(
            -1, ids[0, 1:, None]
        )[:, 0]
        loss = -(logp * torch.tensor(p.trained[1:], device=device, dtype=torch.float32)).sum()
        for g, d in zip(want_g, torch.autograd.grad(loss, params), strict=True):
            g += d
        want += loss.item()
    model.set_attn_implementation(attn)
    batch = {k: v.to(device) for k, v in collate([line.to_dict()]).items()}
    loss, _ = forward_loss(model, batch)
    got_g = torch.autograd.grad(loss, params)
    num = sum(float((a - b).pow(2).sum()) for a, b in zip(got_g, want_g, strict=True)) ** 0.5
    den = sum(float(b.pow(2).sum()) for b in want_g) ** 0.5
    return {"tokens": len(line), "paths": len(paths), "path_loss": want, "tree_loss": loss.item(),
            "loss_rel_diff": abs(loss.item() - want) / abs(want), "grad_rel_diff": num / den}  # fmt: skip


def cost(size: int, attn: str) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from tree_long_parts import synthetic_line

    from sftree.dataset.tree_collator import collate
    from sftree.dataset.tree_loss import forward_loss

    cfg = LlamaConfig(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=131_072,
                      attn_implementation=attn, tie_word_embeddings=True)  # fmt: skip
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).cuda().train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = {k: v.cuda() for k, v in collate([synthetic_line(size)]).items()}
    forward_loss(model, batch)[0].backward()  # warm-up (compiles FlexAttention for this shape)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    forward_loss(model, batch)[0].backward()
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    del model, batch
    torch.cuda.empty_cache()
    return {"L": size, "attn": attn, "seconds": took, "peak_gib_above_weights": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--json")
    ap.add_argument(
        "--cpu-dry-run", action="store_true", help="part 1 on CPU under sdpa: the script's own check"
    )
    args = ap.parse_args()
    import torch

    if args.cpu_dry_run:
        print(json.dumps(equality("cpu", "sdpa")))
        return
    if not torch.cuda.is_available():
        sys.exit(
            "no CUDA device: this script checks the GPU path (tests/test_tree_trainer.py checks the CPU's)"
        )
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "equality": equality()}
    eq = report["equality"]
    print(f"equality on {report['device']}: {json.dumps(eq)}", flush=True)
    total = torch.cuda.get_device_properties(0).total_memory
    report["cost"] = []
    for size in map(int, args.lengths.split(",")):
        for attn in ("flex_attention", "sdpa"):
            if attn == "sdpa" and size * size * 2 > total / 4:
                report["cost"].append({"L": size, "attn": attn, "skipped": "its L x L mask"})
                continue
            report["cost"].append(cost(size, attn))
            print(json.dumps(report["cost"][-1]), flush=True)
    print(f"\n| check | value |\n|---|---:|\n| loss rel. diff | {eq['loss_rel_diff']:.2e} |"
          f"\n| gradient rel. diff | {eq['grad_rel_diff']:.2e} |")  # fmt: skip
    print("\n| L | attention | seconds | peak GiB above the weights |\n|---:|---|---:|---:|")
    for c in report["cost"]:
        if "skipped" in c:
            print(f"| {c['L']:,} | {c['attn']} | skipped: {c['skipped']} | |")
        else:
            print(f"| {c['L']:,} | {c['attn']} | {c['seconds']:.2f} | {c['peak_gib_above_weights']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    ok = eq["loss_rel_diff"] <= 1e-4 and eq["grad_rel_diff"] <= 1e-4
    sys.exit(0 if ok else "the GPU path's loss or gradients differ from the path form's")


if __name__ == "__main__":
    main()
