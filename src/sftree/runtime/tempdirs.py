"""Temporary folders of a run (`sftree-coral-*` sockets, `sftree-grade-*` checkouts) that must not outlive it.

Each folder is registered while it exists, so it is removed by its owner's normal cleanup, at interpreter exit
(a failure that skipped the owner's cleanup), and on SIGTERM (Slurm's time limit, `snakemake` cancelled): the
handler removes what is registered, then dies of SIGTERM as before. A `kill -9` leaves them behind; their
names carry the owner's pid, so the next run (`sweep`) removes those whose owner is gone. Nothing in them is
needed by a rerun (the tree's state lives in the tree folder).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Reentrant: the SIGTERM handler runs in the main thread, which may be inside `make` when the signal comes.
_lock = threading.RLock()
_live: set[str] = set()
_closing = False  # remove_all has begun (SIGTERM, exit): no new folder may stay


class Closing(RuntimeError):
    """The run is being torn down: no new temporary folder."""


def make(prefix: str) -> Path:
    """A new private folder `<prefix><pid>-<random>` in the temp dir, registered until `remove`. Made and
    registered under the lock, so `remove_all` (SIGTERM) sees every folder that exists, and none comes after."""
    with _lock:
        if _closing:
            raise Closing(f"no new {prefix}* folder: the run is ending")
        path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
        _live.add(path)
        return Path(path)


def remove(path: str | os.PathLike) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with _lock:
        _live.discard(str(path))


@contextmanager
def temporary(prefix: str) -> Iterator[Path]:
    path = make(prefix)
    try:
        yield path
    finally:
        remove(path)


def remove_all() -> None:
    global _closing
    with _lock:
        _closing = True
        paths = sorted(_live)
        _live.clear()
    # Other threads run on meanwhile: one may still be writing into a folder (its coral client, its socket),
    # so an rmtree can miss what is made while it lists; a few quick retries catch those.
    for p in paths:
        for _ in range(5):
            shutil.rmtree(p, ignore_errors=True)
            if not os.path.lexists(p):
                break
            time.sleep(0.01)


atexit.register(remove_all)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _ours(uid: int) -> bool:
    """A folder of this user's runs: owned by us, or (we are root) by one of the sandbox uids we hand out."""
    if uid == os.getuid():
        return True
    from sftree.runtime.sandbox import is_sandbox_uid

    return os.geteuid() == 0 and is_sandbox_uid(uid)


def sweep(prefixes: tuple[str, ...]) -> list[str]:
    """Remove our folders left by a process that no longer exists (killed with -9); returns their names."""
    from sftree.runtime.safefs import remove_all

    base = Path(tempfile.gettempdir())
    gone = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return gone
    for p in entries:
        prefix = next((x for x in prefixes if p.name.startswith(x)), None)
        pid = p.name[len(prefix) :].split("-", 1)[0] if prefix else ""
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            if p.is_symlink() or not p.is_dir() or not _ours(p.lstat().st_uid):
                continue
        except OSError:
            continue
        remove_all(p)
        gone.append(p.name)
    return gone


@contextmanager
def removed_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM removes the registered folders first (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        remove_all()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
