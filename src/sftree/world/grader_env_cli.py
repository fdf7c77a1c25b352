"""`sftree grader-env --task NAME --out results/<task>/grader_env.json [--config FILE]`: the preflight of a task's
grader before any tree starts (workflow rule `grader_env`). A packaged grader (`grader.entrypoint`) gets its
grader venv built or found in the cache (world/grader_env.py; `grader.setup`'s output goes to --log) and its
entrypoint checked (imports, names a TaskGrader subclass); a failure is one line naming the task folder, the field
and the cause. An eval/grader.py or command-form task passes at once. --out records what was found (JSON).
"""

from __future__ import annotations

import argparse
import time

from sftree.fileio import write_json_atomic


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", required=True, help="the config's task name")
    parser.add_argument(
        "--out", required=True, help="JSON written on success (results/<task>/grader_env.json)"
    )
    parser.add_argument("--log", help="grader.setup's output (default: beside --out, grader_setup.log)")
    parser.add_argument("--config", help="config.yaml (default: the repository's)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sftree.errors import InputError
    from sftree.settings import load_settings
    from sftree.world import grader_env
    from sftree.world.locate import locate
    from sftree.world.task import load_task, task_config

    settings = load_settings(args.config)
    if args.task not in settings.tasks:
        raise InputError(f"--task {args.task}: no such task in the config")
    entry = task_config(settings, args.task)
    spec = load_task(entry, args.task)
    log = Path(args.log) if args.log else Path(args.out).parent / "grader_setup.log"
    t0 = time.monotonic()
    if spec.kind == "coral" and spec.entrypoint:
        install = locate(settings.coral)
        venv = grader_env.preflight(spec, install, log)
        assert venv is not None  # (a packaged task: preflight builds or finds its venv)
        record = {
            "task": args.task,
            "form": "packaged",
            "entrypoint": spec.entrypoint,
            "venv": str(venv.path),
            "key": venv.key,
            "built": venv.built,
            "seconds": round(time.monotonic() - t0, 3),
            "by": install.to_dict() if install else "stand-in",
        }
    else:
        record = {"task": args.task, "form": "eval/grader.py" if spec.kind == "coral" else "command"}
    write_json_atomic(args.out, record)
    print(
        f"grader_env {args.task}: {record['form']}"
        + (
            f", venv {record['venv']} ({'built' if record['built'] else 'reused'}, {record['seconds']} s)"
            if record["form"] == "packaged"
            else ""
        )
    )
    return 0
