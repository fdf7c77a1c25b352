"""The one way to remove a folder the agent or graded code wrote (docs/security.md, "Removing what they wrote").

    remove.tree(path)           # `path` and all it holds; RemoveError names what stayed (the rest is gone)
    remove.quietly(path)        # the same for a cleanup: logs what stayed, never raises; True when all went
    remove.entry(dfd, name)     # entry `name` of the folder open as `dfd`

Whoever wrote the tree may have shaped it to break the cleanup: folders nested deeper than Python's recursion
(shutil.rmtree recurses before Python 3.12) or than the open-file limit, folders of mode 000, FIFOs and sockets
(opening one blocks), links to anything (following one removes the wrong files), a mount. So: a loop, not
recursion; each folder opened relative to its parent's descriptor with O_NOFOLLOW, each entry removed with
unlinkat (a link goes, what it points to stays; a FIFO or a socket is unlinked, never opened); a folder that
cannot be listed or changed is given mode 0700 through a descriptor (its owner may; root needs not); at most
MAX_OPEN descriptors held, a level above them reopened through `..` and checked by device and inode; no other
file system entered.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_OPEN = 64  # descriptors one removal holds, however deep the tree
_NOT_THERE = (errno.ENOENT,)


class RemoveError(OSError):
    """Some entries could not be removed (the message counts them and names the first)."""


@dataclass
class _Level:
    """One folder on the way down: its name in its parent, its identity, its descriptor (None: closed for now)
    and its subfolders still to remove."""

    name: str
    dev: int
    ino: int
    fd: int | None
    todo: list[str] = field(default_factory=list)


def tree(path: str | os.PathLike[str]) -> None:
    """Remove `path` (a folder and all it holds, or a file, or a link: the link, never its target). Nothing there
    is no error. The folders leading to `path` are the caller's (they may be links)."""
    path = Path(path)
    try:
        pfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        entry(pfd, path.name, shown=str(path))
    finally:
        os.close(pfd)


def quietly(path: str | os.PathLike[str]) -> bool:
    """`tree(path)` for a cleanup: what could not be removed is logged, never raised. True when nothing stayed."""
    try:
        tree(path)
    except OSError as exc:
        log.warning("not all of %s could be removed: %s", path, exc)
        return False
    return True


def entry(dfd: int, name: str, *, shown: str | None = None) -> None:
    """Remove entry `name` of folder `dfd` and all it holds (module docstring)."""
    shown = shown or name
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        _unlink(dfd, name)
        return
    fd = _open_dir(dfd, name)
    problems: list[str] = []
    try:
        _empty(fd, problems)
    finally:
        os.close(fd)
    try:
        _rmdir(dfd, name)
    except OSError as exc:
        problems.append(f"{shown}: {exc.strerror or exc}")
    if problems:
        raise RemoveError(
            errno.ENOTEMPTY,
            f"{shown}: {len(problems)} entries could not be removed, the first: {problems[0]}",
        )


def _empty(top_fd: int, problems: list[str]) -> None:
    """Remove everything below the folder open as `top_fd` (not the folder itself); `problems` gets what stayed.
    Depth first: a folder's files go when it is listed, its subfolders one by one, each removed once empty."""
    top = os.fstat(top_fd)
    first = os.dup(top_fd)
    stack = [_Level("", top.st_dev, top.st_ino, first)]
    try:
        stack[0].todo = _clear_files(first, "", problems)
        while stack:
            here = stack[-1]
            if here.todo:
                name = here.todo.pop()
                fd = here.fd
                assert (
                    fd is not None
                )  # the deepest level is always open (only levels MAX_OPEN above it close)
                rel = f"{_rel(stack)}/{name}".lstrip("/")
                try:
                    sub = _open_dir(fd, name)
                except OSError as exc:
                    if exc.errno not in _NOT_THERE:
                        problems.append(f"{rel}: {exc.strerror or exc}")
                    continue
                st = os.fstat(sub)
                if st.st_dev != top.st_dev:  # a mount: never entered (its rmdir fails and is reported)
                    os.close(sub)
                    problems.append(f"{rel}: another file system is mounted there")
                    continue
                stack.append(_Level(name, st.st_dev, st.st_ino, sub))
                if (
                    len(stack) > MAX_OPEN
                ):  # hold at most MAX_OPEN descriptors: the oldest (not the top) closes
                    old = stack[len(stack) - MAX_OPEN]
                    if old.fd is not None:
                        os.close(old.fd)
                        old.fd = None
                stack[-1].todo = _clear_files(sub, rel, problems)
                continue
            done = stack.pop()
            assert done.fd is not None  # (the deepest level)
            if not stack:
                os.close(done.fd)
                break
            parent = stack[-1]
            if parent.fd is None:  # reopened from the child, and checked to be the folder it was
                parent.fd = _up(done, parent)
            os.close(done.fd)
            done.fd = None
            try:
                _rmdir(parent.fd, done.name)
            except OSError as exc:
                if exc.errno not in _NOT_THERE:
                    problems.append(f"{_rel(stack)}/{done.name}: {exc.strerror or exc}".lstrip("/"))
    finally:
        for lv in stack:
            if lv.fd is not None:
                os.close(lv.fd)


def _clear_files(fd: int, rel: str, problems: list[str]) -> list[str]:
    """Unlink every entry of folder `fd` that is not a folder; its subfolders' names."""
    try:
        with os.scandir(fd) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    except OSError as exc:
        problems.append(f"{rel or '.'}: cannot be listed: {exc.strerror or exc}")
        return []
    subdirs = []
    for name, is_dir in entries:
        if is_dir:
            subdirs.append(name)
            continue
        try:
            _unlink(fd, name)
        except OSError as exc:
            if exc.errno == errno.EISDIR:  # became a folder meanwhile
                subdirs.append(name)
            elif exc.errno not in _NOT_THERE:
                problems.append(f"{rel}/{name}: {exc.strerror or exc}".lstrip("/"))
    return subdirs


def _open_dir(dfd: int, name: str) -> int:
    """Folder `name` of `dfd`, without following a link; a folder that cannot be read is opened up first."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dfd)
    except PermissionError:
        _chmod_entry(dfd, name)
        return os.open(name, DIR_FLAGS, dir_fd=dfd)


def _chmod_entry(dfd: int, name: str) -> None:
    """Mode 0700 for folder `name` of `dfd`: through an O_PATH descriptor opened without following a link (Linux
    has no lchmod; the descriptor's /proc entry is that very folder)."""
    pfd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    try:
        os.chmod(f"/proc/self/fd/{pfd}", 0o700)
    finally:
        os.close(pfd)


def _unlink(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except PermissionError:  # a folder without write permission (ours, not root): open it up
        os.fchmod(dfd, 0o700)
        os.unlink(name, dir_fd=dfd)


def _rmdir(dfd: int, name: str) -> None:
    try:
        os.rmdir(name, dir_fd=dfd)
    except PermissionError:
        os.fchmod(dfd, 0o700)
        os.rmdir(name, dir_fd=dfd)


def _up(child: _Level, parent: _Level) -> int:
    """Reopen `parent` as `..` of `child`, checking it is the same folder (one moved meanwhile is not followed)."""
    fd = os.open("..", DIR_FLAGS, dir_fd=child.fd)
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (parent.dev, parent.ino):
        os.close(fd)
        raise RemoveError(errno.ESTALE, f"{parent.name}: moved while it was being removed")
    return fd


def _rel(stack: list[_Level]) -> str:
    return "/".join(lv.name for lv in stack[1:])
