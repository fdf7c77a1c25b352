"""Disk quotas the kernel enforces (docs/security.md, "Disk quotas"): a tmpfs of so many bytes and inodes, where a
write past either fails with ENOSPC in the writer, and `df` shows the quota.

    q = DiskQuota(bytes=1 << 30, inodes=100_000)
    if mount(folder, q): ...            # root: `folder` is now such a tmpfs (a grading's folder)
    unmount(folder)                     # detached at once; what it held is freed with it, nothing to walk
    argv = remount_argv(q) + command    # run inside a sandbox's mount namespace, as root: caps its /tmp's inodes

Why tmpfs: it needs no block device, no mkfs and no loop device (a loop-mounted image per grading costs a
file, an mkfs and a loop device, which containers often lack); mounting one is a system call. Its pages are
memory: they count against the job's memory (its cgroup), and the quota is what one grading or one sandbox's
/tmp may take of it. Mounting needs root (CAP_SYS_ADMIN): without it the callers fall back (docs/security.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import shutil
import tempfile
from dataclasses import dataclass

from sftree.settings import QuotaSettings

MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2
SOURCE = b"sftree-quota"  # the mount's source name, as /proc/mounts shows it


@dataclass(frozen=True)
class DiskQuota:
    """At most `bytes` of file data and `inodes` files, folders and links."""

    bytes: int
    inodes: int

    def options(self) -> str:
        return f"size={self.bytes},nr_inodes={self.inodes}"

    @classmethod
    def from_mib(cls, mib: int, inodes: int) -> DiskQuota:
        return cls(int(mib) << 20, int(inodes))


def grade_quota(quota: QuotaSettings) -> DiskQuota:
    """What one grading may write, from config `agent.quota` (`grade_mib`, `grade_inodes`)."""
    return DiskQuota.from_mib(quota.grade_mib, quota.grade_inodes)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount(target: str, quota: DiskQuota, mode: int) -> None:
    opts = f"{quota.options()},mode={mode:o}".encode()
    if _libc().mount(SOURCE, target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot mount a tmpfs quota on {target}: {os.strerror(err)}")


@functools.cache
def can_mount() -> bool:
    """Root, allowed to mount (tried once on a scratch folder)."""
    if os.geteuid() != 0:
        return False
    d = tempfile.mkdtemp(prefix=f"sftree-quota-probe-{os.getpid()}-")  # (pid: swept if a kill leaves it)
    try:
        _mount(d, DiskQuota(1 << 20, 16), 0o700)
    except OSError:
        os.rmdir(d)
        return False
    unmount(d)
    os.rmdir(d)
    return True


def mount(path: str | os.PathLike[str], quota: DiskQuota, mode: int = 0o700) -> bool:
    """Make the empty folder `path` a tmpfs of `quota` (nosuid, nodev); False where mounting is not allowed."""
    if not can_mount():
        return False
    _mount(os.fspath(path), quota, mode)
    return True


def unmount(path: str | os.PathLike[str]) -> bool:
    """Detach the mount at `path` (lazily: a process still holding a file there keeps only that); False when
    nothing is mounted there."""
    if _libc().umount2(os.fsencode(os.fspath(path)), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err in (22, 2):  # EINVAL: not a mount point; ENOENT
            return False
        raise OSError(err, f"cannot unmount {path}: {os.strerror(err)}")
    return True


def is_quota_mount(path: str | os.PathLike[str]) -> bool:
    """`path` is one of our quota mounts (a leftover of a killed run is found by this)."""
    target = os.path.realpath(path)
    try:
        with open("/proc/self/mounts", "rb") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 2 and parts[0] == SOURCE and _unescape(parts[1]) == target:
                    return True
    except OSError:
        pass
    return False


def _unescape(field: bytes) -> str:
    """/proc/mounts writes space, tab, newline and backslash in octal."""
    return os.fsdecode(field).encode("latin-1", "backslashreplace").decode("unicode_escape")


def remount_argv(quota: DiskQuota, where: str = "/tmp") -> list[str]:
    """A command prefix that sets the quota of the tmpfs at `where` (bwrap made it; its --size sets no inode
    cap) in the caller's mount namespace, then runs the rest; it stops with 125 if it cannot. Root only (it runs
    before the sandbox drops to its uid); [] where that cannot be done."""
    exe = shutil.which("mount")
    if not exe or not can_mount():
        return []
    script = f'{exe} -o remount,{quota.options()} {where} || exit 125; exec "$@"'
    return ["/bin/sh", "-c", script, "sftree-tmp-quota"]
