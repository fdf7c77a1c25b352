#!/usr/bin/env python3
"""A packaged grader's venv for a run of N trees: built once, found by every later tree (sftree.world.grader_env).

    nice python3 benchmarks/grader_venv.py [--task examples/tsp] [--trees 8] [--world coral,stand-in]
                                          [--coral-python .venv-coral/bin/python]

Per world (the real Coral: Coral's own setup_grader_env, which installs Coral with its dependencies into the venv
first; the stand-in: sftree's steps with its stand-in `coral`), in a fresh empty cache:

- build: the workflow's `grader_env` rule (`grader_env.preflight`: build + entrypoint check), once;
- preflight again: the `grader_env` rule of a later run (the key hashed, `ready.json` found, the entrypoint
  checked again in the venv's Python), per tree;
- find: what each grade of each tree does first (`grader_env.ensure`: the key hashed, `ready.json` found);
- grade: one grade of the task's seed through the venv in the grading sandbox, per tree (the eval itself, the
  find included).

The uv cache (~/.cache/uv) is whatever it is: warm after a first run, so a build is mostly linking from it.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from sftree.runtime.sandbox import bwrap_works  # noqa: E402
from sftree.world import grader_env  # noqa: E402
from sftree.world.grading import grade  # noqa: E402
from sftree.world.locate import locate  # noqa: E402
from sftree.world.task import load_coral_task  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default=str(REPO / "examples" / "tsp"))
    ap.add_argument("--trees", type=int, default=8)
    ap.add_argument("--world", default="coral,stand-in")
    ap.add_argument("--coral-python", default=str(REPO / ".venv-coral" / "bin" / "python"))
    a = ap.parse_args()
    task = Path(a.task).resolve()
    sandbox = "bwrap" if bwrap_works() else "none"
    print(f"task {task.name}, {a.trees} trees, sandbox {sandbox}")
    print(
        f"{'world':9} {'build s':>8} {'preflight s':>12} {'find s':>8} {'grade s':>8}  venv MiB  (median per tree)"
    )
    for world in a.world.split(","):
        install = locate({"mode": "coral", "python": a.coral_python}) if world == "coral" else None
        with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="sftree-venv-bench-") as tmp:
            cfg = {"coral": {"grader_venv_cache": str(Path(tmp) / "cache")}}
            spec = load_coral_task(task, task.name, cfg)
            t0 = time.monotonic()
            venv = grader_env.preflight(spec, install, Path(tmp) / "grader_setup.log")
            build = time.monotonic() - t0
            assert venv.built
            reuse, finds, grades = [], [], []
            for _ in range(a.trees):
                t0 = time.monotonic()
                again = grader_env.preflight(load_coral_task(task, task.name, cfg), install)
                reuse.append(time.monotonic() - t0)
                assert not again.built and again.path == venv.path
                t0 = time.monotonic()
                found = grader_env.ensure(spec, install)
                finds.append(time.monotonic() - t0)
                assert not found.built
                t0 = time.monotonic()
                r = grade(spec, task / "seed", commit="e" * 40, install=install, sandbox=sandbox)
                grades.append(time.monotonic() - t0)
                assert r.status == "scored", r.feedback
            size = sum(p.stat().st_size for p in venv.path.rglob("*") if p.is_file() and not p.is_symlink())
            print(
                f"{world:9} {build:8.2f} {statistics.median(reuse):12.3f} {statistics.median(finds):8.4f}"
                f" {statistics.median(grades):8.2f}  {size / 2**20:8.1f}"
            )
            shutil.rmtree(Path(tmp) / "cache", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
