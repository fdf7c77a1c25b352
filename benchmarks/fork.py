"""Benchmark the Teacher runtime (issue 3): fork + commit cost, and the framework's share of an edge.

    python3 benchmarks/fork.py [--sizes 100,1000,10000] [--reps 5] [--latencies 5,20,50] [--edges 1]

Part 1 - fork + commit for code trees of N files (1 KiB each, 20 per folder): `git worktree` (what the
runtime does: worktree add of the node's commit, private knowledge checkout, edit one file, `git add -A` +
commit, remove the worktree) against a plain copy (copytree the node's folder once, edit one file: that copy
is the new node's state and stays). Time per fork, and the disk each one adds (git: the store's growth; copy:
the new folder), and per tree: the seed plus --tree-edges forks.

Part 2 - framework time per edge: a real edge (fork, two turns of the native agent against teacher-sim over
HTTP, bwrap when available, the circle_packing grader, diffs, session) at several teacher-sim latencies.
framework = wall - model latency (sum of request latencies) - grader time; the goal is a share under 2% at
latencies typical of a real model (tens of ms per output token, a few seconds per step).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from sftree.runtime.store import TreeStore  # noqa: E402


def make_code(root: Path, n: int) -> None:
    payload = "x = 1\n" + "# filler line for a realistic file size\n" * 24
    for i in range(n):
        d = root / "code" / f"pkg{i // 20:04d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i:05d}.py").write_text(payload)
    (root / "shared" / "notes").mkdir(parents=True, exist_ok=True)
    (root / "shared" / "notes" / "n.md").write_text("note\n")


def disk_bytes(path: Path) -> int:
    """Allocated bytes under `path` (du: st_blocks, each inode once)."""
    seen, total = set(), 0
    for d, _, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(d, name))
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_blocks * 512
    return total


def bench_worktree(tmp: Path, n: int, reps: int) -> tuple[float, float, float, float]:
    """(median fork s, seed s, seeded store bytes, store bytes added per fork)."""
    root = tmp / f"root{n}"
    make_code(root, n)
    t0 = time.perf_counter()
    store, state = TreeStore.create(tmp / f"tree{n}", root, {})
    seed_s = time.perf_counter() - t0
    seeded = disk_bytes(tmp / f"tree{n}")
    times = []
    for r in range(reps):
        t0 = time.perf_counter()
        ws = store.fork(state, f"e{r}")
        (ws.root / "pkg0000" / "mod00000.py").write_text(f"x = {r + 2}\n")
        ws.commit_code("bench")
        ws.commit_knowledge("bench")
        ws.close()
        times.append(time.perf_counter() - t0)
    grown = (disk_bytes(tmp / f"tree{n}") - seeded) / reps
    return statistics.median(times), seed_s, seeded, grown


def bench_copy(tmp: Path, n: int, reps: int) -> tuple[float, float]:
    """(median fork s, bytes per fork): the new node is one copy of its parent, edited."""
    src = tmp / f"root{n}"
    times = []
    for r in range(reps):
        t0 = time.perf_counter()
        node = tmp / f"copy{n}-{r}"
        shutil.copytree(src, node)
        (node / "code" / "pkg0000" / "mod00000.py").write_text(f"x = {r + 2}\n")
        times.append(time.perf_counter() - t0)
    per_fork = disk_bytes(tmp / f"copy{n}-0")
    for r in range(reps):
        shutil.rmtree(tmp / f"copy{n}-{r}")
    return statistics.median(times), per_fork


def part1(sizes: list[int], reps: int, tree_edges: int) -> None:
    mib = 1 << 20
    print(f"\nfork + commit (median of {reps}); disk per fork, and per tree of {tree_edges} forks")
    print(
        f"{'files':>7} | {'git worktree':>12} | {'plain copy':>10} | {'seed store':>10} | {'git/fork':>9} | "
        f"{'copy/fork':>9} | {'git/tree':>9} | {'copy/tree':>9}"
    )
    print("-" * 98)
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="sftree-bench-") as tmp:
            wt, seed, seeded, grown = bench_worktree(Path(tmp), n, reps)
            cp, per_copy = bench_copy(Path(tmp), n, reps)
        print(
            f"{n:>7} | {wt * 1000:>9.0f} ms | {cp * 1000:>7.0f} ms | {seed * 1000:>7.0f} ms | "
            f"{grown / 1024:>6.0f} KiB | {per_copy / mib:>5.1f} MiB | {(seeded + tree_edges * grown) / mib:>5.1f} MiB | "
            f"{tree_edges * per_copy / mib:>5.0f} MiB",
            flush=True,
        )


def part2(latencies: list[float], edges: int, sandbox: str) -> None:
    import logging

    from sftree.config import load_config
    from sftree.search.edge import EdgeContext, run_edge
    from sftree.settings import settings_of
    from sftree.world.task import task_config

    logging.disable(logging.WARNING)
    print(f"\nframework time per edge (native agent, sandbox {sandbox}, teacher-sim, circle_packing grader)")
    print(
        f"{'ms/token':>8} | {'edges':>5} | {'steps':>5} | {'wall s':>7} | {'model s':>7} | {'grader s':>8} | "
        f"{'framework s':>11} | {'share':>6} | {'fw/step':>7} | {'model/step':>10}"
    )
    print("-" * 104)
    for ms in latencies:
        cfg = load_config(REPO / "examples" / "demo.yaml")
        cfg["teacher"]["sim"] = {"seed": 0, "latency_ms_per_token": ms}
        cfg["agent"]["sandbox"] = sandbox
        settings = settings_of(cfg)
        task = task_config(settings, "circle_packing")
        with tempfile.TemporaryDirectory(prefix="sftree-bench-") as tmp:
            root = Path(tmp) / "root"
            shutil.copytree(REPO / "examples" / "circle_packing" / "seed", root / "code")
            (root / "shared" / "notes").mkdir(parents=True)
            ctx = EdgeContext.create(Path(tmp) / "tree", root, settings, task)
            try:
                results = [
                    run_edge(ctx, ctx.root_state, f"e{i}", None, depth=1, attempt=1, eval_count=0)
                    for i in range(edges)
                ]
            finally:
                ctx.close()
        wall = sum(r.wall_s for r in results)
        model = sum(r.teacher_s for r in results)
        grader = sum(r.grader_s for r in results)
        fw = sum(r.framework_s for r in results)
        steps = sum(r.steps for r in results)
        print(
            f"{ms:>8g} | {edges:>5} | {steps:>5} | {wall:>7.2f} | {model:>7.2f} | {grader:>8.2f} | "
            f"{fw:>11.2f} | {100 * fw / wall:>5.1f}% | {1000 * fw / max(steps, 1):>4.0f} ms | "
            f"{model / max(steps, 1):>8.2f} s",
            flush=True,
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100,1000,10000")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tree-edges", type=int, default=40, help="forks per tree for the per-tree disk column")
    p.add_argument("--latencies", default="0,5,20,50", help="teacher-sim ms per output token")
    p.add_argument("--edges", type=int, default=1)
    p.add_argument("--sandbox", default="auto")
    p.add_argument("--skip-fork", action="store_true")
    p.add_argument("--skip-edge", action="store_true")
    a = p.parse_args()
    if not a.skip_fork:
        part1([int(x) for x in a.sizes.split(",")], a.reps, a.tree_edges)
    if not a.skip_edge:
        part2([float(x) for x in a.latencies.split(",")], a.edges, a.sandbox)
    return 0


if __name__ == "__main__":
    sys.exit(main())
