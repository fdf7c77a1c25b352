"""Run the agent's shell commands confined: bubblewrap when available (`agent.sandbox: auto|bwrap|none`).

Inside bwrap: the whole filesystem read-only, the workspace read-write, a private /tmp, no network
(`--unshare-net`), and these paths replaced by empty tmpfs so they cannot be read: the tree directory (store,
sessions, other branches' worktrees), the task folder (grader), the results folder and $HOME (or, when the
Python running sftree lives under $HOME, its credential folders and files). The coral client
and its socket are bound at CORAL_MOUNT. Without bwrap (`none`), commands still run with the workspace as cwd
and a scrubbed environment, but nothing stops them from reading outside it: use `none` only for trusted tests.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from sftree.errors import InputError

CORAL_MOUNT = "/tmp/.coral"
ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "TERM")


@functools.cache
def bwrap_works() -> bool:
    """bwrap is installed and can create namespaces here (it cannot in some containers)."""
    exe = shutil.which("bwrap")
    if not exe:
        return False
    try:
        proc = subprocess.run(
            [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net", "true"],
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def resolve_mode(mode: str) -> str:
    """`auto` -> bwrap when it works, else none; `bwrap` when it does not work is an error."""
    if mode == "none":
        return "none"
    if mode == "bwrap":
        if not bwrap_works():
            raise InputError(
                "agent.sandbox is `bwrap` but bubblewrap is not installed or cannot create "
                "namespaces here (apt-get install bubblewrap, or set agent.sandbox: none)"
            )
        return "bwrap"
    if mode == "auto":
        return "bwrap" if bwrap_works() else "none"
    raise InputError(f"agent.sandbox: unknown mode {mode!r} (auto | bwrap | none)")


def scrubbed_env(coral_env: dict[str, str], *, sandboxed: bool, workspace: Path) -> dict[str, str]:
    """Only harmless variables survive (no API keys, tokens, proxies); the coral client comes first on PATH."""
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    if sandboxed:
        coral_bin, coral_sock = f"{CORAL_MOUNT}/bin", f"{CORAL_MOUNT}/coral.sock"
        env["HOME"] = env["TMPDIR"] = "/tmp"
    else:
        coral_bin, coral_sock = coral_env["CORAL_BIN"], coral_env["CORAL_SOCKET"]
        env["HOME"] = str(workspace)
    env["PATH"] = f"{coral_bin}:{env['PATH']}"
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
    """What of $HOME to hide: all of it, unless the Python or sftree itself lives there (a pyenv or venv
    under $HOME), then the usual credential folders and files."""
    import sys

    home = Path.home().resolve()
    needed = [Path(sys.prefix), Path(sys.base_prefix), Path(__file__)]
    if not any(p.resolve().is_relative_to(home) for p in needed):
        return [home]
    return [home / name for name in CREDENTIAL_PATHS]


def python_roots() -> list[str]:
    """Folders the running Python needs: its prefix, its base installation and the resolved interpreter's."""
    import sys

    exe = Path(sys.executable).resolve()
    roots = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), exe.parent.parent}
    return sorted(str(r) for r in roots)


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def bwrap_argv(
    command: list[str],
    *,
    cwd: str | Path,
    binds: list[tuple[str | Path, str | Path]] = (),
    ro_binds: list[tuple[str | Path, str | Path]] = (),
    hidden: list[Path] = (),
    keep_visible: list[str | Path] = (),
    new_session: bool = True,
) -> list[str]:
    """The bwrap command line shared by every backend: `/` read-only, a private /tmp, no network, `hidden`
    folders replaced by empty tmpfs (files by /dev/null), then `keep_visible` and the running Python re-exposed
    read-only where a hidden folder or /tmp covered them (a venv in /tmp, a pyenv under $HOME), then the
    read-write `binds` and read-only `ro_binds` (source, destination)."""
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    argv += ["--unshare-net", "--unshare-ipc", "--unshare-pid", "--die-with-parent"]
    if new_session:
        argv.append("--new-session")
    hidden_set = sorted({str(Path(p).resolve()) for p in hidden if p and Path(p).exists()})
    for h in hidden_set:
        if _under(h, "/tmp"):  # /tmp is a fresh tmpfs already
            continue
        argv += ["--tmpfs", h] if Path(h).is_dir() else ["--ro-bind", "/dev/null", h]
    covered = ["/tmp", *hidden_set]
    for p in sorted(set(python_roots()) | {str(Path(k).resolve()) for k in keep_visible}):
        if any(_under(p, c) for c in covered):
            argv += ["--ro-bind", p, p]
    for src, dst in binds:
        argv += ["--bind", str(src), str(dst)]
    for src, dst in ro_binds:
        argv += ["--ro-bind", str(src), str(dst)]
    return argv + ["--chdir", str(cwd), "--", *command]
