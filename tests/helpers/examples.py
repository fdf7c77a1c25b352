"""Generate the example Student run once per test session and share it (read-only) between tests.

    from helpers.examples import example_snapshots
    snaps = example_snapshots(tmp_path_factory, count=40)   # -> Path with circle_packing/ and tsp/ inside

The folders are made by the real `scripts/make_example_snapshots.py` (real graders) and cached per
(count, seed, tasks) for the session. Treat them as read-only: copy a task folder first if a test changes it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "make_example_snapshots.py"
EXAMPLES = REPO / "examples"
TASKS = ("circle_packing", "tsp")

_cache: dict[tuple, Path] = {}


def example_snapshots(
    tmp_path_factory, count: int = 40, seed: int = 0, tasks: tuple[str, ...] = TASKS
) -> Path:
    """The snapshot folder (<dir>/<task>/eval-*) of a simulated run; generated on first use in this session."""
    key = (count, seed, tuple(tasks))
    if key not in _cache:
        out = tmp_path_factory.mktemp(f"snapshots-{count}-{seed}")
        cmd = [
            sys.executable,
            str(SCRIPT),
            "--out",
            str(out),
            "--seed",
            str(seed),
            "--count",
            str(count),
            "--tasks",
            ",".join(tasks),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"make_example_snapshots failed:\n{proc.stdout}\n{proc.stderr}")
        _cache[key] = out
    return _cache[key]


def task_config(snapshots: Path, num_roots: int = 10) -> dict:
    """A minimal workflow config for the example tasks reading `snapshots`."""
    return {
        "snapshots": str(snapshots),
        "results": "results",
        "tasks": {
            "circle_packing": {
                "coral_task": str(EXAMPLES / "circle_packing"),
            },
            "tsp": {
                "coral_task": str(EXAMPLES / "tsp"),
            },
        },
        "select_roots": {"num_roots": num_roots},
    }
