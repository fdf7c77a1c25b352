"""Shared helpers for the tests of the Teacher runtime: a root, a task, a config, graded dirs, step records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from sftree.config import REPO_ROOT, load_config
from sftree.records import steplog
from sftree.settings import settings_of
from sftree.world.task import task_config

EXAMPLES = REPO_ROOT / "examples"


def make_root(tmp: Path, task: str = "circle_packing", *, attempts: list[dict] | None = None) -> Path:
    """A root snapshot folder: the example task's code/ and a small shared/ knowledge base."""
    root = tmp / f"root-{task}"
    shutil.copytree(EXAMPLES / task / "seed", root / "code")
    (root / "shared" / "notes").mkdir(parents=True)
    (root / "shared" / "attempts").mkdir()
    (root / "shared" / "notes" / "student.md").write_text("# Student note\nROWS = 5 did not help.\n")
    for a in attempts or []:
        (root / "shared" / "attempts" / f"{a['commit_hash']}.json").write_text(json.dumps(a))
    (root / "metadata.json").write_text(json.dumps({"task": task, "eval_count": 5}))
    return root


def make_task(tmp: Path, grader_py: str, *, direction: str = "maximize", timeout: float = 20) -> dict:
    """A task config with a grader written by the test (`{code_dir}`, `{task_dir}` placeholders)."""
    task_dir = tmp / "task"
    task_dir.mkdir(exist_ok=True)
    (task_dir / "grader.py").write_text(grader_py)
    (task_dir / "task.md").write_text("Make VALUE in solution.py large.\n")
    return {
        "name": "toy",
        "direction": direction,
        "task_dir": str(task_dir),
        "grader": "python3 {task_dir}/grader.py {code_dir}",
        "grader_timeout": timeout,
    }


TOY_GRADER = """
import json, runpy, sys
ns = runpy.run_path(sys.argv[1] + "/solution.py")
print("grading...")
print(json.dumps({"score": float(ns["VALUE"]), "feedback": "value is %s" % ns["VALUE"]}))
"""


def config(**over) -> dict:
    """examples/demo.yaml with test-sized retries and the native backend (fast: the runtime and search tests;
    the OpenCode tests set `agent.backend`); `over` is merged per section."""
    cfg = load_config(EXAMPLES / "demo.yaml")
    cfg["teacher"].update({"retries": 2, "backoff_max": 0.05, "health_timeout": 5, "request_timeout": 10})
    cfg["agent"]["backend"] = "native"
    # OpenCode's tool set for a non-GPT id (edit and write; a GPT id gets apply_patch): what the scripted Teachers
    # of the OpenCode tests call (tests/test_opencode_student_view.py covers both)
    cfg["agent"]["student_model"] = "sglang/student"
    for section, values in over.items():
        cfg[section] = {**cfg.get(section, {}), **values} if isinstance(values, dict) else values
    return cfg


def grade_dir(task_cfg: dict, code_dir: Path) -> float | None:
    """The score the task's own grader gives a folder, outside any tree (the stand-in world's TaskGrader base)."""
    from sftree.world.grading import grade
    from sftree.world.task import load_task

    return grade(
        load_task(task_cfg, task_cfg["name"]), code_dir, commit="0" * 40, install=None, sandbox="auto"
    ).score


def example_task(cfg: dict, task: str = "circle_packing") -> dict:
    return task_config(settings_of(cfg), task)


def read_steps(tree_dir: Path, edge: str) -> list[dict]:
    """An edge's step records, requests rebuilt from the message store."""
    return steplog.read_steps(tree_dir / "edges" / edge / "steps.jsonl")


def opencode_binary() -> tuple[str | None, str]:
    """The OpenCode binary, or None and why not (tests that need it skip with that reason)."""
    from sftree.agents.opencode import find_binary
    from sftree.errors import InputError

    try:
        return find_binary("opencode"), ""
    except InputError as exc:  # pragma: no cover - depends on the machine
        return None, str(exc)


def spy_git_calls(monkeypatch) -> list[str]:
    """The git subcommands the workspace runs from now on, in order (the first word after the options)."""
    from sftree.runtime import workspace as wsmod

    seen: list[str] = []
    real = wsmod.git

    def spy(args, **kw):
        words = [a for a in args if not a.startswith("-") and "=" not in a and "/" not in a]
        seen.append(words[0] if words else "?")
        return real(args, **kw)

    monkeypatch.setattr(wsmod, "git", spy)
    return seen
