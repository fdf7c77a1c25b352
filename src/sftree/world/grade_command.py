"""A Coral task as a grader command, for the runtime's command form (until it calls `sftree.world.grading` itself):

    python -m sftree.world.grade_command --task NAME --task-dir DIR [--graded-can-read eval/F ...]
                                         [--coral-mode auto|coral|stand-in] [--coral-python PY] CODE_DIR

grades CODE_DIR with the task's own TaskGrader, confined (`SFTREE_SANDBOX`: auto|bwrap|none, as `coral eval` sets it),
and prints {"score": float|null, "feedback": str, "status", "budget_class"} on its last stdout line; exit 0. The
score comes from the grader's result pipe (sftree.world.grading), never from the graded program's output.
`sftree.config.task_config` fills a `coral_task` entry's `grader` with this command.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from sftree.errors import SftreeError


def command(name: str, task_dir: str, graded_can_read=(), coral: dict | None = None) -> str:
    """The command line (with the runtime's `{code_dir}` placeholder) for one task."""
    parts = [sys.executable, "-m", "sftree.world.grade_command", "--task", name, "--task-dir", str(task_dir)]
    for rel in graded_can_read or ():
        parts += ["--graded-can-read", rel]
    coral = coral or {}
    parts += ["--coral-mode", coral.get("mode") or "auto"]
    if coral.get("python"):
        parts += ["--coral-python", str(coral["python"])]
    if coral.get("grader_venv_cache"):
        parts += ["--grader-venv-cache", str(coral["grader_venv_cache"])]
    return " ".join(shlex.quote(p).replace("{", "{{").replace("}", "}}") for p in parts) + " {code_dir}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sftree.world.grade_command")
    p.add_argument("--task", required=True)
    p.add_argument("--task-dir", required=True)
    p.add_argument("--graded-can-read", action="append", default=[])
    p.add_argument("--coral-mode", default="auto")
    p.add_argument("--coral-python")
    p.add_argument("--grader-venv-cache")
    p.add_argument("--commit", default="0" * 40)
    p.add_argument("code_dir")
    a = p.parse_args(argv)
    from sftree.world.grading import grade
    from sftree.world.locate import locate
    from sftree.world.task import load_coral_task

    try:
        spec = load_coral_task(
            a.task_dir,
            a.task,
            {
                "graded_can_read": a.graded_can_read,
                "coral": {"grader_venv_cache": a.grader_venv_cache},
            },
        )
        install = locate({"mode": a.coral_mode, "python": a.coral_python})
        r = grade(
            spec,
            a.code_dir,
            commit=a.commit,
            install=install,
            sandbox=os.environ.get("SFTREE_SANDBOX") or "auto",
        )
        out = {"score": r.score, "feedback": r.feedback, "status": r.status, "budget_class": r.budget_class}
    except SftreeError as exc:
        out = {
            "score": None,
            "feedback": f"the task cannot be graded: {exc}",
            "status": "crashed",
            "budget_class": "grader_error",
        }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
