"""A task as config.yaml names it: a Coral task folder used as it is, or sftree's older command form.

    tasks:
      circle_packing:
        coral_task: ../shared/coral/examples/circle_packing   # task.yaml, eval/grader.py (a TaskGrader), seed/
        graded_can_read: []            # task-folder files the graded program may read (kernel_builder: eval/frozen_problem.py)
        grader_timeout: 60             # optional: overrides task.yaml's grader.timeout
      legacy:
        direction: maximize            # the older form, kept for configs that have it: task_dir with task.md and
        task_dir: my_task              # a grader command printing {"score", "feedback"} (world/coral_command.py)
        grader: python3 {task_dir}/grader.py {code_dir}

`load_task(entry, name)` -> `TaskSpec`: name, direction, timeout, args, description, tips and the raw task.yaml
(`coral`, for Coral's own config) from the task folder, validated with errors that name the file and the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sftree.config import REPO_ROOT
from sftree.errors import InputError
from sftree.jsontypes import CoralDoc
from sftree.settings import Settings
from sftree.world import run_config

DIRECTIONS = ("maximize", "minimize")


@dataclass(frozen=True)
class TaskSpec:
    name: str  # the config's task name (results/<name>/...)
    kind: str  # "coral" (a Coral task folder) | "command" (task_dir + grader command)
    direction: str
    timeout: float  # seconds; Coral's grader.timeout (0 = no limit there: sftree then uses `grader_timeout`)
    description: str = ""
    tips: str = ""
    title: str = ""  # task.yaml's task.name (what CORAL.md calls the task)
    args: CoralDoc = field(default_factory=dict)
    task_dir: Path | None = None
    eval_dir: Path | None = None
    seed_dir: Path | None = None
    coral: CoralDoc = field(default_factory=dict)  # task.yaml as read (Coral builds its config from it)
    graded_can_read: tuple[str, ...] = ()
    grader: str | None = None  # the command form's grader command
    # The packaged form (Coral's current one): `grader.entrypoint` "pkg.module:Class" imported in a grader venv that
    # `grader.setup` (shell commands run in the task folder) installs into (world/grader_env.py builds and caches it).
    entrypoint: str = ""
    setup: tuple[str, ...] = ()
    venv_cache: str | None = None  # config `coral.grader_venv_cache` (None: the user cache dir)
    # `coral_run`'s expanded .coral/config.yaml where it differs from task.yaml (world/run_config.py): one line each
    run_config_differences: tuple[str, ...] = ()

    @property
    def minimize(self) -> bool:
        return self.direction == "minimize"

    @property
    def folder(self) -> Path:
        """The Coral task folder (`task_dir`), which a Coral task always has."""
        if self.task_dir is None:
            raise InputError(f"task {self.name}: no task folder (task_dir or coral_task)")
        return self.task_dir

    @property
    def eval_folder(self) -> Path:
        """The Coral task's `eval/` folder (the path a Coral task always has; the folder itself may be missing)."""
        if self.eval_dir is None:
            raise InputError(f"task {self.name}: not a Coral task folder (no eval/)")
        return self.eval_dir


def _field(
    data: Any,
    path: str,
    kind: type | tuple[type, ...],
    where: Path,
    required: bool = True,
    default: object = None,
) -> Any:
    cur = data
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            if required:
                raise InputError(f"{where}: `{path}` is missing")
            return default
        cur = cur[part]
    if cur is None and not required:
        return default
    if not isinstance(cur, kind) or isinstance(cur, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InputError(f"{where}: `{path}` must be {names}, got {type(cur).__name__} ({cur!r})")
    return cur


def read_task_yaml(task_dir: Path) -> CoralDoc:
    path = Path(task_dir) / "task.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{task_dir}: not a Coral task folder (no task.yaml)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: the top level must be a mapping")
    return data


