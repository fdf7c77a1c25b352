"""Confine untrusted commands (the agent's shell, graded code) with bubblewrap (`agent.sandbox: auto|bwrap|none`).

The sandbox is an allow-list (docs/security.md): a fresh root holding only the system toolchain (`/usr`, the
`/bin`, `/lib*` links, `/etc`) and the running Python's installation, all read-only, plus what the caller binds
(the workspace read-write, the coral client read-only), a private /tmp, /dev and /proc. Nothing else of the host
exists inside: not the project checkout, not the tree store, not the snapshots, not $HOME. `hidden` paths are
still covered by empty tmpfs in case one lies under an exposed folder.

Privileges: a user namespace (`--unshare-user`) with every capability dropped and nested user namespaces
disabled, new PID/IPC/network namespaces, `--die-with-parent`, `--new-session`. When sftree runs as root the
command is started as an unprivileged host uid from `SANDBOX_UID_BASE` (`sandbox_uid()`), so the kernel counts
its processes: `prlimit` caps processes (RLIMIT_NPROC), data memory (RLIMIT_DATA), file size and core dumps.
`none` runs commands unconfined: trusted tests only, and the outputs say so (tree.json `sandbox`).
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sftree.errors import InputError
from sftree.runtime import diskquota
from sftree.runtime.safefs import DIR_FLAGS

CORAL_MOUNT = "/tmp/.coral"
ENV_KEEP = ("LANG", "LC_ALL", "TZ")
SYSTEM_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
SANDBOX_UID_BASE = 200000  # unprivileged host uids handed to sandboxes when sftree runs as root
_UID_SLOTS = 4096


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed command (per process tree; RLIMIT_NPROC per uid)."""

    nproc: int = 512
    data_mb: int = 16384
    fsize_mb: int = 4096


AGENT_LIMITS = Limits()


@functools.cache
def bwrap_flags() -> tuple[str, ...]:
    exe = shutil.which("bwrap")
    if not exe:
        return ()
    try:
        text = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(f for f in ("--disable-userns", "--cap-drop", "--size") if f in text)


def probe_argv() -> list[str]:
    """The isolation the sandbox relies on, tried once: user namespace, no capabilities, no network."""
    return bwrap_argv(
        ["/bin/sh", "-c", 'test "$(id -u)" != 0 || test -z "$SUDO_UID"'], cwd="/", uid=sandbox_uid(0)
    )


