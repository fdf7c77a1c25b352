"""A full disk (ENOSPC) while writing a tree, a step log or an export: a clear error naming the file (DiskFull,
which the CLI prints as one line), nothing half written (the file as it was, no temporary file beside it), and
the same write, with room again, completes. On a small tmpfs (root mounts it; skipped elsewhere)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sftree.errors import DiskFull
from sftree.fileio import write_json_atomic, write_jsonl_atomic
from sftree.records.steplog import StepWriter, read_steps
from sftree.records.tree import LiveFiles

BIG = {"text": "x" * 200_000}  # more than the tmpfs holds


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode()[:200]}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def tree_snapshot(d: Path, doc: dict) -> Path:
    write_json_atomic(d / "tree.json", doc)
    return d / "tree.json"


_live: dict[Path, LiveFiles] = {}


def tree_log(d: Path, doc: dict) -> Path:
    """A save appended to the live tree's log (one LiveFiles per tree folder, as explore holds it)."""
    files = _live.get(d)
    if files is None or not files.dir.exists():
        files = _live[d] = LiveFiles(d)
        files.write_snapshot({"small": True})
    files.append(doc)
    return files.log_path


def step_log(d: Path, doc: dict) -> Path:
    w = StepWriter(d / "edges" / "e1" / "steps.jsonl")
    try:
        w.write({"edge": "e1", "step": 1, "request": {"messages": [{"role": "user", "content": doc}]}})
    finally:
        try:
            w.close()
        except OSError:
            pass
    return w.path


def export(d: Path, doc: dict) -> Path:
    write_jsonl_atomic(d / "sft.jsonl", [doc, doc])
    return d / "sft.jsonl"


@pytest.mark.parametrize("write", [tree_snapshot, tree_log, step_log, export], ids=lambda f: f.__name__)
def test_a_full_disk_names_the_file_leaves_it_whole_and_the_rerun_completes(
    small_disk: Path, write: Callable[[Path, dict], Path]
) -> None:
    path = write(small_disk, {"small": True})
    before = path.read_bytes()
    with pytest.raises(DiskFull) as err:
        write(small_disk, BIG)
    assert str(path) in str(err.value) and "no space left" in str(err.value)
    if write is not step_log:  # a step log is the unfinished edge's, rewritten by its rerun
        assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")) == []
    again = write(small_disk, {"small": "again"})
    if write is step_log:
        assert read_steps(again)[0]["request"]["messages"][0]["content"] == {"small": "again"}
    else:
        assert b"again" in again.read_bytes()
        lines = again.read_text().splitlines() if again.suffix == ".jsonl" else [again.read_text()]
        assert all(json.loads(line) for line in lines)


def test_an_export_streamed_past_the_room_leaves_no_temporary_file(small_disk: Path, tmp_path: Path) -> None:
    """Records streamed line by line (the export's writer) past what the disk holds: DiskFull naming the output,
    which the CLI prints as its one error line; nothing of it on the disk."""
    src = tmp_path / "in.jsonl"
    rec = {"messages": [{"role": "user", "content": "x" * 100_000}, {"role": "assistant", "content": "ok"}]}
    src.write_text(json.dumps(rec) + "\n" + json.dumps({**rec, "id": 2}) + "\n")
    from sftree.fileio import AtomicLines

    out = small_disk / "sft.jsonl"
    with pytest.raises(DiskFull, match=str(out)), AtomicLines(out) as lines:
        for _ in range(4):
            lines.write(src.read_text())
    assert list(small_disk.iterdir()) == []
