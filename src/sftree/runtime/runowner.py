"""Resuming is the same command: what a killed run left in the working folder and the temp dir, cleared at the start
of the next run (called by the Snakefile while it is read, before Snakemake locks the folder).

Snakemake locks its working folder with files under `.snakemake/locks/` that name the run's files but not the
run: after a `kill -9`, a power loss or a preempted node they stay, and every later run stops with
`LockException` until someone runs `--unlock`. So each run of this workflow (the main Snakemake process) records
itself as `.snakemake/sftree-owners/<pid>-<start time>` (the start time from /proc tells a reused pid from the
owner). At the next start, locks with recorded owners none of which is alive are a dead run's: they are removed,
with a line saying so. A lock while any recorded owner lives is left alone (Snakemake then refuses to start, as
before: a live run's lock is never broken), and so is a lock no run of this workflow recorded (made by something
else: not ours to judge).

The same start removes the temporary folders of dead runs (`runtime.tempdirs.sweep`: every prefix, each folder
named with its owner's pid) and says how many.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from sftree.runtime import procs, tempdirs

OWNERS = "sftree-owners"


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); None when it is gone (or
    a zombie: it has finished)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces and parentheses
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def _alive(record: str) -> bool:
    pid, _, started = record.partition("-")
    return pid.isdigit() and start_time(int(pid)) == started


def clear_stale_lock(meta: str | os.PathLike[str], pid: int | None = None) -> str | None:
    """Under Snakemake's folder `meta` (`.snakemake`): remove the locks of a dead run and record `pid` (this run)
    as an owner; returns what was done when a lock was removed (else None)."""
    pid = os.getpid() if pid is None else pid
    owners = Path(meta) / OWNERS
    locks = Path(meta) / "locks"
    recorded = sorted(p.name for p in owners.iterdir()) if owners.is_dir() else []
    live = [r for r in recorded if _alive(r)]
    lock_files = sorted(locks.glob("*.lock")) if locks.is_dir() else []
    said = None
    if lock_files and recorded and not live:
        for f in lock_files:
            f.unlink(missing_ok=True)
        pids = ", ".join(r.partition("-")[0] for r in recorded)
        said = (
            f"removed the lock of a dead run (pid {pids}: no longer running): {len(lock_files)} lock file(s)"
        )
    for r in recorded:
        if r not in live:
            (owners / r).unlink(missing_ok=True)
    started = start_time(pid)
    if started is not None:
        owners.mkdir(parents=True, exist_ok=True)
        (owners / f"{pid}-{started}").touch()
    return said


def start_of_run(meta: str | os.PathLike[str], say: Callable[[str], None]) -> None:
    """At a run's start: a dead run's lock cleared and its temporary folders removed, each said in one line."""
    said = clear_stale_lock(meta)
    if said:
        say(f"sftree: {said}")
    gone = tempdirs.sweep(tempdirs.PREFIXES)
    if gone:
        say(f"sftree: removed {len(gone)} temporary folder(s) of dead runs: {', '.join(sorted(gone))}")


def forward_sigterm() -> None:
    """SIGTERM to this process (the main Snakemake process, from its `onstart`) goes first to every process
    below it, then to the handler that was there (Snakemake's, which then finds its jobs ended)."""
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: FrameType | None) -> None:
        procs.signal_descendants(os.getpid(), signal.SIGTERM, rounds=1)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)
