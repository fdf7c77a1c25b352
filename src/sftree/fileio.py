"""Atomic file writes: write to a temporary file in the same folder, fsync, then rename.

A reader (or a rerun after a crash) sees either the old file or the new one, never half of one. A full disk
(ENOSPC, or a quota's EDQUOT) while writing is `DiskFull` naming the file (`disk_full_named`), the temporary file
removed: the command ends with that line, and its rerun, with room again, writes the file.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import secrets
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from sftree.errors import DiskFull

FULL = (errno.ENOSPC, errno.EDQUOT)


@contextmanager
def disk_full_named(path: str | os.PathLike[str]) -> Iterator[None]:
    """An OSError for a full disk inside becomes DiskFull naming `path` (the file being written)."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in FULL:
            raise
        raise DiskFull(
            f"no space left on the device writing {path} ({exc.strerror}): nothing of it was written; "
            "make room and run the same command again"
        ) from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # what open() would give; mkstemp's 0600 would hide outputs on shared clusters


def write_bytes_at(dfd: int, name: str, data: bytes, mode: int = 0o666, *, sync: bool = True) -> None:
    """Write entry `name` of the open folder `dfd` atomically: a new temporary entry beside it (created, never
    opened through a link), fsynced when `sync`, then renamed over `name`. `mode` is masked by the umask, as
    open() would. The one atomic write: `write_bytes_atomic` (a path) and `runtime/safefs.py` (a tree's entry,
    reached without following links) both end here."""
    while True:
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd
            )
            break
        except FileExistsError:  # taken (by anything, a link too): another name
            continue
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except FileNotFoundError:
            pass
        raise


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with disk_full_named(path):
            write_bytes_at(dfd, path.name, data, _FILE_MODE)
    finally:
        os.close(dfd)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike[str], obj: Any, indent: int | None = 2) -> None:
    write_text_atomic(path, json.dumps(obj, indent=indent, ensure_ascii=False, sort_keys=False) + "\n")


class AtomicLines:
    """Write a large JSONL file line by line into a temporary file, then rename it into place: streaming (records
    can be far larger in total than memory, since each holds a whole session) and atomic."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.count = 0

    def __enter__(self) -> AtomicLines:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        self.fh = os.fdopen(fd, "w", encoding="utf-8")
        return self

    def write(self, record: Any) -> None:
        line = record if isinstance(record, str) else json.dumps(record, ensure_ascii=False)
        with disk_full_named(self.path):
            self.fh.write(line.rstrip("\n") + "\n")
        self.count += 1

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            with disk_full_named(self.path):
                if exc_type is None:
                    self.fh.flush()
                    os.fsync(self.fh.fileno())
                try:
                    self.fh.close()
                except OSError:  # what was buffered could not be written either
                    if exc_type is None:
                        raise
                if exc_type is None:
                    os.chmod(self.tmp, _FILE_MODE)
                    os.replace(self.tmp, self.path)
        finally:
            if os.path.exists(self.tmp):
                os.unlink(self.tmp)


def write_jsonl_atomic(path: str | os.PathLike[str], records: Iterable[Any]) -> int:
    with AtomicLines(path) as out:
        for r in records:
            out.write(r)
    return out.count


def iter_jsonl(path: str | os.PathLike[str], what: str = "JSONL file") -> Iterator[Any]:
    """Yield the records of a JSONL file; a missing file or a bad line is an InputError naming path and line."""
    from sftree.errors import InputError

    try:
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise InputError(f"{what} {path} line {lineno}: not UTF-8 ({exc.reason} at byte "
                                     f"{exc.start})") from None  # fmt: skip
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(f"{what} {path} line {lineno}: not valid JSON ({exc})") from None
    except FileNotFoundError:
        raise InputError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def read_json(path: str | os.PathLike[str], what: str = "JSON file") -> Any:
    """Read JSON, turning every failure into an InputError that names the path."""
    from sftree.errors import InputError

    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise InputError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {what} {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{what} {path} is not valid JSON: {exc}") from None


def read_json_object(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """Read a JSON object; InputError naming the path on any failure."""
    from sftree.errors import InputError

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.loads(fh.read())
    except FileNotFoundError:
        raise InputError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{what} {path} must hold a JSON object, not {type(data).__name__}")
    return data


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large file is read into many small objects, none in a cycle
    (select-roots' snapshots, stages.tsv's rows): the collections those allocations trigger (each older one walking
    every object kept so far) find nothing and only cost time (a third of a 100k-row read). Restored on exit; nested
    uses are harmless."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
