"""The host reads a folder of the agent's workspace itself and stores it as git objects (docs/security.md).

No git, no file tool and no parser runs over what the agent wrote: the host walks the folder one directory
descriptor at a time without following a link (`O_NOFOLLOW`, `openat`), takes regular files and symbolic links
as git stores them (a link's blob is its target text), skips every other kind of file (FIFOs, sockets, devices:
opened with `O_NONBLOCK`, never read), and stops with `QuotaExceeded` past a bound on files, bytes, one file's
size or depth, so nothing the agent made can block it, run code, or make it read without end. What it read is
what is committed and graded.

A file whose stat key (device, inode, size, mtime, ctime, mode) is unchanged since an earlier snapshot of the
same folder is not read again. The key cannot be forged: the agent can set a file's mtime, never its ctime,
which the kernel sets on every change of content or metadata (a write through a hard link included). A key
whose ctime is within `RACY_NS` of the moment it was read is not kept, as git does with "racy" entries: a
change in the same clock tick would leave the key as it was.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sftree.errors import SftreeError
from sftree.runtime.objects import ObjectDB, tree_from_files
from sftree.runtime.safefs import DIR_FLAGS
from sftree.settings import QuotaSettings

RACY_NS = 100_000_000  # 0.1 s: well above a clock tick (1-10 ms)
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
FILE_MODE, EXEC_MODE, LINK_MODE = "100644", "100755", "120000"


@dataclass(frozen=True)
class Quota:
    """What one workspace folder may hold (config `agent.quota`): entries, bytes (apparent sizes: a sparse file
    counts at its full length, as it would be read), one file's bytes, folder depth."""

    files: int
    bytes: int
    file_bytes: int
    depth: int

    @classmethod
    def from_settings(cls, q: QuotaSettings) -> Quota:
        """From config `agent.quota`."""
        return cls(files=q.files, bytes=q.mib << 20, file_bytes=q.file_mib << 20, depth=q.depth)


class QuotaExceeded(SftreeError):
    """The folder holds more than its quota allows; the message says what and where."""


class UnsafeWorkspace(SftreeError):
    """Workspace content the host refuses to take (a folder that is a link)."""


@dataclass
class Reading:
    """What a snapshot took and what it left out."""

    files: int = 0
    bytes: int = 0
    read: int = 0  # files whose content was read (the others came from the stat cache)
    skipped: list[str] = field(default_factory=list)  # special files and names that are no UTF-8


Skip = Callable[[str, bool], bool]  # (relative path, is a folder) -> leave it out


def walk(
    root: str | os.PathLike[str], quota: Quota, skip: Skip | None = None
) -> Iterator[tuple[int, str, os.DirEntry[str]]]:
    """Every entry under `root` as (its folder's descriptor, its relative path, the entry), folders before what
    they hold; links are entries, never followed; a folder swapped for a link or a file while walking is left
    out. A missing `root` holds nothing; a `root` that is a link or a file is UnsafeWorkspace (its content is not
    the agent's to give). QuotaExceeded for more than `quota.files` entries or a depth beyond `quota.depth`."""
    try:
        top = os.open(root, DIR_FLAGS)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeWorkspace(
                f"{root} is a symlink or not a folder; the host does not follow it"
            ) from None
        raise
    stack: list[tuple[int, str, int]] = [(top, "", 0)]
    count = 0
    try:
        while stack:
            fd, prefix, depth = stack.pop()
            try:
                with os.scandir(fd) as it:
                    entries = sorted(it, key=lambda e: e.name)
                subdirs = []
                for e in entries:
                    rel = prefix + e.name
                    is_dir = e.is_dir(follow_symlinks=False)
                    if skip is not None and skip(rel, is_dir):
                        continue
                    count += 1
                    if count > quota.files:
                        raise QuotaExceeded(f"more than {quota.files} files and folders (quota)")
                    yield fd, rel, e
                    if is_dir:
                        subdirs.append(e.name)
                for name in reversed(subdirs):
                    if depth + 1 > quota.depth:
                        where = f"{prefix}{name}/"
                        where = where if len(where) <= 80 else where[:77] + "..."
                        raise QuotaExceeded(f"folders nested deeper than {quota.depth} ({where})")
                    try:
                        sub = os.open(name, DIR_FLAGS, dir_fd=fd)
                    except OSError as exc:  # gone, or swapped for a link or a file meanwhile
                        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EACCES):
                            continue
                        raise
                    stack.append((sub, f"{prefix}{name}/", depth + 1))
            finally:
                os.close(fd)
    finally:
        for fd, _p, _d in stack:
            os.close(fd)


