"""Benchmark one small tree against a real model (llama-server) beside teacher-sim on the same tree shape.

    python3 benchmarks/real_teacher.py [--edges-per-level 2] [--sandbox auto]

Tree shape: `--edges-per-level` edges from the root, then one edge forked from the first child (a fork resends
its parent's session, so the server's prefix cache has something to reuse). Teachers, in one run: the real
model (`teacher.launch` defaults, `tool_choice: required`, examples/real.yaml's agent limits) and teacher-sim
(seed 0) with the same config. Per Teacher, from the server's own usage in the step records: cached / prompt
tokens, completion tokens per second of model time; per edge: wall time, model time, grader time and the
framework's share (wall - model - grader: forks, bwrap, the coral client, git, transcripts, other tools).
"""

from __future__ import annotations

import argparse
import copy
import logging
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from sftree.config import load_config  # noqa: E402
from sftree.records import steplog  # noqa: E402
from sftree.search.edge import EdgeContext, run_edge  # noqa: E402
from sftree.settings import settings_of  # noqa: E402
from sftree.teacher.llm_server import LaunchSpec  # noqa: E402
from sftree.world.task import task_config  # noqa: E402


def grow(cfg: dict, tmp: Path, per_level: int) -> list[dict]:
    """Run the tree shape; one row per edge (EdgeResult figures + the usage sums of its step records)."""
    settings = settings_of(cfg)
    task = task_config(settings, "circle_packing")
    root = tmp / "root"
    shutil.copytree(REPO / "examples" / "circle_packing" / "seed", root / "code")
    (root / "shared" / "notes").mkdir(parents=True)
    tree_dir = tmp / "tree"
    ctx = EdgeContext.create(tree_dir, root, settings, task)
    rows = []
    try:
        plan = [(f"e{i + 1}", None) for i in range(per_level)] + [(f"e{per_level + 1}", "e1")]
        states = {}
        for eid, parent in plan:
            pstate = states[parent] if parent else ctx.root_state
            r = run_edge(ctx, pstate, eid, None, depth=2 if parent else 1, attempt=1, eval_count=0)
            states[eid] = r.child_state
            steps = steplog.read_steps(tree_dir / "edges" / eid / "steps.jsonl")
            usage = [s["usage"] for s in steps if s.get("usage")]
            rows.append(
                {
                    "edge": eid,
                    "fork": parent or "root",
                    "steps": r.steps,
                    "wall": r.wall_s,
                    "model": r.teacher_s,
                    "grader": r.grader_s,
                    "framework": r.framework_s,
                    "prompt": sum(u["prompt_tokens"] for u in usage),
                    "cached": sum(u["cached_tokens"] for u in usage),
                    "completion": sum(u["completion_tokens"] for u in usage),
                    "score": r.score,
                }
            )
    finally:
        ctx.close()
    return rows


def table(name: str, rows: list[dict]) -> None:
    print(f"\n{name}")
    print(
        f"{'edge':>4} | {'from':>4} | {'steps':>5} | {'wall s':>7} | {'model s':>7} | {'grader s':>8} | "
        f"{'fw s':>5} | {'fw share':>8} | {'cached/prompt':>17} | {'tok/s':>6} | score"
    )
    print("-" * 104)
    tot = {
        k: 0.0 for k in ("steps", "wall", "model", "grader", "framework", "prompt", "cached", "completion")
    }
    for r in rows + [None]:
        if r is None:
            r = {"edge": "all", "fork": "", "score": "", **tot}
        else:
            for k in tot:
                tot[k] += r[k]
        share = 100 * r["framework"] / r["wall"] if r["wall"] else 0.0
        tps = r["completion"] / r["model"] if r["model"] else 0.0
        cp = f"{int(r['cached'])}/{int(r['prompt'])} ({100 * r['cached'] / max(r['prompt'], 1):.0f}%)"
        score = f"{r['score']:.4g}" if isinstance(r["score"], float | int) else str(r["score"] or "-")
        print(
            f"{r['edge']:>4} | {r['fork']:>4} | {int(r['steps']):>5} | {r['wall']:>7.2f} | {r['model']:>7.2f} | "
            f"{r['grader']:>8.2f} | {r['framework']:>5.2f} | {share:>7.1f}% | {cp:>17} | {tps:>6.1f} | {score}"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--edges-per-level", type=int, default=2)
    p.add_argument("--sandbox", default="auto")
    a = p.parse_args()
    logging.disable(logging.WARNING)
    why = LaunchSpec.from_config({}).missing()
    if why:
        print(f"real_teacher: {why}", file=sys.stderr)
        return 2
    base = load_config(REPO / "examples" / "real.yaml")
    base["agent"]["sandbox"] = a.sandbox
    real = copy.deepcopy(base)
    sim = copy.deepcopy(base)
    sim["teacher"]["launch"] = None
    sim["teacher"]["sim"] = {"seed": 0}
    for name, cfg in (
        ("llama-server (SmolLM2-135M-Instruct Q4_1, CPU)", real),
        ("teacher-sim (seed 0)", sim),
    ):
        with tempfile.TemporaryDirectory(prefix="sftree-bench-") as tmp:
            table(name, grow(cfg, Path(tmp), a.edges_per_level))
    return 0


if __name__ == "__main__":
    sys.exit(main())
