"""What changed in a knowledge checkout (`<workspace>/.opencode`), told by inotify instead of a scan.

One inotify instance per checkout watches every folder under `.opencode`. It tells two things (docs/runtime.md,
"Knowledge cost per edge"):
- the names in `attempts/` that something touched since the attempt view last asked (attempts.py), and
- whether anything under `.opencode` changed since the last knowledge commit, so a commit with nothing to do
  costs no git call, and which paths, so a commit stages those alone (`changed`, `committed`).

A folder created gets its own watch at the next sync (its creation already counts as a change); a folder
deleted drops its watch. Anything else structural (a folder moved or renamed, `.opencode` replaced, a queue
overflow) rebuilds every watch and reports "everything changed": the callers then scan in full, as they would
without inotify; so does a new or deleted `attempts/`. A watch is added to a folder before it is listed, so a
folder made meanwhile raises an event. Folders are opened one component at a time without following links, and
the watch is placed through `/proc/self/fd/N` of that very descriptor, so no path is resolved twice.
Where inotify is missing or out of watches, every query answers "changed" (a full scan, as before).

A write through a hard link raises no event on the other name's folder. Behind the knowledge fence (the
sandbox refuses link(2): runtime/sandbox.py) no checkout file has a second name, and what the watch reported since
a fork is all that can differ from the fork's commit (`exact`, runtime/kcheckout.py). Without the fence
(`sandbox: none`), the attempt view parses records that have more than one link at every refresh and what each
commit staged; a commit that does not look at such a file leaves the write out of the record, and the next fork's
`diff-files` restores the file before the checkout is reused (docs/runtime.md). A write through a shared memory
mapping after the file was closed raises no event either, but its opening for writing did (IN_CLOSE_WRITE), and
the mapping dies with the sandbox's processes before the next fork. A checkout that moves
(parked for the next fork, then moved in) keeps its inodes and so its watches. A deleted folder is reported as
its path (the commit then also stages what the last commit holds under it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import struct
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

# inotify(7) constants (linux/inotify.h)
IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x2000, 0x4000, 0x8000
IN_ONLYDIR, IN_ISDIR = 0x01000000, 0x40000000
_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
_MASK |= IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
_SELF = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_Q_OVERFLOW | IN_IGNORED
_DIR_OPS = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
_EVENT = struct.Struct("iIII")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_WATCHES = 4096  # more folders than this under .opencode: not watched (full scans, as without inotify)
MAX_DEPTH = 64  # folders nested deeper: not watched (full scans; the recursion stays far from its limit)
MAX_TOUCHED = 512  # more paths touched than this since the last commit: the commit stages everything


def _libc():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return lib
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


class KnowledgeWatch:
    """inotify over the folders of `<root>/<rel>` (module docstring). Thread-safe."""

    def __init__(self, root: Path, rel: str = ".opencode", *, enabled: bool = True):
        self.root, self.rel = Path(root), rel
        self.enabled = enabled and _LIBC is not None
        self._lock = threading.RLock()
        self._ifd = -1
        self._wds: dict[int, str] = {}  # watch descriptor -> folder relative to .opencode ("" = itself)
        self._ident: tuple[int, int] | None = None  # (device, inode) of .opencode when the watches were set
        self._broken = True  # the watches do not cover the folder: rebuild at the next sync
        self._changed = True  # anything changed since `committed`
        self._owners_only = False  # inside `owners_only`: IN_ATTRIB alone counts for nothing
        self._attempt_names: set[str] = set()
        self._attempts_reset = True  # attempts/ must be scanned in full (new watches, or none)
        self._touched: set[str] | None = (
            None  # paths (relative to .opencode) touched since `committed`; None: unknown
        )
        self.rebuilds = 0

    def rebind(self, root: Path) -> None:
        """The checkout moved with its inodes (parked, then reused by a fork)."""
        with self._lock:
            self.root = Path(root)

    def close(self) -> None:
        with self._lock:
            if self._ifd >= 0:
                self._closer()  # closes the descriptor once
            self._ifd, self._wds, self._ident, self._broken = -1, {}, None, True
            self._touched = None

    # ---- queries ---------------------------------------------------------------------------------------------
    def sync(self) -> bool:
        """Drain the events (rebuilding the watches if needed); False when the folder is not watched."""
        with self._lock:
            if not self.enabled:
                self._changed = self._attempts_reset = True
                self._touched = None
                return False
            try:
                fd = self._open_kdir()
            except OSError:
                self.close()
                self._changed = self._attempts_reset = True
                self._touched = None
                return False
            try:
                new_dirs = self._drain()
                st = os.fstat(fd)
                if self._broken or (st.st_dev, st.st_ino) != self._ident:
                    self._rebuild(fd, (st.st_dev, st.st_ino))
                else:
                    for rel in new_dirs:
                        self._watch_new(fd, rel)
                    if self._broken:
                        self._rebuild(fd, (st.st_dev, st.st_ino))
            finally:
                os.close(fd)
            return not self._broken

    def take_attempt_changes(self) -> tuple[set[str], bool]:
        """(names touched in attempts/ since the last call, whether attempts/ needs a full scan); call sync first."""
        with self._lock:
            names, reset = self._attempt_names, self._attempts_reset or self._broken
            self._attempt_names, self._attempts_reset = set(), False
            return names, reset

    def changed(self) -> bool:
        """Whether anything under .opencode may have changed since `committed` (True when unsure)."""
        with self._lock:
            return not self.sync() or self._changed

    def invalidate(self) -> None:
        """Count everything as changed (a commit that failed after `committed`)."""
        with self._lock:
            self._changed, self._touched = True, None

    def committed(self) -> set[str] | None:
        """Call right before the commit reads the folder: later changes count for the next commit. Returns the
        paths (files or folders, relative to .opencode) touched since the last call, or None when
        unknown (not watched, watches rebuilt, too many): then the commit must look at everything."""
        with self._lock:
            if not self.sync():
                return None
            touched, self._touched, self._changed = self._touched, set(), False
            return touched

    def exact(self) -> bool:
        """The host just made the folder exactly a commit (a fork): forget what was touched so far, its own
        writes included. True when the watch is live, so that every later change is reported."""
        with self._lock:
            if not self.sync():
                return False
            self._touched = set()
            return True

    def touched_now(self) -> set[str] | None:
        """The paths touched since `committed` (a copy; None when unknown), leaving them for the commit."""
        with self._lock:
            if not self.sync() or self._touched is None:
                return None
            return set(self._touched)

    @contextlib.contextmanager
    def owners_only(self) -> Iterator[None]:
        """The host changes owners (EdgeWorkspace.hand_to): the events that raises (IN_ATTRIB alone) are no
        changes of content and count for nothing. Any other event still counts: the Coral server's thread may
        write an attempt record meanwhile (an eval the graded code made last past its command). A mode changed
        by someone else meanwhile would be missed: the agent runs nothing then, and the host changes none."""
        with self._lock:
            self.sync()  # what came before counts
            self._owners_only = True
        try:
            yield
        finally:
            with self._lock:
                try:
                    self.sync()  # its own events drained
                finally:
                    self._owners_only = False

    # ---- internals -----------------------------------------------------------------------------------------
    def _open_kdir(self) -> int:
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            return os.open(self.rel, _DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)

    def _drain(self) -> list[str]:
        """Read the queued events; the folders created since (to watch) in the order they came."""
        new_dirs: list[str] = []
        if self._ifd < 0:
            self._broken = True
            return new_dirs
        while True:
            try:
                buf = os.read(self._ifd, 1 << 16)
            except BlockingIOError:
                return new_dirs
            off = 0
            while off + _EVENT.size <= len(buf):
                wd, mask, _cookie, n = _EVENT.unpack_from(buf, off)
                name = os.fsdecode(buf[off + _EVENT.size : off + _EVENT.size + n].rstrip(b"\0"))
                off += _EVENT.size + n
                if self._owners_only and not mask & ~(IN_ATTRIB | IN_ISDIR):
                    continue  # an owner or mode change while the host hands the checkout over (owners_only)
                self._changed = True
                folder = self._wds.get(wd)
                if folder is not None and name and self._touched is not None:
                    self._touched.add(f"{folder}/{name}" if folder else name)
                    if len(self._touched) > MAX_TOUCHED:
                        self._touched = None
                if mask & IN_Q_OVERFLOW:
                    self._broken = True
                elif folder is None:
                    continue  # a watch already dropped
                elif mask & IN_IGNORED:  # the folder was deleted (or unmounted)
                    del self._wds[wd]
                    if folder == "":
                        self._broken = True
                    elif folder == "attempts":
                        self._attempts_reset = True
                elif mask & IN_MOVE_SELF:
                    # .opencode itself moving is the checkout being parked or reused (paths are relative to
                    # it; a replaced .opencode fails the identity check); a subfolder moving makes paths stale.
                    if folder != "":
                        self._broken = True
                elif mask & IN_ISDIR and mask & (IN_MOVED_FROM | IN_MOVED_TO):
                    self._broken = True
                elif mask & IN_ISDIR and mask & IN_CREATE:
                    new_dirs.append(f"{folder}/{name}" if folder else name)
                    if folder == "" and name == "attempts":
                        self._attempts_reset = True
                elif folder == "attempts" and name:
                    self._attempt_names.add(name)

    def _watch_new(self, kfd: int, rel: str) -> None:
        """Watch a folder created after the last sync (and what it already holds), if it is still there."""
        fd = kfd
        try:
            for part in rel.split("/"):
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                if fd != kfd:
                    os.close(fd)
                fd = nfd
        except OSError:  # gone again (its deletion is queued) or replaced by a link/file: nothing to watch
            if fd != kfd:
                os.close(fd)
            return
        try:
            if not self._watch_tree(fd, rel):
                self._broken = True
        finally:
            os.close(fd)

    def _rebuild(self, kfd: int, ident: tuple[int, int]) -> None:
        self.close()  # (forgets the touched paths: unknown until the next commit looks at everything)
        self.rebuilds += 1
        self._changed = self._attempts_reset = True
        self._attempt_names.clear()
        ifd = _LIBC.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if ifd < 0:
            log.debug(
                "inotify unavailable (%s): knowledge is scanned in full", os.strerror(ctypes.get_errno())
            )
            return
        self._ifd = ifd
        # An instance is a per-user resource (128 by default): closed with the watch, or when it is collected.
        self._closer = weakref.finalize(self, os.close, ifd)
        if self._watch_tree(kfd, ""):
            self._ident, self._broken = ident, False
        else:
            self.close()

    def _watch_tree(self, fd: int, rel: str) -> bool:
        """Watch folder `fd` (before listing it), then its subfolders; False when a watch could not be added."""
        if len(self._wds) >= MAX_WATCHES or (rel and rel.count("/") >= MAX_DEPTH):
            return False
        wd = _LIBC.inotify_add_watch(self._ifd, f"/proc/self/fd/{fd}".encode(), _MASK)
        if wd < 0:
            log.debug(
                "inotify watch failed (%s): knowledge is scanned in full", os.strerror(ctypes.get_errno())
            )
            return False
        self._wds[wd] = rel
        try:
            with os.scandir(fd) as it:
                subdirs = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:  # e.g. a folder the agent made unreadable: not watched, full scans
            return False
        for name in subdirs:
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):  # gone or replaced meanwhile: its event tells
                continue
            except OSError as exc:  # a link swapped in (ELOOP) was replaced too; anything else: not watched
                if exc.errno == errno.ELOOP:
                    continue
                return False
            try:
                if not self._watch_tree(sub, f"{rel}/{name}" if rel else name):
                    return False
            finally:
                os.close(sub)
        return True
