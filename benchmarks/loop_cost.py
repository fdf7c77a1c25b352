"""Benchmark the search loop's own cost per edge as the tree grows, and the step records' storage per step.

    python3 benchmarks/loop_cost.py [--sizes 10,100,500,1000] [--window 10] [--steps 10,100,500,1000]

Part 1 - loop cost per edge: the real `mcts.run_search` (ask/Select, begin, tell, stop rules, persistence
after every dispatch batch and every edge, parallel_width 8, async) with an in-process edge runner that returns
at once (so only the loop is measured; an edge record carries two turns with 400 characters of feedback each,
like a real one). One tree is grown to each size N unmeasured; from copies of that same tree the loop then runs
`--window` more edges in each mode, and the cost at N is their wall time divided by the window. Growing a
1000-edge tree the old way takes many minutes, which is why the sizes are reached unmeasured. Side by side:

- before: the tree rewritten in full (`tree.save`: JSON of every node and edge, fsync, rename) at every
  persist, and Select ranking each candidate against every node one by one (the previous `select_breakdowns`,
  kept below);
- after: `tree.LiveTree` (one fsynced log line with what changed; a snapshot when the log is as long as the
  tree has edges) and Select with rank tables sorted once per call.

Part 2 - step-record storage: one session of S model calls (each request = the previous one + the answer
+ a 1 KiB tool result), written inline (every request in full, as before) and by `steplog.StepWriter`
(each message once); bytes per step.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from sftree.records import steplog  # noqa: E402
from sftree.records.scores import best_of, regressed_rate  # noqa: E402
from sftree.records.tree import LIVE_NAME  # noqa: E402
from sftree.runtime.workspace import NodeState  # noqa: E402
from sftree.search import mcts, scoring  # noqa: E402
from sftree.search import tree as treemod  # noqa: E402
from sftree.search.edge import EdgeResult, TurnResult  # noqa: E402
from sftree.settings import SearchSettings, section_settings  # noqa: E402

print = functools.partial(print, flush=True)  # progress shows when piped


def old_select_breakdowns(tree, candidates):
    """Select as it was: every candidate ranked against every node one by one (O(nodes x candidates))."""
    d = tree.direction
    all_scores = [n.score for n in tree.nodes]
    all_bests = [n.path_best_score for n in tree.nodes]
    active_tokens = [n.max_token_total for n in candidates]
    out = {}
    for n in candidates:
        sr = scoring.score_rank(n.score, all_scores, d)
        br = scoring.best_rank(n.path_best_score, all_bests, d)
        pr = scoring.process([e.soft for e in tree.path_edges(n.id)])
        q = scoring.q_value(sr, br, pr)
        t = scoring.token_reward(n.max_token_total, active_tokens)
        out[n.id] = {"node": n.id, "score_rank": sr, "best_rank": br, "process": pr, "Q": q, "T": t,
                     "select": scoring.select_value(q, t, tree.params.alpha)}  # fmt: skip
    return out


def stub_runner(seed: int = 0):
    """An edge that returns at once: scores around the parent's, a few failures, growing contexts."""
    rng = random.Random(seed)
    feedback = "grader: " + "x" * 392

    def run(d: mcts.Dispatch) -> EdgeResult:
        base = d.parent_score or 1.0
        s1, s2 = (None if rng.random() < 0.08 else base + rng.uniform(-0.3, 0.4) for _ in "ab")
        calls = rng.randint(4, 12)
        errors = rng.choice([0, 0, 0, 1, calls])
        tokens = rng.randint(2000, 12000) * d.depth
        turns = [TurnResult(i + 1, s, "improved" if s is not None else None, f"{d.edge}{i}" * 4, 4, calls // 2,
                            errors // 2, True, tokens // (2 - i), "eval" if s is not None else "no_eval", feedback, i + 1)
                 for i, s in enumerate((s1, s2))]  # fmt: skip
        return EdgeResult(
            edge_id=d.edge, turns=turns, score=best_of([s1, s2], "maximize"), valid=None not in (s1, s2),
            steps=8, tool_calls=calls, tool_errors=errors, tool_error_rate=errors / calls, tokens=tokens,
            knowledge=True, regressed_rate=regressed_rate(d.parent_score, [s1, s2], "maximize"),
            child_state=NodeState("c" * 40, "k" * 40, f"sessions/{d.edge}.json"),
            transcript=f"edges/{d.edge}/steps.jsonl", code_diff=f"edges/{d.edge}/code.diff",
            knowledge_diff=f"edges/{d.edge}/knowledge.diff", error=None, wall_s=30.0, evals=2,
        )  # fmt: skip

    return run


class _Enough(Exception):
    """Raised from the persist callback to stop the loop at a given edge count (the tree stays running)."""


def new_tree() -> treemod.Tree:
    params = section_settings(SearchSettings, {
        "root_children": 3, "max_children": 4, "max_depth": 12, "hard_token_limit": 10**9,
        "target_good_leaves": 10**6, "max_valid_edges": 10**6, "max_failed_expansions": 3, "parallel_width": 8,
    })  # fmt: skip
    return treemod.Tree.new("t", "eval-000001-agent-1-abc", "maximize", params, 1.0,
                            {"code_commit": "c" * 40, "knowledge_commit": "k" * 40, "session": None}, 5)  # fmt: skip


def run_until(tree: treemod.Tree, edges: int, persist, runner) -> list[float]:
    """Run the real loop until `edges` edges are finished; the finish time of each edge after the start."""
    finished: list[float] = []
    t0 = time.perf_counter()

    def on_persist(t):
        persist(t)
        if len(t.edges) > len(finished) + start:
            finished.append(time.perf_counter() - t0)
        if len(t.edges) >= edges:
            raise _Enough

    start = len(tree.edges)
    try:
        mcts.run_search(tree, runner, on_persist)
    except _Enough:
        pass
    tree.in_flight = []  # dispatched but never told: dropped, as a resumed run does
    return finished


def window_cost(tree: treemod.Tree, out: Path, window: int, mode: str, runner) -> float:
    """ms per edge of the next `window` edges grown on (a copy of) `tree` with the given persistence/Select."""
    tree = copy.deepcopy(tree)
    saved = mcts.select_breakdowns
    if mode == "before":
        path = out / LIVE_NAME
        persist = functools.partial(treemod.save, path=path)
        mcts.select_breakdowns = old_select_breakdowns
    else:
        live = treemod.LiveTree(out)
        live.save(tree)  # the snapshot a run takes once (and then every ~edges lines): not in the window
        persist = live.save
    try:
        times = run_until(tree, len(tree.edges) + window, persist, runner)
    finally:
        mcts.select_breakdowns = saved
    return 1000 * times[-1] / len(times)


def session_bytes(steps: int, tmp: Path) -> tuple[float, float]:
    msgs = [{"role": "system", "content": "s" * 2000}, {"role": "user", "content": "task " * 100}]
    records = []
    for i in range(steps):
        resp = {"role": "assistant", "content": f"step {i}",
                "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}  # fmt: skip
        records.append({"turn": 1, "step": i + 1, "kind": "agent", "request": {"model": "m", "messages": list(msgs)},
                        "response": resp, "tool_results": [{"tool_call_id": f"c{i}", "content": "o" * 1024}]})  # fmt: skip
        msgs += [resp, {"role": "tool", "tool_call_id": f"c{i}", "content": "o" * 1024}]
    inline = sum(len(json.dumps(r, ensure_ascii=False)) + 1 for r in records)
    d = tmp / f"steps{steps}"
    w = steplog.StepWriter(d / "steps.jsonl")
    for r in records:
        w.write(r)
    w.close()
    stored = sum(f.stat().st_size for f in d.iterdir())
    assert steplog.read_steps(d / "steps.jsonl") == records
    return inline / steps, stored / steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,100,500,1000")
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--steps", default="10,100,500,1000")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="sftree-loop-") as tmp:
        print(f"Loop cost per edge (ms, mean of the {args.window} edges after the N-th; width 8, async)")
        print(f"{'edges':>6} {'before':>9} {'after':>9} {'before/after':>13}")
        tree, runner = new_tree(), stub_runner()
        for n in sizes:
            run_until(tree, n, lambda t: None, runner)  # grow to N (not measured)
            cost = {}
            for mode in ("before", "after"):
                d = Path(tmp) / f"{mode}{n}"
                d.mkdir()
                cost[mode] = window_cost(tree, d, args.window, mode, stub_runner(n))
            b, a = cost["before"], cost["after"]
            print(f"{n:>6} {b:>9.2f} {a:>9.2f} {b / a:>12.1f}x")
        print()
        print("Step-record storage per model call (bytes) for one session of S calls")
        print(f"{'S':>6} {'inline':>12} {'stored once':>12} {'ratio':>7}")
        for s in [int(x) for x in args.steps.split(",")]:
            inline, stored = session_bytes(s, Path(tmp))
            print(f"{s:>6} {inline:>12.0f} {stored:>12.0f} {inline / stored:>6.1f}x")
    print(
        f"\nmachine: {os.cpu_count()} CPUs, {sys.platform}, Python {sys.version.split()[0]}; tmp dir {tempfile.gettempdir()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
