"""Benchmark the framework's own time per rollout turn, the `native` and the `opencode` backend side by side.

    python3 benchmarks/turn_cost.py [--runs 3] [--edges 2] [--task circle_packing] [--prev REV]

Each run grows, per backend, a parent edge from the root and `--edges` - 1 children below it, one edge at a time
(`search.edge.run_edge`, as an explore job runs them), with teacher-sim behind the Teacher client (OpenCode: behind
the recording proxy), in the sandbox explore uses (`agent.sandbox: auto`). The backends alternate within a run
(their order rotates from run to run), so all see the same load. `--prev REV` adds `opencode@REV`: the opencode
backend of git revision REV (its whole tree, `git archive`), measured by this script in a child process on
REV's `src/` and `tests/`, same seed, inside the same rotation. Per turn:

    framework = turn wall time - the Teacher's time (the step records' latency_s) - grading (`coral eval`'s
                grader run, timed around CoralRuntime._grade)

i.e. what sftree and the agent runtime add: OpenCode's start, its session store, the sandbox, tool calls, the
host's commits. The table gives, over every turn of every run, the median, the mean (= per edge / 2) and the
maximum, the median steps per turn, and each backend's ratio to `native` (medians, from the same run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# --tree DIR: run on another checkout's code (the child process of --prev)
_TREE = Path(sys.argv[sys.argv.index("--tree") + 1]) if "--tree" in sys.argv else REPO
sys.path.insert(0, str(_TREE / "src"))
sys.path.insert(0, str(_TREE / "tests"))

from helpers.runtime import config, example_task, make_root  # noqa: E402

from sftree.search.edge import EdgeContext, run_edge  # noqa: E402
from sftree.settings import settings_of  # noqa: E402
from sftree.world import coral_command as coral_runtime  # noqa: E402

GRADING: list[float] = []


def _timed_grade():
    real = coral_runtime.CoralRuntime._grade

    def grade(self, *a, **k):
        t = time.monotonic()
        try:
            return real(self, *a, **k)
        finally:
            GRADING.append(time.monotonic() - t)

    coral_runtime.CoralRuntime._grade = grade


def one_backend(backend: str, edges: int, task: str, seed: int, tmp: Path) -> list[dict]:
    """Per turn: wall, teacher, grading, framework seconds and steps."""
    cfg = config(
        teacher={"sim": {"seed": seed}},
        agent={"backend": backend, "max_steps_per_turn": 12, "turn_timeout": 240},
    )
    ctx = EdgeContext.create(
        tmp / backend / "tree", make_root(tmp / backend, task), settings_of(cfg), example_task(cfg, task)
    )
    rows = []
    try:
        state, score = ctx.root_state, 1.0
        real_run_turn = ctx.agent.run_turn

        def timed(run):
            g0, t0, lat0 = len(GRADING), time.monotonic(), run.recorder.latency_s
            out = real_run_turn(run)
            wall = time.monotonic() - t0
            teacher = run.recorder.latency_s - lat0
            grading = sum(GRADING[g0:])
            rows.append({"wall": wall, "teacher": teacher, "grading": grading,
                         "framework": wall - teacher - grading, "steps": out.steps})  # fmt: skip
            return out

        ctx.agent.run_turn = timed
        for i in range(edges):
            res = run_edge(ctx, state, f"e{i + 1}", score, depth=i + 1, attempt=1, eval_count=5 + 2 * i)
            if res.error:
                raise RuntimeError(f"{backend} edge e{i + 1}: {res.error}")
            state, score = res.child_state, res.score if res.score is not None else score
    finally:
        ctx.close()
    return rows


def prev_rows(rev: str, edges: int, task: str, seed: int, tmp: Path) -> list[dict]:
    """Revision `rev`'s opencode backend, one run: this script in a child process on rev's own tree."""
    tree = tmp / f"prev-{rev}"
    if not tree.is_dir():
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    from sftree.agents.opencode import find_binary
    from sftree.settings import AgentSettings, section_settings

    binary = find_binary(section_settings(AgentSettings, {}).opencode.binary)
    env = {**os.environ, "SFTREE_OPENCODE_BIN": binary}  # rev's tree has no .tools/ of its own
    argv = [sys.executable, str(Path(__file__).resolve()), "--tree", str(tree), "--one", "opencode"]
    argv += ["--edges", str(edges), "--task", task, "--seed", str(seed)]
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"opencode@{rev}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--edges", type=int, default=2, help="edges per backend per run (a chain: each forks the last)"
    )
    ap.add_argument("--task", default="circle_packing")
    ap.add_argument("--prev", default="", help="git revision whose opencode backend is measured beside")
    ap.add_argument("--tree", default="", help=argparse.SUPPRESS)
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # one backend, one run: rows as JSON
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    _timed_grade()
    if args.one:
        with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
            print(json.dumps(one_backend(args.one, args.edges, args.task, seed=args.seed, tmp=Path(tmp))))
        return 0
    backends = ["native", "opencode"] + ([f"opencode@{args.prev}"] if args.prev else [])
    per: dict[str, list[dict]] = {b: [] for b in backends}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as keep:
        for run in range(args.runs):
            k = run % len(backends)
            for backend in backends[k:] + backends[:k]:
                with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
                    if backend.startswith("opencode@"):
                        rows = prev_rows(args.prev, args.edges, args.task, run, Path(keep))
                    else:
                        rows = one_backend(backend, args.edges, args.task, seed=run, tmp=Path(tmp))
                per[backend] += rows
                fw = [r["framework"] for r in rows]
                print(f"run {run + 1}/{args.runs} {backend:8s}: {len(rows)} turns, framework per turn "
                      f"{statistics.median(fw):.2f} s median", file=sys.stderr, flush=True)  # fmt: skip
    print(f"\nPer rollout turn, {args.runs} runs x {args.edges} edges x 2 turns per backend (seconds):\n")
    print("| backend | turns | steps/turn | wall median | Teacher median | grading median | framework median "
          "| framework mean | framework max | / native |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = statistics.median(r["framework"] for r in per["native"])
    for backend, rows in per.items():
        m = lambda k, rows=rows: statistics.median(r[k] for r in rows)  # noqa: E731
        mean = statistics.mean(r["framework"] for r in rows)
        print(f"| {backend} | {len(rows)} | {m('steps'):.0f} | {m('wall'):.2f} | {m('teacher'):.3f} | "
              f"{m('grading'):.2f} | {m('framework'):.2f} | {mean:.2f} | "
              f"{max(r['framework'] for r in rows):.2f} | {m('framework') / base:.1f}x |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
