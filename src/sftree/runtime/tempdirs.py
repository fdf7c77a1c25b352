"""Temporary folders of a run (`sftree-coral-*` sockets, `sftree-grade-*` checkouts, `sftree-proxy-*` sockets)
that must not outlive it.

A folder may be made with a disk quota (`make(prefix, quota=...)`): as root it is then a tmpfs of that size
(runtime/diskquota.py), unmounted when removed. What is in a folder is removed by the one remover
(runtime/remove.py): an agent or graded code may have written there.

Each folder is registered while it exists, so it is removed by its owner's normal cleanup, at interpreter exit
(a failure that skipped the owner's cleanup), and on SIGTERM (Slurm's time limit, `snakemake` cancelled): the
handler removes what is registered, then dies of SIGTERM as before. A `kill -9` leaves them behind; their
names carry the owner's pid, so the next run (`sweep`) removes those whose owner is gone. Nothing in them is
needed by a rerun (the tree's state lives in the tree folder).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from sftree.runtime import diskquota, procs
from sftree.runtime import remove as remove_tree
from sftree.runtime.diskquota import DiskQuota

log = logging.getLogger(__name__)

# Every prefix a run's folders are made with, each followed by the owner's pid: the one list the start of a run
# sweeps (runtime/runowner.py). `make`'s, the Coral bridge's (world/bridge_main.py runs in the user's Coral, without
# sftree: it names its own) and the quota probe's (runtime/diskquota.py).
PREFIXES = ("sftree-coral-", "sftree-grade-", "sftree-proxy-", "sftree-bridge-", "sftree-quota-probe-")

# Reentrant: the SIGTERM handler runs in the main thread, which may be inside `make` when the signal comes.
_lock = threading.RLock()
_live: set[str] = set()
_closing = False  # remove_all has begun (SIGTERM, exit): no new folder may stay


class Closing(RuntimeError):
    """The run is being torn down: no new temporary folder."""


def make(prefix: str, quota: DiskQuota | None = None) -> Path:
    """A new private folder `<prefix><pid>-<random>` in the temp dir, registered until `remove`. Made and
    registered under the lock, so `remove_all` (SIGTERM) sees every folder that exists, and none comes after.
    With `quota`, where the kernel can enforce it (root), the folder is a tmpfs of that size (`mounted`)."""
    with _lock:
        if _closing:
            raise Closing(f"no new {prefix}* folder: the run is ending")
        path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
        _live.add(path)
    if quota is not None:
        try:
            diskquota.mount(path, quota)
        except OSError as exc:  # the callers measure an unmounted folder instead (docs/security.md)
            log.warning("%s: the folder stays on the host's disk", exc)
    return Path(path)


def mounted(path: str | os.PathLike[str]) -> bool:
    """`path` (made by `make`) is a quota tmpfs."""
    return diskquota.is_quota_mount(path)


def _remove(path: str, warn: bool = True) -> bool:
    """Unmount a quota tmpfs (all it holds goes with it), then remove what is left; True when nothing stayed."""
    if diskquota.is_quota_mount(path):
        try:
            diskquota.unmount(path)
        except OSError as exc:
            log.warning("%s", exc)
    try:
        remove_tree.tree(path)
    except OSError as exc:
        if warn:
            log.warning("not all of %s could be removed: %s", path, exc)
        return False
    return True


def remove(path: str | os.PathLike[str]) -> None:
    _remove(os.fspath(path))
    with _lock:
        _live.discard(str(path))


@contextmanager
def temporary(prefix: str, quota: DiskQuota | None = None) -> Iterator[Path]:
    path = make(prefix, quota)
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
        for i in range(5):
            if _remove(p, warn=i == 4) and not os.path.lexists(p):
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
    """Remove our folders left by a process that no longer exists (killed with -9), a quota tmpfs unmounted;
    returns their names."""
    base = Path(tempfile.gettempdir())
    gone: list[str] = []
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
        _remove(str(p))
        gone.append(p.name)
    return gone


@contextmanager
def removed_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM ends every process this one started (servers, OpenCode, graders, sandboxes: they
    may be in sessions of their own, which the signal does not reach) and removes the registered folders, then
    dies of SIGTERM as before (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        procs.signal_descendants(os.getpid())  # first: none of them writes into a folder being removed
        remove_all()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
