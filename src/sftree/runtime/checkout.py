"""The host writes a tree of a store into a folder it made: a fork's workspace, a copy to grade.

Blobs are written as they are stored: no attribute, filter or end-of-line rule applies, so the files are exactly
the commit (what was graded is what a child continues from). Folders are opened one descriptor at a time
without following a link, files created with `O_EXCL | O_NOFOLLOW`; `uid` (sftree is root) gets every entry
made, so the sandbox user can change them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from functools import partial
from pathlib import Path

from sftree.runtime.folderreader import EXEC_MODE, LINK_MODE
from sftree.runtime.objects import ObjectDB
from sftree.runtime.safefs import DIR_FLAGS, remove_tree

BATCH = 512  # blobs per read round trip


class _Dirs:
    """Descriptors of the folders under a destination, made on first use (parents first)."""

    def __init__(self, dest: Path, uid: int | None):
        self.uid = uid
        self.fds = {"": os.open(dest, DIR_FLAGS)}

    def get(self, rel: str) -> int:
        fd = self.fds.get(rel)
        if fd is not None:
            return fd
        parent, _, name = rel.rpartition("/")
        pfd = self.get(parent)
        try:
            os.mkdir(name, 0o755, dir_fd=pfd)
            if self.uid is not None:
                os.chown(name, self.uid, self.uid, dir_fd=pfd, follow_symlinks=False)
        except FileExistsError:
            pass
        fd = self.fds[rel] = os.open(name, DIR_FLAGS, dir_fd=pfd)
        return fd

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def write_files(
    db: ObjectDB, files: dict[str, tuple[str, str]], dest: Path, *, uid: int | None = None
) -> None:
    """Write {path: (mode, blob id)} under folder `dest`, replacing what is at those paths; each blob streamed
    from the store a chunk at a time (a graded file of any size costs the host no memory)."""
    dirs = _Dirs(Path(dest), uid)
    out = _Writer(uid)
    try:
        paths = sorted(files)
        todo = iter(paths)  # the batches ask in this order: each blob handed on is the next path's

        def take(_kind: str, _size: int) -> Callable[[bytes], object]:
            path = next(todo)
            parent, _, name = path.rpartition("/")
            return out.start(dirs.get(parent), name, files[path][0])

        for i in range(0, len(paths), BATCH):
            db.read_each([files[p][1] for p in paths[i : i + BATCH]], take)
        out.finish()
    finally:
        out.drop()
        dirs.close()


class _Writer:
    """The entry being written: a file's descriptor, or a link's target gathered until it is made."""

    def __init__(self, uid: int | None):
        self.uid = uid
        self.fd: int | None = None
        self.link: tuple[int, str, list[bytes]] | None = None

    def start(self, dfd: int, name: str, mode: str) -> Callable[[bytes], object]:
        """Finish the entry before; make `name` in folder `dfd`; the function its content goes to."""
        self.finish()
        _remove(dfd, name)
        if mode == LINK_MODE:
            self.link = (dfd, name, [])
            return self.link[2].append
        perm = 0o755 if mode == EXEC_MODE else 0o644
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self.fd = fd = os.open(name, flags, perm, dir_fd=dfd)
        os.fchmod(fd, perm)  # (the umask)
        if self.uid is not None:
            os.fchown(fd, self.uid, self.uid)
        return partial(_write_all, fd)

    def drop(self) -> None:
        """After a failure: the file being written closed, the link not made."""
        self.link = None
        self.finish()

    def finish(self) -> None:
        fd, link, self.fd, self.link = self.fd, self.link, None, None
        if fd is not None:
            os.close(fd)
        if link is not None:
            dfd, name, parts = link
            os.symlink(os.fsdecode(b"".join(parts)), name, dir_fd=dfd)
            if self.uid is not None:
                os.chown(name, self.uid, self.uid, dir_fd=dfd, follow_symlinks=False)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _remove(dfd: int, name: str) -> None:
    """Remove entry `name` of folder `dfd` whatever it is (a folder with all it holds), never following a link."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        remove_tree(dfd, name)
    else:
        os.unlink(name, dir_fd=dfd)


def apply_difference(
    db: ObjectDB, dest: Path, gone: list[str], write: dict[str, tuple[str, str]], *, uid: int | None = None
) -> int:
    """Remove the paths `gone` from folder `dest` and write `write` ({path: (mode, blob id)}); the number of paths
    touched. For a folder only the host writes (a parked `attempts/`), whose content is known exactly."""
    dirs = _Dirs(Path(dest), uid)
    try:
        for path in gone:
            parent, _, name = path.rpartition("/")
            try:
                _remove(dirs.get(parent), name)
            except OSError:
                pass
    finally:
        dirs.close()
    if write:
        write_files(db, write, dest, uid=uid)
    return len(gone) + len(write)
