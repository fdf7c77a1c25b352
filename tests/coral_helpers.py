"""The real Coral in tests: where it is installed, how to run its CLI, and how to make a real Coral run.

Coral is never installed into sftree's .venv (a user's Coral is their own; sftree runs without one):
`scripts/install_coral.sh` puts the pinned copy `../shared/coral` into `.venv-coral` (`.ci/run` calls it).
Tests that need it are marked `coral` and skip, naming the reason, when the copy or the venv is absent:

    from coral_helpers import needs_coral, with_coral
    pytestmark = needs_coral          # a whole module; or @with_coral on one test

    coral_python()  -> .venv-coral/bin/python     coral_bin() -> .venv-coral/bin/coral
    coral_env(home) -> an environment for Coral's processes (its bin first on PATH, a private HOME)

`CoralRun` makes a real run: `coral start` on a copy of one of Coral's example tasks with the scripted agent
runtime of tests/coral_agents (Coral loads `agents.runtime: module:Class`), no gateway, docker, tmux or UI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CORAL_SRC = Path(os.environ.get("SFTREE_CORAL_SRC", REPO.parent / "shared" / "coral"))
CORAL_VENV = Path(os.environ.get("SFTREE_CORAL_VENV", REPO / ".venv-coral"))
AGENTS_DIR = Path(__file__).resolve().parent / "coral_agents"


def coral_missing() -> str | None:
    """Why the real Coral cannot be used here, or None."""
    if not (CORAL_SRC / "coral").is_dir():
        return f"no Coral copy at {CORAL_SRC} (a checkout without ../shared/coral)"
    if not (CORAL_VENV / "bin" / "coral").is_file():
        return f"Coral is not installed in {CORAL_VENV}: run bash scripts/install_coral.sh"
    return None


_MISSING = coral_missing()
skip_without_coral = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
needs_coral = [pytest.mark.coral, skip_without_coral]


def with_coral(test):
    """Mark one test `coral` and skip it, naming the reason, where Coral is not installed."""
    return pytest.mark.coral(skip_without_coral(test))


def coral_python() -> Path:
    """The interpreter of the venv Coral is installed in (skips the test when there is none)."""
    if _MISSING:
        pytest.skip(_MISSING)
    return CORAL_VENV / "bin" / "python"


def coral_bin() -> Path:
    """Coral's own CLI, `coral`, from that venv."""
    if _MISSING:
        pytest.skip(_MISSING)
    return CORAL_VENV / "bin" / "coral"


def coral_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment for Coral's processes: its venv's bin first on PATH, a private HOME (no user git config
    or ~/.coral), no git config from the system, sftree's own venv not active."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(
        PATH=f"{CORAL_VENV / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
        HOME=str(home),
        GIT_CONFIG_NOSYSTEM="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.update(extra)
    return env


def example_task(name: str, dest: Path, overrides: dict) -> Path:
    """A writable copy of Coral's example task `name` (examples/<name>: task.yaml, eval/, seed/) with the keys of
    `overrides` merged into its task.yaml (nested dicts merged, other values replaced); the task folder."""
    import shutil

    shutil.copytree(CORAL_SRC / "examples" / name, dest)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)  # the copy in ../shared is read-only

    def merge(base: dict, new: dict) -> dict:
        for k, v in new.items():
            base[k] = merge(dict(base.get(k) or {}), v) if isinstance(v, dict) else v
        return base

    doc = merge(yaml.safe_load((dest / "task.yaml").read_text()), overrides)
    (dest / "task.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


# Heartbeats off (each would interrupt and restart an agent after its evals), the stall watchdog off, no
# gateway, no web search: the run is the agents' evals, graded by Coral's daemon.
QUIET_AGENTS = {
    "timeout": 0,
    "research": False,
    "gateway": {"enabled": False},
    "heartbeat": [
        {"name": "reflect", "every": 1_000_000},
        {"name": "consolidate", "every": 1_000_000, "global": True},
        {"name": "pivot", "every": 1_000_000, "trigger": "plateau"},
        {"name": "lint_wiki", "every": 1_000_000, "global": True},
    ],
}


class CoralRun:
    """`coral start` of a copy of Coral's example task with scripted agents, in the background.

        with CoralRun(base, "circle_packing", plan) as run:
            run.wait(lambda records: ...)      # poll .coral/public/attempts until the predicate holds
            run.stop()                         # `coral stop` (Coral's own shutdown)
        run.run_dir                            # results/<task-slug>/run: .coral/, repo/, agents/

    `plan` maps agent ids (agent-1, agent-2, ...) to the steps of tests/coral_agents/scripted_agent.py; the
    number of agents is the number of plans. Everything is under `base`; the manager and its children run in
    their own process group, which is killed on exit whatever happened."""

    def __init__(
        self, base: Path, task: str, plan: dict, grader_timeout: int = 120, extra: dict | None = None
    ):
        self.base = Path(base)
        self.home = self.base / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        (self.base / "plan.json").write_text(json.dumps(plan, indent=2))
        self.run_dir = self.base / "results" / "coral-task" / "run"
        overrides = {
            "agents": {
                **QUIET_AGENTS,
                "count": len(plan),
                "runtime": "scripted_runtime:ScriptedRuntime",
                "model": "scripted",
                "runtime_options": {"plan": str(self.base / "plan.json")},
            },
            "grader": {"timeout": grader_timeout},
            "workspace": {
                "results_dir": str(self.base / "results"),
                "repo_path": str(self.base / "task" / "seed"),
                "run_dir": str(self.run_dir),
                "setup": [],
            },
            "run": {"session": "local", "ui": False, "verbose": False},
            **(extra or {}),
        }
        self.task_dir = example_task(task, self.base / "task", overrides)
        self.proc: subprocess.Popen | None = None
        self.log = self.base / "coral-start.log"

    def env(self) -> dict[str, str]:
        return coral_env(self.home, PYTHONPATH=str(AGENTS_DIR))

    def __enter__(self) -> CoralRun:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(coral_bin()), "start", "-c", str(self.task_dir / "task.yaml")],
                cwd=self.base,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def records(self) -> list[dict]:
        out = []
        for p in sorted((self.run_dir / ".coral" / "public" / "attempts").glob("*.json")):
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                pass  # Coral writes with tmp + rename; a half-read is retried by the caller
        return out

    def wait(self, predicate, timeout: float = 120, what: str = "the run") -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"coral start exited ({self.proc.returncode}):\n{self.tail()}")
            records = self.records()
            if predicate(records):
                return records
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        logs = self.run_dir / ".coral" / "public" / "logs"
        for p in sorted(logs.glob("*.log")) if logs.is_dir() else []:
            text += f"\n--- {p.name}\n" + p.read_text(errors="replace")[-1500:]
        return text[-n:]

    def stop(self, timeout: float = 60) -> None:
        """Coral's own shutdown (`coral stop`: SIGTERM to the manager, which stops agents and the daemon)."""
        subprocess.run(
            [str(coral_bin()), "stop", "--task", self.run_dir.parent.name, "--run", self.run_dir.name],
            cwd=self.base,
            env=self.env(),
            capture_output=True,
            timeout=timeout,
        )
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the manager, its grader daemon and their children
            except ProcessLookupError:
                pass
            self.proc.wait()
        for pid_file in self.run_dir.glob(".coral/public/agent.pids"):
            for line in pid_file.read_text().split():
                try:
                    os.killpg(int(line), signal.SIGKILL)  # agents run in sessions of their own
                except (ValueError, ProcessLookupError, PermissionError):
                    pass
