#!/usr/bin/env python3
"""Scheduling benchmark: full trees against teacher-sim with heavy-tailed latencies, async refill vs rounds,
and the share of prompt tokens SGLang's prefix cache would serve a fleet of such trees.

    python3 benchmarks/schedule.py [--widths 8] [--runs 3] [--ms-per-token 3] [--tail pareto:1.8]
                                   [--fleet 8] [--rooms 8,16,32] [--json OUT]

For each parallel width and schedule it grows --runs complete trees (the seed's default search parameters, seeds
--seed, --seed+1, ...) from the circle_packing example root, with the real edge runtime (git worktrees, `coral
eval`, the real grader) and a teacher-sim whose per-request latency is (tokens * ms-per-token) times a Pareto
draw. Reported per run, then as mean [min-max] over the runs:

- makespan: wall time of the search loop;
- utilization: total edge time / (width * makespan): the share of the reserved width that was busy;
- bound: the lower bound max(total edge time / width, longest parent-before-child chain of edge times (a root
  direction's fallback waits for its failed first try, and, root first, every edge below the root waits for the
  whole root layer), root layer time + edge time below the root / width), and makespan / bound;
- sim cache: teacher-sim's own estimate (every prefix this tree ever sent, never evicted).

Cache model (`sftree.teacher.kvcache`): every model call of the async runs at each width is recorded (prompt as a chain
of messages, reply, start and end time). A fleet of --fleet trees (the recorded runs, each replica's prompts made
distinct after the shared tools block; a replica of a tree already in the fleet runs 7% slower per copy) is
replayed through ONE finite LRU radix cache, as one SGLang server
serves them, with KV room for 8 / 16 / 32 average contexts (average context = mean prompt tokens of a call),
and at most K trees active at once (the rest wait, as `--resources teacher_trees=K` makes Snakemake do): the
share of prompt tokens served from the cache, and the peak number of calls in flight.

Width 1 is run once per seed: async and rounds are the same schedule there. Goals: async within 1.15x of the
bound at width 8; cache share >= 0.9 for 8 trees at KV room for 16 average contexts. One width-8 tree takes
1-2 minutes on 2 cores; results and their reading are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from sftree.agents.native import assistant_message  # noqa: E402
from sftree.config import load_config  # noqa: E402
from sftree.runtime.workspace import NodeState  # noqa: E402
from sftree.search import mcts  # noqa: E402
from sftree.search import tree as treemod  # noqa: E402
from sftree.search.edge import EdgeContext, run_edge  # noqa: E402
from sftree.settings import settings_of  # noqa: E402
from sftree.teacher import kvcache  # noqa: E402
from sftree.world.task import task_config  # noqa: E402

TASK = "circle_packing"


def make_root(tmp: Path) -> Path:
    root = tmp / "roots" / "eval-000010-agent-1-000000000000"
    shutil.copytree(REPO / "examples" / TASK / "seed", root / "code")
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


def record_calls(teacher, t0: float, calls: list, lock: threading.Lock) -> None:
    """Wrap the client's chat so every model call is kept for the cache model (times relative to t0)."""
    chat = teacher.chat

    def recorded(messages, tools=None, *, headers=None):
        start = time.monotonic()
        comp = chat(messages, tools, headers=headers)
        call = (start - t0, time.monotonic() - t0, list(messages), tools, assistant_message(comp.message),
                comp.usage.prompt_tokens, comp.usage.cached_tokens)  # fmt: skip
        with lock:
            calls.append(call)
        return comp

    teacher.chat = recorded


def run_tree(work: Path, width: int, schedule: str, args, seed: int) -> dict:
    root = make_root(work)
    out = work / "tree"
    overrides = {
        "tasks": {
            TASK: {
                "coral_task": str(REPO / "examples" / TASK),
                "grader_timeout": 60,
            }
        },  # fmt: skip
        "results": str(work / "results"),
        "teacher": {
            "sim": {"seed": seed, "latency_ms_per_token": args.ms_per_token, "latency_tail": args.tail},
            "retries": 2,
            "health_timeout": 10,
        },  # fmt: skip
        "agent": {"sandbox": args.sandbox, "max_steps_per_turn": 12},
        "search": {"parallel_width": width, "schedule": schedule, "seed": seed},
    }
    config = load_config(REPO / "config.yaml", overrides)
    config["tasks"] = {TASK: overrides["tasks"][TASK]}
    settings = settings_of(config)
    tcfg = task_config(settings, TASK)
    ctx = EdgeContext.create(out, root, settings, tcfg)
    params = settings.search
    tree = treemod.Tree.new(TASK, root.name, "maximize", params, 1.30, ctx.root_state.to_dict(), 10)
    times: dict[str, tuple[float, float]] = {}
    lock = threading.Lock()
    calls: list = []
    t0 = time.monotonic()
    record_calls(ctx.teacher, t0, calls, lock)

    def run_one(d: mcts.Dispatch):
        s = time.monotonic()
        r = run_edge(ctx, NodeState.from_dict(d.parent_state), d.edge, d.parent_score, depth=d.depth,
                     attempt=d.attempt, eval_count=d.parent_eval_count or 0)  # fmt: skip
        with lock:
            times[d.edge] = (s, time.monotonic())
        return r

    try:
        mcts.run_search(tree, run_one, lambda t: treemod.save(t, out / "tree.live.json"))
    finally:
        makespan = time.monotonic() - t0
        ctx.close()
    dur = {e: b - a for e, (a, b) in times.items()}
    total = sum(dur.values())
    chain = longest_chain(tree, dur)
    bound = max(total / width, chain, root_layer_bound(tree, dur, width))
    prompt = sum(c[5] for c in calls)
    cached = sum(c[6] for c in calls)
    c = tree.counters()
    return {
        "width": width,
        "schedule": schedule,
        "seed": seed,
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
        "sim_cache": round(cached / prompt, 4) if prompt else None,
        "prompt_tokens": prompt,
        "calls": calls,
    }


