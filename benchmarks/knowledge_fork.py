"""Benchmark the per-edge cost of shared knowledge as the root's attempt records grow.

    python3 benchmarks/knowledge_fork.py [--attempts 100,1000,10000] [--edges 6]

A root snapshot whose `shared/attempts/` holds A attempt records (about 600 bytes each, like Coral's) and a
few notes. Each edge does what `run_edge` does with knowledge, in order: fork the node (code worktree + private
knowledge checkout), build the turn prompt (loads every attempt), two turns that each run `coral eval` (loads
every attempt, writes one new record) and commit knowledge, the final state (knowledge commit + refs), and
close. Edges are chained (each forks the previous edge's child), so each fork moves to a new knowledge commit.
The first edge of a tree is not counted (nothing to reuse yet; its fork costs what `before` does).

Side by side in one run:
- before: a full checkout of every knowledge file per fork without stat data in the index (so each turn's
  `add -A` hashes every file again), and every attempt file parsed at every load (the previous code, kept
  below and patched in);
- after: the closed edge's checkout moved into the next fork and brought to its commit by git (only the
  files that differ are written), stat data kept, attempt records parsed once per file version.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from sftree.agents import prompts  # noqa: E402
from sftree.runtime import coral  # noqa: E402
from sftree.runtime.workspace import TreeStore, git  # noqa: E402


def old_load_attempts(attempts_dir: Path) -> list[dict]:
    """load_attempts as it was: every file read and parsed at every call."""
    out = []
    if not attempts_dir.is_dir():
        return out
    for p in attempts_dir.glob("*.json"):
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(d, dict):
            d.setdefault("commit_hash", p.stem)
            out.append(d)
    out.sort(key=lambda d: (str(d.get("timestamp", "")), str(d.get("commit_hash"))))
    return out


def old_checkout_knowledge(self, kdir: Path, index: Path, commit: str) -> None:
    """The previous fork: a full checkout, index without stat data."""
    env = {"GIT_INDEX_FILE": str(index)}
    kdir.mkdir()
    git(["--work-tree", str(kdir), "read-tree", commit], git_dir=self.knowledge_git, env=env)
    git(["--work-tree", str(kdir), "checkout-index", "-a", "-f"], git_dir=self.knowledge_git, env=env)


def make_root(tmp: Path, attempts: int) -> Path:
    root = tmp / f"root{attempts}"
    (root / "code").mkdir(parents=True)
    (root / "code" / "solution.py").write_text("ROWS = 5\n")
    notes = root / "shared" / "notes"
    notes.mkdir(parents=True)
    for i in range(5):
        (notes / f"n{i}.md").write_text(f"# note {i}\n" + "insight\n" * 20)
    att = root / "shared" / "attempts"
    att.mkdir()
    for i in range(attempts):
        sha = f"{i:040x}"
        rec = {"commit_hash": sha, "agent_id": f"agent-{i % 4}", "title": f"try {i}", "score": i % 97 / 10,
               "status": "regressed", "parent_hash": f"{i - 1:040x}", "timestamp": f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}",
               "feedback": "grader output " * 20, "metadata": {"eval_number": i + 1}}  # fmt: skip
        (att / f"{sha}.json").write_text(json.dumps(rec))
    return root


def one_edge(store: TreeStore, state, edge_id: str, n: int) -> tuple[object, dict[str, float]]:
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    ws = store.fork(state, edge_id)
    t["fork"] = time.perf_counter() - t0
    att = ws.knowledge_dir / "attempts"
    load = 0.0
    commit = 0.0
    for turn in (1, 2):
        t1 = time.perf_counter()
        prompts.load_attempts(att)  # the turn prompt
        coral.load_attempts(att)  # `coral eval` (branch best)
        load += time.perf_counter() - t1
        sha = f"{n:036x}{turn:04x}"
        (att / f"{sha}.json").write_text(json.dumps({"commit_hash": sha, "score": 1.0, "timestamp": "2027"}))
        (ws.knowledge_dir / "notes" / f"{edge_id}-{turn}.md").write_text("a new insight\n")
        t1 = time.perf_counter()
        ws.commit_knowledge(f"{edge_id} turn {turn}")
        commit += time.perf_counter() - t1
    t["loads"], t["commits"] = load, commit
    t1 = time.perf_counter()
    child = ws.state(None)
    ws.close()
    t["state+close"] = time.perf_counter() - t1
    t["edge"] = time.perf_counter() - t0
    return child, t


def run_tree(tmp: Path, root: Path, edges: int, mode: str) -> dict[str, float]:
    saved = (
        TreeStore._checkout_knowledge,
        TreeStore.park_knowledge,
        coral.load_attempts,
        prompts.load_attempts,
    )
    if mode == "before":
        TreeStore._checkout_knowledge = old_checkout_knowledge
        TreeStore.park_knowledge = lambda self, ws: None
        coral.load_attempts = prompts.load_attempts = old_load_attempts
    coral._ATTEMPTS.clear()
    try:
        store, state = TreeStore.create(tmp / f"tree-{mode}-{root.name}", root, {})
        times: list[dict[str, float]] = []
        for i in range(edges + 1):
            state, t = one_edge(store, state, f"e{i + 1}", i)
            if i:  # the first edge has nothing to reuse
                times.append(t)
        store.close()
    finally:
        (
            TreeStore._checkout_knowledge,
            TreeStore.park_knowledge,
            coral.load_attempts,
            prompts.load_attempts,
        ) = saved
    return {k: 1000 * statistics.median(t[k] for t in times) for k in times[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attempts", default="100,1000,10000")
    ap.add_argument("--edges", type=int, default=6)
    args = ap.parse_args()
    cols = ["fork", "loads", "commits", "state+close", "edge"]
    print(
        f"Per-edge knowledge cost (ms, median of {args.edges} chained edges; loads = 4 attempt loads, commits = 2)"
    )
    print(f"{'attempts':>8} {'mode':>7} " + " ".join(f"{c:>11}" for c in cols))
    with tempfile.TemporaryDirectory(prefix="sftree-kfork-") as tmp:
        for a in [int(x) for x in args.attempts.split(",")]:
            root = make_root(Path(tmp), a)
            for mode in ("before", "after"):
                r = run_tree(Path(tmp), root, args.edges, mode)
                print(f"{a:>8} {mode:>7} " + " ".join(f"{r[c]:>11.1f}" for c in cols))
            shutil.rmtree(root)
    print(f"\nmachine: {os.cpu_count()} CPUs, {sys.platform}, Python {sys.version.split()[0]}, "
          f"{git(['--version']).stdout.strip()}; tmp dir {tempfile.gettempdir()}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
