"""Host-side reads and writes inside an agent's workspace that never follow a symlink.

The agent can replace any file or folder of its workspace by a link, even while a `coral` command it started
runs on the host. Every path is therefore walked one component at a time from the workspace root with
`O_NOFOLLOW` (`openat` on directory descriptors), so a link anywhere on the way makes the call fail with
`UnsafePath` instead of reaching outside. Writes go to a temporary file in the same (verified) folder, then
an atomic rename relative to that folder's descriptor.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sftree.fileio import write_bytes_at
from sftree.runtime import remove

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_READ = 16 * 1024 * 1024


class UnsafePath(OSError):
    """A workspace path leads through a symlink or is not the kind of file expected. `kind` says what was found
    instead (`a symlink`, `a FIFO`, ...) where that is known."""

    kind: str | None = None


def _unsafe(message: str, what: str) -> UnsafePath:
    err = UnsafePath(message)
    err.kind = what
    return err


def _parts(rel: str | Path) -> list[str]:
    parts = [p for p in Path(rel).parts if p not in ("", ".")]
    if any(p == ".." or p.startswith("/") for p in parts) or Path(rel).is_absolute():
        raise UnsafePath(f"{rel}: not a plain relative path")
    return parts


@contextmanager
def open_dir(root: Path, rel: str | Path = "", *, create: bool = False) -> Iterator[int]:
    """A descriptor of folder `root/rel`, every component opened without following links."""
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in _parts(rel):
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (40, 20):  # ELOOP (a link), ENOTDIR (a file)
                    raise UnsafePath(f"{Path(root) / rel}: {part} is a symlink or not a folder") from None
                raise
            os.close(fd)
            fd = nfd
        yield fd
    finally:
        os.close(fd)


class TooLarge(ValueError):
    """A file holds more bytes than the caller reads."""


def kind(mode: int) -> str:
    """What a file of `mode` is, for a message: `a FIFO`, `a socket`, `a device`, `a folder`, `a symlink`."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "a regular file" if stat.S_ISREG(mode) else "not a file"


def open_regular(dfd: int, name: str, shown: str) -> tuple[int, os.stat_result]:
    """(descriptor, fstat) of regular file `name` in folder `dfd`. O_NOFOLLOW: a symlink is refused; O_NONBLOCK: a
    FIFO never blocks the open (it is refused on the fstat, before any read), nor does a device. UnsafePath
    names `shown` (the caller's path for messages, already escaped for display) and what it is."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dfd
        )
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the name is a symlink
            raise _unsafe(f"{shown} is a symlink", "a symlink") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _unsafe(f"{shown} is {kind(st.st_mode)}, not a regular file", kind(st.st_mode))
    return fd, st


def read_at(dfd: int, name: str, limit: int, shown: str) -> bytes:
    """The bytes of regular file `name` in folder `dfd` (`open_regular`); TooLarge when it holds more than
    `limit` bytes, seen on the fstat or, for a file still growing, while reading (never more than `limit` + 1
    bytes are read)."""
    fd, st = open_regular(dfd, name, shown)
    try:
        if st.st_size > limit:
            raise TooLarge(f"{shown} holds more than {limit} bytes")
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"{shown} holds more than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_bytes(root: Path, rel: str | Path, limit: int = MAX_READ) -> bytes:
    """At most `limit` bytes of regular file `root/rel` (more are not read), no link followed on the way."""
    parts = _parts(rel)
    with open_dir(root, Path(*parts[:-1]) if len(parts) > 1 else "") as dfd:
        fd, _st = open_regular(dfd, parts[-1], str(Path(root) / rel))
        with os.fdopen(fd, "rb") as fh:
            return fh.read(limit)


def write_bytes_atomic(root: Path, rel: str | Path, data: bytes, mode: int = 0o644) -> None:
    """Write `root/rel` atomically; its folders are created as real folders, a link anywhere is refused."""
    parts = _parts(rel)
    with open_dir(root, Path(*parts[:-1]) if len(parts) > 1 else "", create=True) as dfd:
        write_bytes_at(dfd, parts[-1], data, mode, sync=False)


def remove_tree(dfd: int, name: str) -> None:
    """Remove folder `name` of folder `dfd` and all it holds, never following a link (the one remover:
    runtime/remove.py)."""
    remove.entry(dfd, name)


def remove_entry(root: Path, name: str) -> None:
    """Remove entry `name` of folder `root` whatever it is (a folder with all it holds), never following a link."""
    with open_dir(root) as dfd:
        remove.entry(dfd, name)


def remove_all(path: Path) -> None:
    """Remove `path` and all it holds, for a cleanup: never raises, logs what stayed (runtime/remove.py)."""
    remove.quietly(path)