@functools.cache
def bwrap_works() -> bool:
    """bwrap is installed and can build the whole sandbox here (it cannot in some containers)."""
    if not shutil.which("bwrap") or "--cap-drop" not in bwrap_flags():
        return False
    try:
        proc = subprocess.run(wrap_limits(probe_argv(), AGENT_LIMITS), capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def resolve_mode(mode: str) -> str:
    """`auto` and `bwrap` need a working bubblewrap (a clear error otherwise); only an explicit `none` runs
    unconfined."""
    if mode == "none":
        return "none"
    if mode not in ("auto", "bwrap"):
        raise InputError(f"agent.sandbox: unknown mode {mode!r} (auto | bwrap | none)")
    if not bwrap_works():
        raise InputError(
            f"agent.sandbox is `{mode}` but bubblewrap cannot isolate here (not installed, too old for "
            "--cap-drop, or user namespaces are disabled): apt-get install bubblewrap, or set "
            "agent.sandbox: none explicitly to make data WITHOUT a sandbox (the report and dataset card say so)"
        )
    return "bwrap"


# ---- identity and limits -----------------------------------------------------------------------------------
def sandbox_uid(slot: int) -> int | None:
    """The host uid a sandbox runs as: an unprivileged one when sftree is root, else None (our own uid)."""
    if os.geteuid() != 0:
        return None
    return SANDBOX_UID_BASE + (os.getpid() * 7 + slot) % _UID_SLOTS


def is_sandbox_uid(uid: int) -> bool:
    return SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + _UID_SLOTS


class UidPool:
    """Distinct uids for sandboxes running at once in this process (so each gets its own process cap)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: set[int] = set()

    def acquire(self) -> int | None:
        with self._lock:
            for slot in range(_UID_SLOTS):
                uid = sandbox_uid(slot)
                if uid is None:
                    return None
                if uid not in self._used:
                    self._used.add(uid)
                    return uid
        return sandbox_uid(0)

    def release(self, uid: int | None) -> None:
        with self._lock:
            self._used.discard(uid)


UIDS = UidPool()


def give_to(root: Path, uid: int | None, skip: str | None = None) -> None:
    """Hand a workspace to the sandbox uid (without following links), so the agent can write it; `skip`: a
    name directly under `root` left as it is (handed over by its owner: EdgeWorkspace.hand_to)."""
    if uid is None:
        return
    root = Path(root)
    own(str(root), uid)
    if os.path.isdir(root) and not os.path.islink(root):
        fd = os.open(root, DIR_FLAGS)
        try:
            own_below(fd, uid, skip=skip)
        finally:
            os.close(fd)


def own_below(dfd: int, uid: int, skip: str | None = None) -> None:
    """Give everything under folder `dfd` (but its entry `skip`) to `uid`, never following a link. A loop over
    folder descriptors, one per level: no recursion and no long paths (os.walk recurses before Python 3.12, and
    an agent can nest folders deeper than its limit). A folder that cannot be listed is skipped, as os.walk
    would."""

    def give(fd: int, skip: str | None) -> list[str]:
        """Give the entries of folder `fd`; its subfolders."""
        try:
            with os.scandir(fd) as it:
                entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        except OSError:
            return []
        subdirs = []
        for name, is_dir in entries:
            if name == skip:
                continue
            try:
                own(name, uid, dir_fd=fd)
            except FileNotFoundError:
                continue
            if is_dir:
                subdirs.append(name)
        return subdirs

    top = os.dup(dfd)
    stack: list[tuple[int, list[str]]] = [(top, [])]
    try:
        stack[0] = (top, give(top, skip))
        while stack:
            fd, todo = stack[-1]
            if not todo:
                os.close(stack.pop()[0])
                continue
            name = todo.pop()
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:  # gone, or a link or file swapped in: nothing to give
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    raise
                continue
            stack.append((sub, []))
            stack[-1] = (sub, give(sub, None))
    finally:
        for fd, _t in stack:
            os.close(fd)


def own(path: str, uid: int, dir_fd: int | None = None) -> os.stat_result:
    """lchown (`path` relative to `dir_fd` if given), skipped when already so (a chown changes the file's ctime,
    which the next snapshot's stat cache would take for a change).
    Returns what lstat found (before the change of owner)."""
    st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    if st.st_uid != uid or st.st_gid != uid:
        os.chown(path, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
    return st


def _own_tasks(uid: int) -> int:
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                continue
    return n


def wait_gone(uid: int | None, timeout: float = 2.0) -> bool:
    """Wait until no process of the sandbox uid is left; False when some still are after `timeout` s. bwrap exits
    as soon as the command's shell does, and the sandbox's other processes are killed just after: until they are
    gone one may still write, so a command returns (and the host reads the workspace) only then. None (our own
    uid): nothing to wait for."""
    if uid is None:
        return True
    end = time.monotonic() + timeout
    while _own_tasks(uid):
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def wrap_limits(argv: list[str], limits: Limits, uid: int | None = None) -> list[str]:
    """Prefix `prlimit` so the sandbox starts under the limits. RLIMIT_NPROC counts every task of the uid, so
    when we share our own uid (not root) the cap is on top of what already runs."""
    exe = shutil.which("prlimit")
    if not exe:
        return argv
    nproc = limits.nproc if uid is not None or os.geteuid() == 0 else _own_tasks(os.getuid()) + limits.nproc
    mb = 1024 * 1024
    return [
        exe,
        f"--nproc={nproc}",
        f"--data={limits.data_mb * mb}",
        f"--fsize={limits.fsize_mb * mb}",
        "--core=0",
        "--",
        *argv,
    ]


# ---- environment -------------------------------------------------------------------------------------------
def _visible_path_dirs() -> list[str]:
    """PATH inside: the running Python's bin folder, then the system folders (shims under $HOME do not exist)."""
    return [str(Path(sys.executable).parent), *SYSTEM_PATH.split(":")]


def scrubbed_env(coral_env: dict[str, str], *, sandboxed: bool, workspace: Path) -> dict[str, str]:
    """Only harmless variables survive (no API keys, tokens, proxies); the coral client comes first on PATH."""
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    env.setdefault("LANG", "C.UTF-8")
    if sandboxed:
        coral_bin, coral_sock = f"{CORAL_MOUNT}/bin", f"{CORAL_MOUNT}/coral.sock"
        env["HOME"] = env["TMPDIR"] = "/tmp"
        path = ":".join(_visible_path_dirs())
    else:
        coral_bin, coral_sock = coral_env["CORAL_BIN"], coral_env["CORAL_SOCKET"]
        env["HOME"] = str(workspace)
        path = os.environ.get("PATH", SYSTEM_PATH)
    env["PATH"] = f"{coral_bin}:{path}"
    env["CORAL_SOCKET"] = coral_sock
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["TERM"] = "dumb"
    return env


CREDENTIAL_PATHS = (
    ".ssh",
    ".aws",
    ".config",
    ".gnupg",
    ".docker",
    ".kube",
    ".netrc",
    ".git-credentials",
    ".pypirc",
    ".npmrc",
    ".claude",
    ".cache",
)


def private_home_paths() -> list[Path]:
    """What of $HOME to hide should it be exposed: all of it, unless the Python or sftree itself lives there
    (a pyenv or venv under $HOME), then the usual credential folders and files. (The allow-list exposes no
    part of $HOME but the Python installation; this is belt and braces.)"""
    home = Path.home().resolve()
    needed = [Path(sys.prefix), Path(sys.base_prefix), Path(__file__)]
    if not any(p.resolve().is_relative_to(home) for p in needed):
        return [home]
    return [home / name for name in CREDENTIAL_PATHS]


def python_roots() -> list[str]:
    """Folders the running Python needs: its prefix, its base installation and the resolved interpreter's."""
    exe = Path(sys.executable).resolve()
    roots = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), exe.parent.parent}
    return sorted(str(r) for r in roots)


