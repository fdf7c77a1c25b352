#!/usr/bin/env python3
"""The tree form at a Student's real context length, before and after (docs/benchmarks.md): `collate` and one
`TreeLossMixin.compute_loss` + backward on the CPU path, their time and peak memory, at the lengths of a part.

    PYTHONPATH=src ~/.cache/sftree/trainer/venv/bin/python benchmarks/tree_long_parts.py \
        [--before 0ae6c63] [--collate 4096,16384,32768] [--loss 2048,8192,32768] [--before-max 16384] [--threads 2]

In the trainer venv (scripts/install_trainer.sh). `--before` is the git revision whose `tree_collator.py` is the
"before" (read with `git show`: the dense `(B, 1, L, L)` mask and the full log-softmax); "after" is this checkout's
(`tree_collator`, `tree_attention`, `tree_loss`). Each figure is one fresh process: a synthetic depth-first line
of L tokens (a trunk, then paths that each leave the previous one at a random depth, 20% of the tokens trained in
assistant-like runs), built first; then the process's peak resident memory is reset (`/proc/self/clear_refs`) and
the step timed; the peak above the memory before it is the step's. `collate`: the line to a batch, and the number
of elements of the largest tensor it returns. `loss`: a 2-layer Llama of hidden size 64 (4 heads, vocab 32,000,
float32, random weights), the batch through `compute_loss` and `backward()` (before: eager attention and its
4D mask, as the recipe said; after: sdpa, the CPU path, and eager for comparison). A length above `--before-max` is
not run before (its figure is the before's L^2 extrapolated, marked so).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).parents[1]
VOCAB = 32_000


def synthetic_line(size: int, seed: int = 0, trained: float = 0.2) -> dict:
    """A depth-first line of `size` tokens: a trunk of size/8 (the task's prompt), then paths that each leave the
    previous one at a random depth past the trunk and run 1/16 to 1/4 of `size` (a branch's own tokens); runs of
    tokens trained (assistant replies) covering about `trained` of the line."""
    rng = random.Random(seed)
    parent, branch = [], []  # branch: the path so far (indices)
    trunk = size // 8
    while len(parent) < size:
        if len(branch) > trunk:
            branch = branch[: rng.randint(trunk, len(branch) - 1)]  # leave the previous path past the trunk
        run = trunk if not parent else rng.randint(size // 16, size // 4)
        for _ in range(min(run, size - len(parent))):
            parent.append(branch[-1] if branch else -1)
            branch.append(len(parent) - 1)
    positions: list[int] = []
    for p in parent:
        positions.append(0 if p < 0 else positions[p] + 1)
    weight, i = [0] * size, 0
    while i < size:  # runs of 64 tokens, each trained with probability `trained`
        if rng.random() < trained:
            weight[i : i + 64] = [1] * len(weight[i : i + 64])
        i += 64
    weight = [w if p >= 0 else 0 for w, p in zip(weight, parent, strict=True)]
    ids = [rng.randrange(VOCAB) for _ in range(size)]
    return {"input_ids": ids, "position_ids": positions, "parent": parent, "loss_weight": weight}


def memory() -> dict:
    """This process's resident memory now and its peak since the last reset, in KiB."""
    status = open("/proc/self/status").read()
    return {k: int(v) for k, v in re.findall(r"(VmHWM|VmRSS):\s+(\d+) kB", status)}


def reset_peak() -> int:
    """Reset the peak resident memory to the current one (Linux: 5 into clear_refs); the current, in KiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return memory()["VmRSS"]


def load_before(rev: str):
    """The `tree_collator` module of a git revision, imported from a temporary file."""
    src = subprocess.run(
        ["git", "show", f"{rev}:src/sftree/dataset/tree_collator.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if src.returncode:
        sys.exit(f"git show {rev}: {src.stderr.strip()}")
    path = Path(tempfile.mkdtemp()) / "tree_collator_before.py"
    path.write_text(src.stdout)
    spec = importlib.util.spec_from_file_location("tree_collator_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def small_llama(attn: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=65_536,
        attn_implementation=attn,
    )
    return LlamaForCausalLM(cfg).float()


def one(what: str, version: str, size: int, rev: str, threads: int) -> dict:
    """One figure, in this process (see the module)."""
    import torch

    torch.set_num_threads(threads)
    line = synthetic_line(size)
    if version == "before":
        mod = load_before(rev)
        collate, mixin = mod.collate, mod.TreeLossMixin
    else:
        from sftree.dataset.tree_collator import collate
        from sftree.dataset.tree_loss import TreeLossMixin as mixin
    out = {"what": what, "version": version, "L": size, "trained": sum(w > 0 for w in line["loss_weight"])}
    if what == "collate":
        # warm-up: torch's first-call costs in no figure (a small line: its memory is not reused below)
        collate([synthetic_line(64)])
        base = reset_peak()
        t0 = time.perf_counter()
        batch = collate([line])
        out["seconds"] = time.perf_counter() - t0
        out["largest"] = max(t.numel() for t in batch.values())
        out["batch_mib"] = sum(t.numel() * t.element_size() for t in batch.values()) / 2**20
    else:
        attn = version.partition(":")[2] or "eager"
        model = small_llama(attn)
        batch = collate([line])
        base = reset_peak()
        t0 = time.perf_counter()
        mixin().compute_loss(model, dict(batch)).backward()
        out["seconds"] = time.perf_counter() - t0
        out["grad_norm"] = float(
            sum(p.grad.pow(2).sum() for p in model.parameters() if p.grad is not None) ** 0.5
        )
    out["peak_mib"] = (memory()["VmHWM"] - base) / 1024
    return out


def extrapolated(rows: list[dict], r: dict) -> str:
    """A figure not run: the same step's longest measured one, scaled as L^2 (its mask and scores)."""
    done = [x for x in rows if x["what"] == r["what"] and x["version"] == r["version"] and "seconds" in x]
    if not done:
        return "not run"
    x = max(done, key=lambda x: x["L"])
    f = (r["L"] / x["L"]) ** 2
    return (
        f"not run: ~{x['seconds'] * f:,.0f} s, ~{x['peak_mib'] * f:,.0f} MiB (x{f:.0f} the {x['L']:,} figure)"
    )


def table(rows: list[dict]) -> str:
    lines = ["| step | version | L | seconds | peak MiB above the start | batch MiB | largest tensor (elements) "
             "| gradient norm |", "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        if "seconds" not in r:
            lines.append(f"| {r['what']} | {r['version']} | {r['L']:,} | {extrapolated(rows, r)} | | | | |")
            continue
        largest = f"{r['largest']:,}" if "largest" in r else ""
        batch = f"{r['batch_mib']:,.1f}" if "batch_mib" in r else ""
        norm = f"{r['grad_norm']:.6f}" if "grad_norm" in r else ""
        lines.append(
            f"| {r['what']} | {r['version']} | {r['L']:,} | {r['seconds']:.2f} | {r['peak_mib']:,.1f} | {batch} "
            f"| {largest} | {norm} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", default="0ae6c63", help="the git revision of the 'before' tree_collator.py")
    ap.add_argument("--collate", default="4096,16384,32768")
    ap.add_argument("--loss", default="2048,8192,32768")
    ap.add_argument("--before-max", type=int, default=16384, help="the longest L run before (memory: L^2)")
    ap.add_argument("--after-eager-max", type=int, default=8192, help="the longest L run after with eager")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        what, version, size = args.one.split(",")
        print(json.dumps(one(what, version, int(size), args.before, args.threads)))
        return
    plan = [
        ("collate", v, int(n)) for n in filter(None, args.collate.split(",")) for v in ("before", "after")
    ]
    plan += [
        ("loss", v, int(n))
        for n in filter(None, args.loss.split(","))
        for v in ("before", "after:eager", "after:sdpa")
    ]
    rows = []
    for what, version, size in plan:
        if (
            version == "before"
            and size > args.before_max
            or version == "after:eager"
            and size > args.after_eager_max
        ):
            rows.append({"what": what, "version": version, "L": size})
            continue
        argv = [sys.executable, __file__, "--one", f"{what},{version},{size}", "--before", args.before]
        res = subprocess.run([*argv, "--threads", str(args.threads)], capture_output=True, text=True)
        if res.returncode:
            sys.exit(f"{what} {version} L={size} failed:\n{res.stderr[-3000:]}")
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