# what says a file is unchanged since it was read: device, inode, size, times, mode
StatKey = tuple[int, int, int, int, int, int]


def _key(st: os.stat_result) -> StatKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


STREAM_OVER = 1 << 20  # files larger than this are hashed and stored as they are read, not held in memory


def _store_file(
    db: ObjectDB, dfd: int, name: str, st: os.stat_result, limit: int, rel: str
) -> tuple[str, os.stat_result]:
    """Store the file as a blob (never more than `limit` bytes, else QuotaExceeded); (its id, its stat after).
    FileNotFoundError when it is not the regular file `st` describes, or changed while read (swapped)."""
    if st.st_size > limit:
        raise QuotaExceeded(f"{rel} is larger than {limit >> 20} MiB (quota)")
    fd = os.open(name, READ_FLAGS, dir_fd=dfd)
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise FileNotFoundError(errno.ENOENT, "swapped while reading", rel)
        size = now.st_size
        if size > limit:
            raise QuotaExceeded(f"{rel} is larger than {limit >> 20} MiB (quota)")
        if size > STREAM_OVER:
            try:
                oid = db.write_blob_stream(lambda n: os.read(fd, n), size)
            except ValueError:
                raise FileNotFoundError(errno.ENOENT, "changed while reading", rel) from None
        else:
            data = os.read(fd, size + 1)
            if len(data) != size:
                raise FileNotFoundError(errno.ENOENT, "changed while reading", rel)
            oid = db.write("blob", data)
        return oid, os.fstat(fd)
    finally:
        os.close(fd)


class FolderReader:
    """Snapshots of one folder into one object store, with the stat cache of what it read (module docstring)."""

    def __init__(self, db: ObjectDB, quota: Quota, skip: Skip | None = None):
        self.db = db
        self.quota = quota
        self.skip = skip
        self._cache: dict[str, tuple[StatKey, str, str]] = {}  # path -> (stat key, mode, blob id)

    def files(self, root: str | os.PathLike[str]) -> tuple[dict[str, tuple[str, str]], Reading]:
        """{path: (mode, blob id)} of what `root` holds now, blobs written; and what was taken."""
        start = time.time_ns()
        out: dict[str, tuple[str, str]] = {}
        info = Reading()
        cache: dict[str, tuple[StatKey, str, str]] = {}
        for dfd, rel, entry in walk(root, self.quota, self.skip):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                info.skipped.append(rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
                continue
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                info.skipped.append(rel)
                continue
            info.files += 1
            info.bytes += st.st_size
            if info.bytes > self.quota.bytes:
                raise QuotaExceeded(f"more than {self.quota.bytes >> 20} MiB in files (quota)")
            hit = self._cache.get(rel)
            if hit is not None and hit[0] == _key(st):
                cache[rel] = hit
                out[rel] = (hit[1], hit[2])
                continue
            try:
                if stat.S_ISLNK(st.st_mode):
                    target = os.fsencode(os.readlink(entry.name, dir_fd=dfd))
                    oid, after, mode = self.db.write("blob", target), st, LINK_MODE
                else:
                    oid, after = _store_file(self.db, dfd, entry.name, st, self.quota.file_bytes, rel)
                    mode = EXEC_MODE if st.st_mode & stat.S_IXUSR else FILE_MODE
            except FileNotFoundError:
                continue  # gone or swapped while reading: as if it had not been there
            info.read += 1
            out[rel] = (mode, oid)
            if _key(after) == _key(st) and st.st_ctime_ns < start - RACY_NS:
                cache[rel] = (_key(st), mode, oid)
        self._cache = cache
        return out, info

    def snapshot(self, root: str | os.PathLike[str]) -> tuple[str, Reading]:
        """The tree id of what `root` holds now (its objects written) and what was taken."""
        files, info = self.files(root)
        return tree_from_files(self.db, files), info


def usage(
    root: str | os.PathLike[str], quota: Quota, skip: Skip | None = None, start: tuple[int, int] = (0, 0)
) -> tuple[int, int]:
    """(entries, bytes) under `root` (plus `start`), bounded by the quota (QuotaExceeded beyond it); links not
    followed, `skip` not counted."""
    n, size = start
    left = Quota(quota.files - n, quota.bytes, quota.file_bytes, quota.depth)
    for _fd, _rel, entry in walk(root, left, skip):
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        n += 1
        if not stat.S_ISDIR(st.st_mode):
            size += max(st.st_size, st.st_blocks * 512)
            if size > quota.bytes:
                raise QuotaExceeded(f"more than {quota.bytes >> 20} MiB in files (quota)")
    return n, size
