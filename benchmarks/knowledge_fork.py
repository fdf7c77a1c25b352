"""Benchmark the per-edge cost of shared knowledge as the root's attempt records grow.

    python3 benchmarks/knowledge_fork.py [--attempts 100,1000,10000] [--edges 6] [--shape chain|branches]
        [--modes after,prev --prev REV]

A root snapshot whose `shared/attempts/` holds A attempt records (about 600 bytes each, like Coral's) and a few
notes. Each edge does what `run_edge` does with knowledge, in order: fork the node (the code, the knowledge and the
attempt records written from the store, as root owned by a sandbox uid), two turns that each build the turn
prompt from the host's records, write the eval's attempt record (`coral eval`) and a note (the agent), and commit
the knowledge; the final state (knowledge commit + refs); close. `--shape chain`: each edge forks the previous
edge's child; `--shape branches`: edges alternate between two branches, so each fork's attempt records differ by
the other branch's. The first edge of each branch is not counted (nothing parked to reuse yet).

Side by side in one run:
- after: this code (the host boundary: the host reads the knowledge itself, by a walk with a stat cache; a fork
  writes a fresh folder, and moves a parked attempts folder, which only the host writes, by the tree difference);
- prev: the same work on git revision `--prev`, measured by that revision's own copy of this benchmark (its
  `src/` and this file exported with `git archive`, run in a child process with `--modes after`), so the code
  before a change is measured in the same run, on the same machine, the way it ran then.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from sftree.runtime.store import TreeStore  # noqa: E402
from sftree.world.counters import CoralCounters, advance  # noqa: E402
from sftree.world.task import load_task  # noqa: E402
from sftree.world.world import World  # noqa: E402

WORLD = World(
    load_task({"grader": "true", "direction": "maximize"}, "bench"), agent_id="agent-1"
)  # stand-ins

COLS = ["fork", "loads", "commits", "state+close", "edge"]
# As root, what the agent may change belongs to an unprivileged sandbox uid (TreeStore.fork(uid=...)).
HAND_UID = 200_999 if os.geteuid() == 0 else None


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


def one_edge(store: TreeStore, state, edge_id: str, n: int, counters: CoralCounters) -> tuple[object, dict]:
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    ws = store.fork(state, edge_id, agent_id="agent-1", inside="/workspace/results/bench", uid=HAND_UID)
    t["fork"] = time.perf_counter() - t0
    load = commit = 0.0
    for turn in (1, 2):
        sha = f"{n:036x}{turn:04x}"
        record = {"commit_hash": sha, "agent_id": "agent-1", "title": "t", "score": 1.0, "status": "improved"}
        t1 = time.perf_counter()
        WORLD.turn_prompt(counters, record)  # the turn prompt (heartbeats) from the host's counters
        counters = advance(counters, record, "maximize")
        load += time.perf_counter() - t1
        t1 = time.perf_counter()
        ws.write_attempt(sha, json.dumps({"commit_hash": sha, "score": 1.0, "timestamp": "2027"}).encode())
        commit += time.perf_counter() - t1
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


def run_tree(tmp: Path, root: Path, edges: int, shape: str = "chain") -> dict[str, float]:
    store, state = TreeStore.create(tmp / f"tree-{root.name}-{time.monotonic_ns()}", root, {})
    times: list[dict[str, float]] = []
    tips = [state, state]  # two branches: `branches` alternates between them
    for i in range(edges + 1 + (shape == "branches")):
        if shape == "branches":  # fork the tip of the other branch than the last edge's
            state = tips[i % 2]
        child, t = one_edge(store, state, f"e{i + 1}", i, CoralCounters("agent-1", global_evals=10 * i))
        tips[i % 2] = state = child
        if i > (shape == "branches"):  # the first edge(s) have nothing parked to reuse
            times.append(t)
    store.close()
    return {k: 1000 * statistics.median(t[k] for t in times) for k in times[0]}


def run_prev(tmp: Path, rev: str, attempts: int, edges: int, shape: str) -> dict[str, float]:
    """Revision `rev`'s own copy of this benchmark, mode `after`, on its own `src/` (a child process)."""
    src = tmp / f"prev-{rev}"
    if not src.is_dir():
        src.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", rev, "src", "benchmarks/knowledge_fork.py"],
            capture_output=True, check=True,
        )  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    out = subprocess.run(
        [sys.executable, str(src / "benchmarks" / "knowledge_fork.py"), "--src", str(src / "src"),
         "--attempts", str(attempts), "--edges", str(edges), "--modes", "after", "--shape", shape],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for line in out.splitlines():
        f = line.split()
        if (
            len(f) == 9 and f[0] == str(attempts) and f[1] == "after"
        ):  # its columns: fork handover loads commits
            fork, hand, loads, commits, close, edge = map(float, f[2:8])  # state+close edge sweeps
            return {
                "fork": fork + hand,
                "loads": loads,
                "commits": commits,
                "state+close": close,
                "edge": edge,
            }
    raise RuntimeError(f"no result row from the {rev} run:\n{out}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attempts", default="100,1000,10000")
    ap.add_argument("--edges", type=int, default=6)
    ap.add_argument("--modes", default="after")
    ap.add_argument("--shape", choices=["chain", "branches"], default="chain")
    ap.add_argument("--prev", default="", help="git revision measured as mode `prev` (with --modes ...,prev)")
    args = ap.parse_args()
    print(
        f"Per-edge knowledge cost (ms, median of {args.edges} edges, shape {args.shape}; loads = 2 turn prompts, "
        "commits = 2 attempt records + 2 knowledge commits; prev's fork includes its per-turn handover)"
    )
    print(f"{'attempts':>8} {'mode':>10} " + " ".join(f"{c:>11}" for c in COLS))
    with tempfile.TemporaryDirectory(prefix="sftree-kfork-") as tmp:
        for a in [int(x) for x in args.attempts.split(",")]:
            root = make_root(Path(tmp), a)
            for mode in args.modes.split(","):
                if mode == "prev":
                    r = run_prev(Path(tmp), args.prev or "HEAD", a, args.edges, args.shape)
                else:
                    r = run_tree(Path(tmp), root, args.edges, args.shape)
                print(f"{a:>8} {mode:>10} " + " ".join(f"{r[c]:>11.1f}" for c in COLS), flush=True)
            shutil.rmtree(root)
    git = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip()
    print(
        f"\nmachine: {os.cpu_count()} CPUs, {sys.platform}, Python {sys.version.split()[0]}, {git}; as uid {os.geteuid()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
