"""The real Coral for tests: `.venv-coral` made by scripts/install_coral.sh from ../shared/coral.

from helpers.coral import coral_python, coral_run, needs_coral
pytestmark = needs_coral          # skipped, with the reason, where Coral is not installed
out = coral_run("from coral.template.coral_md import generate_coral_md; ...")   # stdout of a script in Coral's Python

A real Coral run (tests/test_import_coral_real.py): `CoralRun` runs `coral start` on a copy of one of Coral's
example tasks with the scripted agent runtime of tests/coral_agents (Coral loads `agents.runtime: module:Class`),
no gateway, docker, tmux or UI; `coral_bin()` is Coral's own CLI, `coral_env(home)` an environment for its
processes.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from sftree.settings import CoralSettings, section_settings
from sftree.world.grader_env import find_uv

REPO = Path(__file__).resolve().parents[2]
CORAL_SRC = Path(os.environ.get("CORAL_SRC", REPO.parent / "shared" / "coral"))
VENV = REPO / ".venv-coral"
AGENTS_DIR = Path(__file__).resolve().parents[1] / "coral_agents"


@functools.cache
def coral_python() -> str | None:
    """The interpreter that imports the pinned Coral, installing it once when its source is here; None if absent."""
    py = VENV / "bin" / "python"
    if not (CORAL_SRC / "pyproject.toml").is_file():
        return None
    if (
        not py.exists()
        or subprocess.run([str(py), "-c", "import coral.config"], capture_output=True).returncode
    ):
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "install_coral.sh")], capture_output=True, text=True
        )
        if proc.returncode:
            return None
    return str(py)


needs_coral = pytest.mark.skipif(
    coral_python() is None,
    reason=f"the real Coral is not installed: no {CORAL_SRC} or scripts/install_coral.sh failed",
)
coral = pytest.mark.coral


def coral_run(script: str, *args: str, cwd: str | None = None, timeout: float = 120) -> str:
    """Run a Python script in Coral's interpreter; its stdout (a failure raises with its stderr)."""
    proc = subprocess.run(
        [coral_python(), "-c", script, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )
    if proc.returncode:
        raise AssertionError(f"Coral script failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


def coral_config(**world) -> dict:
    """A config's `coral:` section for the pinned Coral."""
    return {"python": coral_python(), "mode": "coral", **world}


def coral_settings(**world) -> CoralSettings:
    """`coral_config` as the settings `locate` takes."""
    return section_settings(CoralSettings, coral_config(**world))


def coral_bin() -> Path:
    """Coral's own CLI, `coral`, from that venv (skips the test where Coral is not installed)."""
    py = coral_python()
    if py is None:
        pytest.skip(f"the real Coral is not installed: no {CORAL_SRC} or scripts/install_coral.sh failed")
    return Path(py).parent / "coral"


def coral_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment for Coral's processes: its venv's bin first on PATH, a private HOME (no user git config
    or ~/.coral), no git config from the system, sftree's own venv not active."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(
        PATH=f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
        HOME=str(home),
        GIT_CONFIG_NOSYSTEM="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.update(extra)
    return env


def example_task(name: str | Path, dest: Path, overrides: dict) -> Path:
    """A writable copy of Coral's example task `name` (examples/<name>: task.yaml, eval/, seed/), or of the task
    folder `name` when it is a Path, with the keys of `overrides` merged into its task.yaml (nested dicts merged,
    other values replaced); the task folder."""
    src = name if isinstance(name, Path) else CORAL_SRC / "examples" / name
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
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
    """`coral start` of a copy of Coral's example task (or of a task folder) with scripted agents, in the background.

        with CoralRun(base, "circle_packing", plan) as run:
            run.wait(lambda records: ...)      # poll .coral/public/attempts until the predicate holds
            run.stop()                         # `coral stop` (Coral's own shutdown)
        run.run_dir                            # results/<task-slug>/run: .coral/, repo/, agents/

    `plan` maps agent ids (agent-1, agent-2, ...) to the steps of tests/coral_agents/scripted_agent.py; the
    number of agents is the number of plans. Everything is under `base`; the manager and its children run in
    their own process group, which is killed on exit whatever happened."""

    def __init__(
        self, base: Path, task: str | Path, plan: dict, grader_timeout: int = 120, extra: dict | None = None
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
        env = coral_env(self.home, PYTHONPATH=str(AGENTS_DIR))
        uv = find_uv()  # Coral's setup_grader_env runs `uv` from PATH (a packaged grader's task)
        if uv:
            env["PATH"] = f"{env['PATH']}{os.pathsep}{Path(uv).parent}"
        return env

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


def grading_worlds() -> list:
    """The grading paths to parametrize over: sftree's stand-in, and the real Coral where it is installed."""
    import pytest

    out = [pytest.param(None, id="stand-in")]
    if coral_python():
        out.append(pytest.param("coral", id="coral", marks=pytest.mark.coral))
    return out


def install_for(kind):
    """The Coral install a grading world uses (None: the stand-in)."""
    if kind is None:
        return None
    from sftree.world.locate import locate

    return locate(coral_settings())