def table(rows: list[dict]) -> str:
    cols = ["width", "schedule", "seed", "edges", "good_leaves", "stop", "makespan_s", "mean_edge_s", "chain_s",
            "bound_s", "vs_bound", "utilization", "sim_cache"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """Mean [min-max] over the runs of each width and schedule."""

    def spread(vals: list[float]) -> str:
        return f"{statistics.mean(vals):.3f} [{min(vals):.3f}-{max(vals):.3f}]"

    lines = [
        "| width | schedule | runs | makespan_s | vs_bound | utilization | idle width |",
        "|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["width"], r["schedule"]), []).append(r)
    for (width, schedule), rs in groups.items():
        util = [r["utilization"] for r in rs]
        lines.append(
            f"| {width} | {schedule} | {len(rs)} | {spread([r['makespan_s'] for r in rs])} | "
            f"{spread([r['vs_bound'] for r in rs])} | {spread(util)} | {1 - statistics.mean(util):.0%} |"
        )
    return "\n".join(lines)


def fleet_calls(traces: list[list], fleet: int, active: int) -> list[kvcache.Call]:
    """`fleet` trees replayed from the recorded traces, at most `active` at once (the next starts when one ends)."""
    out: list[kvcache.Call] = []
    free = [0.0] * active  # when each active slot frees up
    for j in range(fleet):
        trace = traces[j % len(traces)]
        start = heapq.heappop(free)
        salt = f"tree-{j}"
        # replicas of one recorded tree run slower by 7% per copy, so they do not move in lockstep
        stretch = 1 + 0.07 * (j // len(traces))
        end = start
        for t0, t1, messages, tools, reply, _, _ in trace:
            prompt = kvcache.chain(messages, tools, salt)
            a, b = start + stretch * t0, start + stretch * t1
            out.append(kvcache.Call(a, b, tuple(prompt), kvcache.extend(prompt, reply)))
            end = max(end, b)
        heapq.heappush(free, end)
    return out


def fleet_table(traces: list[list], fleet: int, rooms: list[int], width: int) -> str:
    lines = [
        "| width | trees | active at once | peak calls in flight | "
        + " | ".join(f"room {k} ctx" for k in rooms)
        + " | unbounded | fleet makespan s |",
        "|---|---|---|---|" + "---|" * len(rooms) + "---|---|",
    ]
    actives = sorted({a for a in (fleet, fleet // 2, fleet // 4, 1) if a >= 1}, reverse=True)
    for active in actives:
        calls = fleet_calls(traces, fleet, active)
        avg = statistics.mean(c.prompt_tokens for c in calls)
        shares = [kvcache.replay(calls, k * avg) for k in rooms]
        unbounded = kvcache.replay(calls, float("inf"))
        makespan = max(c.end for c in calls)
        lines.append(
            f"| {width} | {fleet} | {active} | {unbounded.peak_in_flight} | "
            + " | ".join(f"{r.share:.3f}" for r in shares)
            + f" | {unbounded.share:.3f} | {makespan:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[8])
    ap.add_argument("--schedules", nargs="+", default=["async", "rounds"], choices=["async", "rounds"])
    ap.add_argument(
        "--runs", type=int, default=3, help="trees per width and schedule (seeds seed, seed+1, ...)"
    )
    ap.add_argument("--ms-per-token", type=float, default=3.0, help="teacher-sim latency per token")
    ap.add_argument("--tail", default="pareto:1.8", help="heavy-tailed latency multiplier")
    ap.add_argument("--sandbox", default="none", choices=["none", "bwrap", "auto"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fleet", type=int, default=8, help="trees sharing one server in the cache model")
    ap.add_argument("--rooms", default="8,16,32", help="KV room in average contexts")
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="sftree-bench-") as tmp:
        for width in args.widths:
            for schedule in args.schedules if width > 1 else args.schedules[:1]:
                for run in range(args.runs):
                    work = Path(tmp) / f"w{width}-{schedule}-{run}"
                    t = time.monotonic()
                    rows.append(run_tree(work, width, schedule, args, args.seed + run))
                    shown = {k: v for k, v in rows[-1].items() if k != "calls"}
                    print(f"width {width:2d} {schedule:6s} run {run}: {shown} ({time.monotonic() - t:.0f}s)",
                          file=sys.stderr)  # fmt: skip
                    shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    print()
    print(summary(rows))
    rooms = [int(x) for x in args.rooms.split(",")]
    for width in args.widths:
        traces = [r["calls"] for r in rows if r["width"] == width and r["schedule"] == "async"]
        if traces:
            print()
            print(fleet_table(traces, args.fleet, rooms, width))
    if args.json:
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "calls"} for r in rows],
                                              indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
