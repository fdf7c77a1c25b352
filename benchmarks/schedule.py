#!/usr/bin/env python3
"""Scheduling benchmark: full trees against teacher-sim with heavy-tailed latencies, async refill vs rounds.

    python3 benchmarks/schedule.py [--widths 1 4 8 16] [--ms-per-token 3] [--tail pareto:1.8] [--json OUT]

For each parallel width and schedule it grows one complete tree (the seed's default search parameters) from the
circle_packing example root, with the real edge runtime (git worktrees, `coral eval`, the real grader) and a
teacher-sim whose per-request latency is (tokens * ms-per-token) times a Pareto draw. Reported per run:

- makespan: wall time of the search loop;
- utilization: total edge time / (width * makespan);
- bound: the lower bound max(total edge time / width, longest parent-before-child chain of edge times (a root
  direction's fallback waits for its failed first try, and, root first, every edge below the root waits for the
  whole root layer), root layer time + edge time below the root / width), and makespan / bound;
- cache share: teacher-sim's cached_tokens / prompt_tokens over every request of the tree (what SGLang's radix
  cache could serve, since forked sessions resend their prefix byte for byte).

Width 1 is run once: async and rounds are the same schedule there. Goals: async within 1.15x of the bound at
width 8; cache share >= 0.9. About 10 minutes on 2 cores (the width-1 tree alone takes 3); results and their
reading are in docs/search.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from sftree import search  # noqa: E402
from sftree import tree as treemod  # noqa: E402
from sftree.config import load_config, task_config  # noqa: E402
from sftree.edge import EdgeContext, run_edge  # noqa: E402
from sftree.workspace import NodeState  # noqa: E402

TASK = "circle_packing"


def make_root(tmp: Path) -> Path:
    root = tmp / "roots" / "eval-000010-agent-1-000000000000"
    shutil.copytree(REPO / "examples" / TASK / "code", root / "code")
    for sub in ("notes", "attempts", "skills"):
        (root / "shared" / sub).mkdir(parents=True)
    (root / "shared" / "notes" / "student.md").write_text("# Student\nROWS = 5 did not help.\n")
    meta = {"task": TASK, "direction": "maximize", "score": 1.30, "eval_count": 10, "eval_ok": True}
    (root / "metadata.json").write_text(json.dumps(meta))
    return root


def longest_chain(tree: treemod.Tree, dur: dict[str, float]) -> float:
    """Longest sum of edge times along the search's dependencies: parent before child, a root fallback after its
    direction's first try, and (root first) every edge below the root after the whole root layer."""
    memo: dict[str, float] = {}
    root = tree.root_node.id
    root_edges = [e.id for e in tree.edges if e.parent == root]

    def before(e: treemod.Edge) -> float:
        if e.parent == root:
            first = [x for x in tree.edges if x.parent == root and x.slot == e.slot and x.attempt == 1]
            return chain(first[0].id) if e.attempt == 2 and first else 0.0
        if tree.node(e.parent).parent == root:  # depth 2: after every root edge (root first)
            return max(chain(x) for x in root_edges)
        return chain(tree.node(e.parent).edge)

    def chain(eid: str) -> float:
        if eid not in memo:
            memo[eid] = dur[eid] + before(tree.edge(eid))
        return memo[eid]

    return max((chain(e.id) for e in tree.edges), default=0.0)


def root_layer_bound(tree: treemod.Tree, dur: dict[str, float], width: int) -> float:
    """Root first: nothing below the root starts before the root layer ends (its longest try + fallback chain),
    and then the edges below the root need at least their total time / width."""
    root = tree.root_node.id
    root_edges = [e for e in tree.edges if e.parent == root]
    layer = 0.0
    for e in root_edges:
        first = [x for x in root_edges if x.slot == e.slot and x.attempt == 1 and e.attempt == 2]
        layer = max(layer, dur[e.id] + (dur[first[0].id] if first else 0.0))
    below = sum(dur[e.id] for e in tree.edges if e.parent != root)
    return layer + below / width


