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

from sftree.runtime import remove

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_READ = 16 * 1024 * 1024


class UnsafePath(OSError):
    """A workspace path leads through a symlink or is not the kind of file expected."""


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


def read_bytes(root: Path, rel: str | Path, limit: int = MAX_READ) -> bytes:
    parts = _parts(rel)
    with open_dir(root, Path(*parts[:-1]) if len(parts) > 1 else "") as dfd:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == 40:
                raise UnsafePath(f"{Path(root) / rel} is a symlink") from None
            raise
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UnsafePath(f"{Path(root) / rel} is not a regular file")
            return fh.read(limit)


def write_bytes_atomic(root: Path, rel: str | Path, data: bytes, mode: int = 0o644) -> None:
    """Write `root/rel` atomically; its folders are created as real folders, a link anywhere is refused."""
    parts = _parts(rel)
    with open_dir(root, Path(*parts[:-1]) if len(parts) > 1 else "", create=True) as dfd:
        tmp = f".{parts[-1]}.{os.getpid()}.tmp"
        try:
            os.unlink(tmp, dir_fd=dfd)
        except FileNotFoundError:
            pass
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd
        )
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.rename(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            raise


def remove_tree(dfd: int, name: str) -> None:
    """Remove folder `name` of folder `dfd` and all it holds, never following a link (the one remover:
    runtime/remove.py)."""
    remove.entry(dfd, name)


def remove_all(path: Path) -> None:
    """Remove `path` and all it holds, for a cleanup: never raises, logs what stayed (runtime/remove.py)."""
    remove.quietly(path)
