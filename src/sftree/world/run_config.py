"""What the Student ran with: the Coral run's expanded configuration (`RUN/.coral/config.yaml`), over the task folder.

Coral writes the configuration it runs with into the run folder (`coral/workspace/project.py` `create_project`:
`CoralConfig.to_yaml`, every field, after a preset and the command line's overrides were merged in). The task
folder's `task.yaml` is only where it started: a preset or an override (`coral start -c task.yaml
grader.timeout=600`) changes the task, the grader settings or the agents without touching it. For a task with
both `coral_task` and `coral_run`, the fields below are taken from the run where they differ, and each
difference is reported (logged once per process, and kept on the TaskSpec).

The run's file was written beside its agents' work, so it is read as import-coral reads it: without following a
link, regular file only, at most 1 MiB, by a YAML loader that refuses aliases and bounds depth and size.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sftree.errors import InputError
from sftree.jsontypes import CoralDoc

log = logging.getLogger(__name__)

# What sftree takes from a task: the task's texts, the grader settings (Coral's GraderConfig), its agent.
FIELDS = (
    "task.name",
    "task.description",
    "task.tips",
    "grader.direction",
    "grader.timeout",
    "grader.args",
    "grader.entrypoint",
    "grader.setup",
    "agents.runtime",
    "agents.model",
)
# Coral's defaults (coral/config.py) for a field task.yaml leaves out: the same value is no difference.
DEFAULTS = {
    "task.tips": "",
    "grader.direction": "maximize",
    "grader.timeout": 300,
    "grader.args": {},
    "grader.entrypoint": "",
    "grader.setup": [],
}
MAX_CONFIG = 1 << 20
_reported: set[tuple[str, str, str, tuple[str, ...]]] = set()  # (task, task folder, run, differences)
_UNSET = object()


def read(run_dir: str | Path) -> CoralDoc | None:
    """The run's `.coral/config.yaml` as a mapping; None when the run has none. InputError when it is unusable."""
    import yaml

    from sftree.runtime import safefs
    from sftree.safeparse import LimitError, yaml_load

    run = Path(run_dir).resolve()
    if run.name == ".coral":
        run = run.parent
    where = run / ".coral" / "config.yaml"
    try:
        doc = yaml_load(safefs.read_bytes(run, ".coral/config.yaml", MAX_CONFIG).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (LimitError, OSError, ValueError, yaml.YAMLError) as exc:
        raise InputError(f"{where}: cannot be read: {exc}") from None
    if not isinstance(doc, dict):
        raise InputError(f"{where}: the top level must be a mapping")
    return doc


def _get(data: Any, path: str) -> tuple[bool, Any]:
    cur = data
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


def merge(task_yaml: CoralDoc, run_cfg: CoralDoc) -> tuple[CoralDoc, list[str]]:
    """task.yaml with each field of FIELDS that the run's configuration sets differently replaced by the run's;
    (merged copy, one line per difference). A field task.yaml leaves out counts as Coral's default (DEFAULTS);
    one with no default here (the agent's runtime and model) is taken from the run without a difference."""
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in task_yaml.items()}
    diffs = []
    for path in FIELDS:
        has_run, run_value = _get(run_cfg, path)
        if not has_run or run_value is None:
            continue
        has_task, task_value = _get(task_yaml, path)
        if not has_task:
            task_value = DEFAULTS.get(path, _UNSET)
        if run_value == task_value:
            continue
        _set(merged, path, run_value)
        if task_value is not _UNSET:  # left out of task.yaml with no default here: Coral filled in its own
            diffs.append(
                f"{path}: {_short(task_value)} in task.yaml, {_short(run_value)} in the run (the run's is used)"
            )
    return merged, diffs


def _set(data: CoralDoc, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    cur = data
    for part in parents:
        nxt = cur.get(part)
        nxt = dict(nxt) if isinstance(nxt, dict) else {}
        cur[part] = nxt
        cur = nxt
    cur[last] = value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def report(name: str, task_dir: Path, run_dir: str, diffs: list[str]) -> None:
    """Log the differences (once per task and run in a process: a task is loaded by many steps)."""
    key = (name, str(task_dir), str(run_dir), tuple(diffs))
    if not diffs or key in _reported:
        return
    _reported.add(key)
    log.warning(
        "task %s: the Coral run %s ran with a configuration other than %s/task.yaml (a preset or overrides): %s",
        name,
        run_dir,
        task_dir,
        "; ".join(diffs),
    )
