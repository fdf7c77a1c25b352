"""How every command of one edge runs: the agent's shell, its file tools, OpenCode, the agent's own git.

Under bubblewrap (sandbox.py) the command sees the edge's run directory at `agent.run_dir` (read-write), its
attempt records and `.coral/config.yaml` read-only over it, the `coral` client read-only at /tmp/.coral, a
private /tmp of `agent.quota.tmp_mib` and `tmp_inodes`, and nothing else of the host but the toolchain. It runs as the edge's
sandbox user (sftree is root) under AGENT_LIMITS, and returns once that user has no process left.

The disk quota (`agent.quota`): while a command runs, the edge's writable folders are measured every
`CHECK_EVERY` s (folderreader.usage, bounded) and the command is stopped when they pass the quota; a file cannot
outgrow `file_mib` (RLIMIT_FSIZE); /tmp is a tmpfs of `tmp_mib` and (as root) `tmp_inodes` files, a fresh one for
each command, so the kernel refuses a write past it (ENOSPC; runtime/diskquota.py). So an agent writes at most about
`CHECK_EVERY` s of disk speed past the quota before it is stopped, and the next snapshot refuses a workspace
over it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from sftree.runtime import agentrepo
from sftree.runtime.folderreader import QuotaExceeded, usage
from sftree.runtime.procs import GroupResult, run_group
from sftree.runtime.sandbox import (
    AGENT_LIMITS,
    CORAL_MOUNT,
    Limits,
    bwrap_argv,
    scrubbed_env,
    wait_gone,
    wrap_limits,
)
from sftree.runtime.workspace import CACHE_DIRS, CORAL_MANAGED, EdgeWorkspace, knowledge_skip

CHECK_EVERY = 0.5
USAGE_DEPTH = (
    512  # deeper than this the quota counts as passed (each level holds a descriptor while measured)
)
EXCLUDE = "".join(f"{name}\n" for name in sorted(CORAL_MANAGED | CACHE_DIRS | {"*.pyc"}))  # the agent's .git


@dataclass
class EdgeBox:
    """The sandbox of one edge (module docstring)."""

    ws: EdgeWorkspace
    mode: str  # bwrap | none
    tmp_bytes: int  # its /tmp (config `agent.quota.tmp_mib`)
    tmp_inodes: int  # (`agent.quota.tmp_inodes`)
    coral_dir: Path | None = None  # host folder of the coral client and socket
    coral_env: dict[str, str] = field(default_factory=dict)  # CORAL_SOCKET, CORAL_BIN (host paths)
    hidden: list[Path] = field(default_factory=list)
    ro_extra: list[tuple[Path, str]] = field(default_factory=list)  # more read-only binds (a Coral install)
    watched: list[Path] = field(default_factory=list)  # more writable folders the quota counts
    limits: Limits | None = None  # AGENT_LIMITS with no file larger than the quota's `file_bytes`
    python: str = sys.executable  # visible inside (sandbox.python_roots)

    def __post_init__(self) -> None:
        if self.limits is None:
            self.limits = replace(AGENT_LIMITS, fsize_mb=max(1, self.ws.quota.file_bytes >> 20))

    @property
    def sandboxed(self) -> bool:
        return self.mode == "bwrap"

    @property
    def uid(self) -> int | None:
        return self.ws.uid

    @property
    def worktree(self) -> str:
        """The agent's cwd as it sees it."""
        return self.ws.paths.worktree_inside if self.sandboxed else str(self.ws.root)

    def inside(self, host: Path) -> str:
        """Where a host path under the run directory is, as the agent sees it."""
        rel = Path(host).relative_to(self.ws.paths.run)
        return f"{self.ws.paths.inside}/{rel}" if self.sandboxed else str(host)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = scrubbed_env(self.coral_env, sandboxed=self.sandboxed, workspace=Path(self.ws.root))
        env["CORAL_WORKTREE"] = self.worktree
        if self.coral_env.get("CORAL_CLI"):
            env["CORAL_CLI"] = self.coral_env["CORAL_CLI"]  # the read-only commands' CLI (sftree.world)
        env.update(extra or {})
        return env

    def binds(self) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]]]:
        """(read-write, read-only) binds of the edge's world; every source is a host folder the agent cannot
        change (its files under run/ are reached through the run directory's own bind)."""
        p = self.ws.paths
        rw = [(p.run, p.inside)]
        ro = [(p.attempts, f"{p.coral_inside}/public/attempts")]
        if (p.host / "config.yaml").is_file():
            ro.append((p.host / "config.yaml", f"{p.coral_inside}/config.yaml"))
        if self.coral_dir is not None:
            ro.append((self.coral_dir, CORAL_MOUNT))
        return rw, ro + list(self.ro_extra)

    def argv(
        self,
        command: list[str],
        *,
        cwd: str | None = None,
        binds: Sequence[tuple[Path, str]] = (),
        ro_binds: Sequence[tuple[Path, str]] = (),
        limits: Limits | None = None,
        keep_visible: Sequence[Path] = (),
        new_session: bool = True,
    ) -> list[str]:
        """The command line that runs `command` in this edge's sandbox (or as it is, without one)."""
        if not self.sandboxed:
            return wrap_limits(list(command), limits or self.own_limits)
        rw, ro = self.binds()
        argv = bwrap_argv(
            list(command),
            cwd=cwd or self.worktree,
            binds=[*rw, *binds],
            ro_binds=[*ro, *ro_binds],
            hidden=self.hidden,
            keep_visible=list(keep_visible),
            new_session=new_session,
            uid=self.uid,
            tmp_bytes=self.tmp_bytes,
            tmp_inodes=self.tmp_inodes,
        )
        return wrap_limits(argv, limits or self.own_limits, self.uid)

    @property
    def own_limits(self) -> Limits:
        """The box's limits (`__post_init__` fills in the default)."""
        assert self.limits is not None
        return self.limits

    def over_quota(self) -> str | None:
        """Why the edge's writable folders are over the quota (entries, bytes), or None. Folders may nest deeper
        than a commit takes (`Quota.depth`), up to USAGE_DEPTH."""
        q = replace(self.ws.quota, depth=USAGE_DEPTH)
        try:
            seen = usage(self.ws.root, q)
            seen = usage(self.ws.paths.public, q, knowledge_skip, start=seen)
            for d in self.watched:
                if d.is_dir():
                    seen = usage(d, q, start=seen)
        except QuotaExceeded as exc:
            return f"disk quota exceeded: {exc}"
        except OSError:
            return None  # a folder the agent removed or replaced: nothing to count there
        return None

    def run(
        self,
        command: list[str],
        *,
        timeout: float,
        cwd: str | None = None,
        input: bytes | IO[bytes] | None = None,
        max_output: int = 1 << 20,
        merge_stderr: bool = True,
        env: dict[str, str] | None = None,
    ) -> GroupResult:
        """Run `command` in the sandbox under the quota; returns once none of its processes is left."""
        host_cwd = None if self.sandboxed else (cwd or self.worktree)
        res = run_group(
            self.argv(command, cwd=cwd),
            timeout=timeout,
            merge_stderr=merge_stderr,
            max_output=max_output,
            input=input,
            check=self.over_quota,
            check_every=CHECK_EVERY,
            env=self.env(env),
            cwd=host_cwd or "/",
        )
        if self.sandboxed:
            wait_gone(self.uid)
        if not res.stopped:  # it may have written past the quota between two checks
            res.stopped = self.over_quota()
        return res

    def init_repo(self) -> str | None:
        """Give the worktree its own git repository holding the branch (agentrepo.py); an error text, or None."""
        with self.ws.repo_update(self.ws.head, None) as stream:
            res = self.run(
                ["/bin/sh", "-c", agentrepo.INIT_SCRIPT],
                timeout=120,
                input=stream,
                env={"SFTREE_EXCLUDE": EXCLUDE},
            )
        if res.returncode != 0:
            return (res.stdout.decode("utf-8", "replace").strip() or "failed")[-500:]
        return None


def own_socket_dir(path: Path, uid: int | None) -> None:
    """The sandbox user may connect to the coral socket (it is bound read-only; connecting needs write)."""
    if uid is not None:
        for p in (path, *path.iterdir()):
            os.chown(p, uid, uid, follow_symlinks=False)
