"""The stand-in `TaskGrader`: what a task's eval/grader.py subclasses (`evaluate()` returning a number or a
ScoreBundle) and the helpers it calls. `get_python_command()` is the interpreter sftree gives the grader, which
runs the command as graded code in its own sandbox (sftree/world/grading.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from coral.types import Score, ScoreBundle, Task

# a JSON document in Coral's shape (this program runs under another Python and imports nothing of sftree)
Doc = dict[str, Any]

__all__ = ["ScoreBundle", "Task", "TaskGrader"]


class TaskGrader(ABC):
    codebase_path: str
    private_dir: str
    tasks: list[Task]

    def __init__(self, config: Any) -> None:
        self.config = config
        self.tasks = []

    @property
    def args(self) -> dict[str, Any]:
        return dict(getattr(self.config, "args", None) or {})

    @property
    def timeout(self) -> int | None:
        return getattr(self.config, "timeout", None) or None

    @property
    def budget_class(self) -> str:
        meta = self.tasks[0].metadata if self.tasks else {}
        return meta.get("budget_class", "real") if meta.get("budget_class") in ("real", "tune") else "real"

    @property
    def tune(self) -> bool:
        return self.budget_class == "tune"

    @abstractmethod
    def evaluate(self) -> float | ScoreBundle: ...

    def get_python_command(self) -> list[str]:
        return [sys.executable]

    def run_program(self, filename: str, *cmd_args: str) -> subprocess.CompletedProcess[str]:
        path = Path(self.codebase_path) / filename
        if not path.exists():
            raise FileNotFoundError(f"{filename} not found in codebase")
        return subprocess.run(
            [*self.get_python_command(), str(path), *cmd_args],
            capture_output=True,
            text=True,
            cwd=self.codebase_path,
            timeout=self.timeout,
        )

    def run_script(self, script: str, *, timeout: int = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.get_python_command(), "-c", script], capture_output=True, text=True, timeout=timeout
        )

    def run_script_json(self, script: str, *, timeout: int = 300) -> Doc:
        res = self.run_script(script, timeout=timeout)
        if res.returncode != 0:
            raise RuntimeError(res.stderr.strip()[-2000:])
        out = res.stdout.strip()
        if not out:
            raise RuntimeError(f"no output; stderr: {res.stderr.strip()[-1000:]}")
        for line in [out, *reversed(out.splitlines())]:
            line = line.strip()
            if line.startswith("{"):
                try:
                    found: Doc = json.loads(line)
                    return found
                except ValueError:
                    continue
        raise RuntimeError(f"no JSON object in the output: {out[-500:]}")

    def read_eval(self, relative_path: str) -> str:
        return self.read_eval_path(relative_path).read_text()

    def read_eval_path(self, relative_path: str) -> Path:
        path = Path(self.private_dir) / "eval" / relative_path
        if not path.exists():
            raise FileNotFoundError(f"eval file not found: {relative_path}")
        return path

    def bundle(
        self,
        value: float | None,
        explanation: str = "",
        feedback: str | None = None,
        metadata: Doc | None = None,
    ) -> ScoreBundle:
        return ScoreBundle(
            scores={"eval": Score(value=value, name="eval", explanation=explanation or None)},
            aggregated=value,
            feedback=feedback,
            metadata=metadata or {},
        )

    def score(
        self,
        value: float | None,
        explanation: str = "",
        feedback: str | None = None,
        metadata: Doc | None = None,
    ) -> ScoreBundle:
        return self.bundle(value, explanation, feedback=feedback, metadata=metadata)

    def fail(self, explanation: str = "", feedback: str | None = None) -> ScoreBundle:
        return self.bundle(None, explanation, feedback=feedback)
