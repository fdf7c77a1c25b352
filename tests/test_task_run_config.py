"""A task with `coral_task` and `coral_run`: the run's expanded `.coral/config.yaml` (what the Student ran with,
after a preset or overrides) wins over the task folder's task.yaml where they differ, and each difference is
reported (sftree.world.run_config). Through the real Coral's own writer where it is installed."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers.coral import coral_python

from sftree.errors import InputError
from sftree.settings import settings_of
from sftree.world import run_config
from sftree.world.task import load_task, task_config

TASK = {
    "task": {"name": "circles", "description": "pack circles"},
    "grader": {"entrypoint": "", "timeout": 60, "direction": "maximize", "args": {"program_file": "p.py"}},
}


def task_folder(base: Path) -> Path:
    task = base / "task"
    (task / "eval").mkdir(parents=True)
    (task / "eval" / "grader.py").write_text("from coral.grader import TaskGrader\n")
    (task / "task.yaml").write_text(yaml.safe_dump(TASK))
    return task


def expanded(base: Path, task: Path, overrides: list[str]) -> Path:
    """A run folder whose .coral/config.yaml is the expanded configuration: written by the real Coral's
    CoralConfig (from_yaml, merge_dotlist, to_yaml, as `coral start -c task.yaml <overrides>` does), else by hand
    in its shape (every field of the sections, defaults included)."""
    run = base / "run"
    (run / ".coral").mkdir(parents=True)
    out = run / ".coral" / "config.yaml"
    if coral_python():
        code = (
            "import sys\nfrom coral.config import CoralConfig\n"
            "c = CoralConfig.merge_dotlist(CoralConfig.from_yaml(sys.argv[1]), sys.argv[3:])\n"
            "c.to_yaml(sys.argv[2])\n"
        )
        subprocess.run(
            [coral_python(), "-c", code, str(task / "task.yaml"), str(out), *overrides], check=True
        )
    else:
        doc = {"task": dict(TASK["task"], tips=""), "grader": dict(TASK["grader"], setup=[], private=[])}
        doc["agents"] = {"count": 1, "runtime": "claude_code", "model": "sonnet"}
        for o in overrides:
            key, value = o.split("=", 1)
            section, name = key.split(".")
            doc[section][name] = yaml.safe_load(value)
        out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return run


def test_the_runs_configuration_wins_and_each_difference_is_reported(tmp_path, caplog):
    task = task_folder(tmp_path)
    run = expanded(tmp_path, task, ["grader.timeout=600", "grader.direction=minimize", "task.tips=use numpy"])
    text = (run / ".coral/config.yaml").read_text()
    assert "timeout: 600" in text and "max_pending_per_agent" in text or not coral_python()
    config = {"tasks": {"circles": {"coral_task": str(task), "coral_run": str(run)}}}
    with caplog.at_level(logging.WARNING, logger="sftree.world.run_config"):
        spec = load_task(task_config(settings_of(config), "circles"), "circles")
        load_task(task_config(settings_of(config), "circles"), "circles")
    assert (spec.timeout, spec.direction, spec.tips) == (600.0, "minimize", "use numpy")
    assert spec.args == {"program_file": "p.py"} and spec.title == "circles"  # the same: task.yaml's
    assert spec.coral["grader"]["timeout"] == 600  # Coral's own config for the Teacher's world too
    fields = sorted(d.split(":")[0] for d in spec.run_config_differences)
    assert fields == ["grader.direction", "grader.timeout", "task.tips"]
    assert (
        "grader.timeout: 60 in task.yaml, 600 in the run (the run's is used)" in spec.run_config_differences
    )
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "a preset or overrides" in warnings[0] and "grader.timeout" in warnings[0]
    assert (
        task_config(settings_of(config), "circles")["direction"] == "minimize"
    )  # the workflow grades the run's way


def test_a_run_that_ran_the_task_as_it_is_changes_nothing(tmp_path):
    task = task_folder(tmp_path)
    run = expanded(tmp_path, task, [])
    spec = load_task(
        task_config(settings_of({"tasks": {"c": {"coral_task": str(task), "coral_run": str(run)}}}), "c"), "c"
    )
    plain = load_task(task_config(settings_of({"tasks": {"c": {"coral_task": str(task)}}}), "c"), "c")
    assert spec.run_config_differences == () and (spec.timeout, spec.direction) == (
        plain.timeout,
        plain.direction,
    )


def test_a_hostile_run_configuration_is_refused_by_name(tmp_path):
    task = task_folder(tmp_path)
    run = tmp_path / "run"
    (run / ".coral").mkdir(parents=True)
    (run / ".coral/config.yaml").write_text("a: &x [1]\nb: *x\n")  # an alias: refused, never expanded
    with pytest.raises(InputError, match=r"config\.yaml"):
        load_task(
            task_config(settings_of({"tasks": {"c": {"coral_task": str(task), "coral_run": str(run)}}}), "c"),
            "c",
        )
    (run / ".coral/config.yaml").unlink()
    (run / ".coral/config.yaml").symlink_to(task / "task.yaml")
    with pytest.raises(InputError, match="config.yaml"):
        run_config.read(run)
