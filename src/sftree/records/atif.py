"""The ATIF trajectory file (`sft.atif.jsonl`, one per task and the merged one; `export.atif`): one ATIF v1.8
`Trajectory` document per line (dataset/atif.py builds them; docs/outputs.md, "ATIF trajectories").

Written by `export-sft --atif-out` (per task) and `merge-sft --atif-inputs ... --atif-out` (all tasks, the tasks'
lines in order); read back by the merge with `read_trajectories`, which checks what the merge and a consumer rely
on without the `atif` package (a dev extra: the tests validate every document with its pydantic models): each line
a JSON object of this schema version, with an `agent` object and steps numbered 1, 2, ... in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sftree.errors import InputError
from sftree.fileio import AtomicLines, iter_jsonl

SCHEMA_VERSION = "ATIF-v1.8"
ATIF_NAME = (
    "sft.atif.jsonl"  # the merged file in the results folder (per task: results/<task>/sft.atif.jsonl)
)


def trajectory_problem(doc: Any) -> str | None:
    """What is wrong with one line as a trajectory of this version, or None."""
    if not isinstance(doc, dict):
        return f"a {type(doc).__name__}, not a JSON object"
    if doc.get("schema_version") != SCHEMA_VERSION:
        return f"schema_version {str(doc.get('schema_version'))[:40]!r}, not {SCHEMA_VERSION!r}"
    if not isinstance(doc.get("agent"), dict):
        return "no `agent` object"
    steps = doc.get("steps")
    if not isinstance(steps, list) or not steps:
        return "no `steps` list"
    for i, s in enumerate(steps, 1):
        if not isinstance(s, dict) or s.get("step_id") != i:
            return f"steps[{i - 1}] is not a step with step_id {i}"
    return None


def read_trajectories(path: str | Path) -> Iterator[dict[str, Any]]:
    """The trajectories of an ATIF file, checked (InputError names the file and line)."""
    for n, doc in enumerate(iter_jsonl(path, "ATIF file"), 1):
        why = trajectory_problem(doc)
        if why:
            raise InputError(f"ATIF file {path} line {n}: {why}")
        yield doc


def trajectory_writer(path: str | Path) -> AtomicLines:
    """The writer of an ATIF file: line by line, renamed into place on success only."""
    return AtomicLines(path)


def atif_path(sft_out: str | Path) -> Path:
    """The ATIF file beside an SFT file (results/<task>/sft.jsonl -> results/<task>/sft.atif.jsonl)."""
    return Path(sft_out).with_name(ATIF_NAME)