def cache_share(tree_dir: Path) -> tuple[int, int]:
    prompt = cached = 0
    for f in (tree_dir / "edges").glob("*/steps.jsonl"):
        for line in f.read_text().splitlines():
            u = json.loads(line).get("usage") or {}
            prompt += int(u.get("prompt_tokens") or 0)
            cached += int(u.get("cached_tokens") or 0)
    return cached, prompt


def run_tree(work: Path, width: int, schedule: str, args) -> dict:
    root = make_root(work)
    out = work / "tree"
    overrides = {
        "tasks": {
            TASK: {
                "direction": "maximize",
                "task_dir": str(REPO / "examples" / TASK),
                "grader": "python3 {task_dir}/grader.py {code_dir}",
                "grader_timeout": 60,
            }
        },  # fmt: skip
        "results": str(work / "results"),
        "teacher": {
            "sim": {"seed": args.seed, "latency_ms_per_token": args.ms_per_token, "latency_tail": args.tail},
            "retries": 2,
            "health_timeout": 10,
        },  # fmt: skip
        "agent": {"sandbox": args.sandbox, "max_steps_per_turn": 12},
        "search": {"parallel_width": width, "schedule": schedule, "seed": args.seed},
    }
    config = load_config(REPO / "config.yaml", overrides)
    config["tasks"] = {TASK: overrides["tasks"][TASK]}
    tcfg = task_config(config, TASK)
    ctx = EdgeContext.create(out, root, config, tcfg)
    params = treemod.SearchParams.from_config(config["search"])
    tree = treemod.Tree.new(TASK, root.name, "maximize", params, 1.30, ctx.root_state.to_dict(), 10)
    times: dict[str, tuple[float, float]] = {}
    lock = threading.Lock()
    t0 = time.monotonic()

    def run_one(d: search.Dispatch):
        s = time.monotonic()
        r = run_edge(ctx, NodeState.from_dict(d.parent_state), d.edge, d.parent_score, depth=d.depth,
                     attempt=d.attempt, eval_count=d.parent_eval_count or 0)  # fmt: skip
        with lock:
            times[d.edge] = (s, time.monotonic())
        return r

    try:
        search.run_search(tree, run_one, lambda t: treemod.save(t, out / "tree.live.json"))
    finally:
        makespan = time.monotonic() - t0
        ctx.close()
    dur = {e: b - a for e, (a, b) in times.items()}
    total = sum(dur.values())
    chain = longest_chain(tree, dur)
    bound = max(total / width, chain, root_layer_bound(tree, dur, width))
    cached, prompt = cache_share(out)
    c = tree.counters()
    return {
        "width": width,
        "schedule": schedule,
        "edges": c["edges"],
        "valid_edges": c["valid_edges"],
        "good_leaves": c["good_leaves"],
        "stop": tree.stop_reason,
        "makespan_s": round(makespan, 2),
        "total_edge_s": round(total, 2),
        "mean_edge_s": round(total / max(1, len(dur)), 2),
        "chain_s": round(chain, 2),
        "bound_s": round(bound, 2),
        "vs_bound": round(makespan / bound, 3) if bound else None,
        "utilization": round(total / (width * makespan), 3),
        "cache_share": round(cached / prompt, 4) if prompt else None,
        "prompt_tokens": prompt,
    }


def table(rows: list[dict]) -> str:
    cols = ["width", "schedule", "edges", "good_leaves", "stop", "makespan_s", "mean_edge_s", "chain_s", "bound_s",
            "vs_bound", "utilization", "cache_share"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--schedules", nargs="+", default=["async", "rounds"], choices=["async", "rounds"])
    ap.add_argument("--ms-per-token", type=float, default=3.0, help="teacher-sim latency per token")
    ap.add_argument("--tail", default="pareto:1.8", help="heavy-tailed latency multiplier")
    ap.add_argument("--sandbox", default="none", choices=["none", "bwrap", "auto"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="sftree-bench-") as tmp:
        for width in args.widths:
            for schedule in args.schedules if width > 1 else args.schedules[:1]:
                work = Path(tmp) / f"w{width}-{schedule}"
                t = time.monotonic()
                rows.append(run_tree(work, width, schedule, args))
                print(
                    f"width {width:2d} {schedule:6s}: {rows[-1]} ({time.monotonic() - t:.0f}s)",
                    file=sys.stderr,
                )
                shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