def load_coral_task(
    task_dir: str | Path, name: str | None = None, overrides: CoralDoc | None = None
) -> TaskSpec:
    """Read a Coral task folder (task.yaml, eval/grader.py, seed/) without changing anything in it."""
    task_dir = Path(task_dir).resolve()
    data = read_task_yaml(task_dir)
    diffs: list[str] = []
    run_dir = (overrides or {}).get("coral_run")
    if run_dir and (run_cfg := run_config.read(run_dir)) is not None:
        data, diffs = run_config.merge(data, run_cfg)  # what the Student ran with wins
        run_config.report(name or task_dir.name, task_dir, str(run_dir), diffs)
    where = task_dir / "task.yaml"
    title = _field(data, "task.name", str, where)
    description = _field(data, "task.description", str, where)
    tips = _field(data, "task.tips", str, where, required=False, default="")
    direction = _field(data, "grader.direction", str, where, required=False, default="maximize")
    if direction not in DIRECTIONS:
        raise InputError(f"{where}: `grader.direction` must be maximize or minimize, got {direction!r}")
    timeout = _field(data, "grader.timeout", (int, float), where, required=False, default=300)
    if timeout < 0:
        raise InputError(f"{where}: `grader.timeout` must be >= 0, got {timeout}")
    args = _field(data, "grader.args", dict, where, required=False, default={})
    entry = _field(data, "grader.entrypoint", str, where, required=False, default="")
    setup = _field(data, "grader.setup", list, where, required=False, default=[])
    if any(not isinstance(c, str) or not c.strip() for c in setup):
        raise InputError(f"{where}: `grader.setup` must be a list of shell commands (strings)")
    eval_dir = task_dir / "eval"
    if entry:
        mod, _, cls = entry.rpartition(":")
        if not mod or not cls.isidentifier() or not all(p.isidentifier() for p in mod.split(".")):
            raise InputError(f"{where}: `grader.entrypoint` must be 'module.path:ClassName', got {entry!r}")
    elif not (eval_dir / "grader.py").is_file():
        raise InputError(
            f"{task_dir}: no eval/grader.py and no `grader.entrypoint` in task.yaml (the task's TaskGrader)"
        )
    overrides = overrides or {}
    override = overrides.get("coral_timeout_override", overrides.get("grader_timeout"))
    if override is not None:
        timeout = override
    reads = tuple(str(p) for p in overrides.get("graded_can_read") or ())
    for rel in reads:
        p = Path(rel)
        if p.is_absolute() or ".." in p.parts or p.parts[:1] != ("eval",) or not (task_dir / p).is_file():
            raise InputError(
                f"tasks.{name or title}.graded_can_read: {rel!r} is not a file inside {task_dir}/eval"
            )
    seed = task_dir / "seed"
    return TaskSpec(
        name=name or title,
        kind="coral",
        direction=direction,
        timeout=float(timeout),
        description=description,
        tips=tips,
        title=title,
        args=dict(args),
        task_dir=task_dir,
        eval_dir=eval_dir,
        seed_dir=seed if seed.is_dir() else None,
        coral=data,
        graded_can_read=reads,
        entrypoint=entry,
        setup=tuple(setup),
        venv_cache=(overrides.get("coral") or {}).get("grader_venv_cache"),
        run_config_differences=tuple(diffs),
    )


def load_task(entry: CoralDoc, name: str) -> TaskSpec:
    """One config.yaml task entry (as `sftree.config.task_config` returns it) as a TaskSpec."""
    if entry.get("coral_task"):
        spec = load_coral_task(entry["coral_task"], name, entry)
        if entry.get("direction") and entry["direction"] != spec.direction:
            raise InputError(
                f"tasks.{name}.direction is {entry['direction']!r} but {spec.task_dir}/task.yaml says "
                f"grader.direction {spec.direction!r}: leave it out (task.yaml decides)"
            )
        return spec
    if not entry.get("grader"):
        raise InputError(f"tasks.{name}: give `coral_task` (a Coral task folder) or `grader` (a command)")
    task_dir = Path(entry["task_dir"]) if entry.get("task_dir") else None
    desc = ""
    if task_dir and (task_dir / "task.md").is_file():
        desc = (task_dir / "task.md").read_text(encoding="utf-8").strip()
    return TaskSpec(
        name=name,
        kind="command",
        direction=entry.get("direction", "maximize"),
        timeout=float(entry.get("grader_timeout", 120)),
        description=desc,
        title=name,
        task_dir=task_dir,
        grader=entry["grader"],
        coral={
            "task": {"name": name, "description": desc},
            "grader": {"direction": entry.get("direction", "maximize")},
        },
    )


def task_config(settings: Settings, task: str) -> dict[str, Any]:
    """One config.yaml task entry with `task_dir`/`coral_task` made absolute and, for a Coral task folder, the
    direction its task.yaml gives.

    A relative `task_dir` is taken from the working directory when it exists there, else from the repository
    (so the bundled examples are found when Snakemake runs with `--directory` elsewhere).
    """
    try:
        entry = dict(settings.tasks[task])
    except KeyError:
        raise InputError(f"task {task!r} is not listed under `tasks` in the config") from None
    for key in ("task_dir", "coral_task"):
        if entry.get(key):
            p = Path(entry[key])
            if not p.is_absolute():
                p = p.resolve() if p.exists() else (REPO_ROOT / p).resolve()
            entry[key] = str(p)
    entry["name"] = task
    # (the schema allows neither key in a task entry)
    entry["coral"] = dataclasses.asdict(settings.coral)  # the Teacher's world (sftree.world)
    entry["run_dir"] = settings.agent.run_dir
    if entry.get("coral_task"):
        # A Coral task folder: its task.yaml decides the direction (the runtime grades it with its own
        # TaskGrader, sftree.world.grading).
        entry["direction"] = load_task(entry, task).direction
    return entry