def project_checkout() -> Path | None:
    """The sftree checkout this code runs from (editable install or PYTHONPATH), hidden from every sandbox."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src" / "sftree").is_dir():
            return parent
    return None


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def bwrap_argv(
    command: list[str],
    *,
    cwd: str | Path,
    binds: Sequence[tuple[str | Path, str | Path]] = (),
    ro_binds: Sequence[tuple[str | Path, str | Path]] = (),
    hidden: Sequence[Path] = (),
    keep_visible: Sequence[str | Path] = (),
    new_session: bool = True,
    uid: int | None = None,
    tmp_bytes: int | None = None,
    tmp_inodes: int | None = None,
    tmp_dir: str | Path | None = None,
) -> list[str]:
    """The bwrap command line shared by every backend: an allow-list root (module docstring), `hidden`
    folders covered by empty tmpfs (files by /dev/null) where they lie under an exposed folder, the running
    Python and `keep_visible` re-exposed read-only, then the read-write `binds` and the read-only `ro_binds`
    (source, destination), in that order (a read-only bind inside a read-write one covers it). Sources are
    host paths the agent cannot change (bwrap follows a link in a source).

    The private /tmp (docs/security.md, "Disk quotas"): `tmp_dir`, a host folder on a quota tmpfs (a grading's),
    or a fresh tmpfs of `tmp_bytes` (bwrap --size) whose inodes are capped at `tmp_inodes` by a remount in the
    sandbox's mount namespace before it drops to `uid` (root only: unprivileged, the bytes alone are capped).

    With `uid` (sftree is root): the mounts are made as root (it can read a Python under /root), then
    `setpriv` becomes `uid` with no capabilities and an inner bwrap puts it in a user namespace with nested
    ones disabled. Without: one unprivileged bwrap (our own uid) in a user namespace, capabilities dropped."""
    flags = bwrap_flags()
    userns = ["--unshare-user", "--cap-drop", "ALL"]
    if "--disable-userns" in flags:
        userns.append("--disable-userns")
    argv = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--die-with-parent"]
    if uid is None:
        argv += userns
    if new_session:
        argv.append("--new-session")
    roots, exposed = _system_roots()
    argv += roots
    argv += ["--dev", "/dev", "--proc", "/proc"]
    tmp, remount = _private_tmp(flags, uid, tmp_dir, tmp_bytes, tmp_inodes)
    argv += tmp
    argv += _hidden(hidden, exposed)
    argv += _mounts(binds, ro_binds, keep_visible, exposed)
    if uid is None:
        return argv + ["--chdir", str(cwd), "--", *command]
    return argv + ["--chdir", "/", "--", *remount, *_as_uid(uid, userns, cwd, command)]


def _system_roots() -> tuple[list[str], list[str]]:
    """The allow-list root's arguments (each system folder read-only, each link as itself) and the folders it
    exposes."""
    argv: list[str] = []
    exposed = []
    for root in SYSTEM_ROOTS:
        p = Path(root)
        if p.is_symlink():
            argv += ["--symlink", os.readlink(p), root]
        elif p.is_dir():
            argv += ["--ro-bind", root, root]
            exposed.append(root)
    return argv, exposed


def _private_tmp(
    flags: tuple[str, ...],
    uid: int | None,
    tmp_dir: str | Path | None,
    tmp_bytes: int | None,
    tmp_inodes: int | None,
) -> tuple[list[str], list[str]]:
    """The private /tmp's arguments, and the remount that caps its inodes in the sandbox (empty: none)."""
    argv: list[str] = []
    remount: list[str] = []
    if tmp_dir is not None:
        argv += ["--bind", str(tmp_dir), "/tmp"]
    else:
        argv += ["--perms", "1777"]
        argv += ["--size", str(tmp_bytes)] if tmp_bytes and "--size" in flags else []
        argv += ["--tmpfs", "/tmp"]
        if tmp_bytes and tmp_inodes and uid is not None:
            remount = diskquota.remount_argv(diskquota.DiskQuota(tmp_bytes, tmp_inodes))
    return argv, remount


def _hidden(hidden: Sequence[Path], exposed: list[str]) -> list[str]:
    """`hidden` and the project's checkout, where they lie under an exposed folder: a folder covered by an
    empty tmpfs, a file by /dev/null."""
    argv: list[str] = []
    checkout = project_checkout()
    hidden_all = [*hidden, *([checkout] if checkout else [])]
    hidden_set = sorted({str(Path(p).resolve()) for p in hidden_all if p and Path(p).exists()})
    for h in hidden_set:
        if any(_under(h, e) for e in exposed):
            argv += ["--tmpfs", h] if Path(h).is_dir() else ["--ro-bind", "/dev/null", h]
    return argv


def _mounts(
    binds: Sequence[tuple[str | Path, str | Path]],
    ro_binds: Sequence[tuple[str | Path, str | Path]],
    keep_visible: Sequence[str | Path],
    exposed: list[str],
) -> list[str]:
    """The running Python and `keep_visible` read-only, then `binds` read-write and `ro_binds` read-only, each
    mount point's missing parents made first."""
    argv: list[str] = []
    mounts = [
        ("--ro-bind", p, p)
        for p in sorted(set(python_roots()) | {str(Path(k).resolve()) for k in keep_visible})
    ]
    mounts = [m for m in mounts if Path(m[1]).exists()]
    mounts += [("--bind", str(src), str(dst)) for src, dst in binds]
    mounts += [("--ro-bind", str(src), str(dst)) for src, dst in ro_binds]
    made = {"/", "/tmp", *SYSTEM_ROOTS}
    for kind, src, dst in mounts:
        # Folders leading to a mount point are made traversable (bwrap would copy a 0700 /root or /tmp/x).
        for parent in reversed(Path(dst).parents):
            if str(parent) not in made and not any(_under(str(parent), e) for e in exposed):
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        argv += [kind, src, dst]
        made.add(str(dst))  # a later mount inside this one needs no --dir over it
    return argv


def _as_uid(uid: int, userns: list[str], cwd: str | Path, command: list[str]) -> list[str]:
    """What runs inside the root-made mounts: `setpriv` to `uid` with no capabilities, then an inner bwrap in a
    user namespace."""
    drop = [
        shutil.which("setpriv") or "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    ]
    # Device nodes reached through a mount made in another user namespace cannot be opened: a fresh /dev.
    inner = ["bwrap", *userns, "--bind", "/", "/", "--dev", "/dev", "--chdir", str(cwd), "--", *command]
    return [*drop, *inner]
