"""Grade a code folder with a Coral task's own grader (its eval/grader.py TaskGrader), as sftree's grader.

    <.venv-coral/bin/python> grade_with_coral.py TASK_DIR CODE_DIR

Prints sftree's grader line, `{"score": float|null, "feedback": str}` (config key `tasks.<task>.grader`), so a
workflow on an imported Coral run grades the Teacher's commits the way Coral graded the Student's. Runs with the
Python Coral is installed in.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

from coral.config import CoralConfig
from coral.types import Task


def main() -> int:
    task_dir, code_dir = Path(sys.argv[1]).resolve(), str(Path(sys.argv[2]).resolve())
    config = CoralConfig.from_yaml(task_dir / "task.yaml")
    spec = importlib.util.spec_from_file_location("task_grader", task_dir / "eval" / "grader.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    grader = module.Grader(config=config.grader)
    with tempfile.TemporaryDirectory() as tmp:
        private = Path(tmp) / "private"  # what Coral's daemon gives: <coral>/private with eval/ in it
        private.mkdir()
        (private / "eval").symlink_to(task_dir / "eval")
        grader.private_dir = str(private)
        task = Task(id=config.task.name, name=config.task.name, description=config.task.description)
        bundle = asyncio.run(grader.grade(code_dir, [task]))
    parts = [bundle.feedback] if bundle.feedback else []
    parts += [f"{n}: {s.explanation}" for n, s in bundle.scores.items() if s.explanation]
    print(json.dumps({"score": bundle.aggregated, "feedback": "\n".join(parts)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
