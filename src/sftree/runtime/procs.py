"""Run a command in its own process group, killing the whole group when it overruns its timeout.

A grader or an agent's shell command may start children (a test runner, a background job); killing only the
shell would leave them running and holding the output pipes open. Output is read as it comes by the one bounded
reader (runtime/bounded.py) and only the first `max_output` bytes of each stream are kept (the rest is counted
and dropped), so a command printing gigabytes costs no memory and never blocks on a full pipe.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, TypeAlias

from sftree.runtime.bounded import Capped, Readable, drain

# a started process, its pipes bytes or text (what the callers of kill_group and stop_group hold)
Process: TypeAlias = subprocess.Popen[bytes] | subprocess.Popen[str]

DEFAULT_MAX_OUTPUT = 16 * 1024 * 1024


@dataclass
class GroupResult:
    returncode: int | None  # None when it was killed for its timeout
    stdout: bytes
    stderr: bytes  # empty when stderr was merged into stdout
    timed_out: bool
    dropped: int = 0  # bytes read past max_output and thrown away (both streams)
    stopped: str | None = None  # why `check` stopped it (then returncode is None too)


def kill_group(proc: Process) -> None:
    """SIGKILL to the process group `proc` leads (started with `start_new_session`), and to `proc` itself should
    it not lead one; a group already gone is no error. Not reaped: the caller waits."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.kill()  # a no-op once it was reaped


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (its children, theirs, ...), read from /proc: a process of a run started in a
    session of its own (a server, a grader) or inside a sandbox's PID namespace is still below it there."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def signal_descendants(pid: int, sig: int = signal.SIGKILL, rounds: int = 3) -> int:
    """`sig` to every process below `pid` (not `pid` itself), the tree read again each round so a child forked
    meanwhile is met too; returns how many processes it signalled."""
    hit: set[int] = set()
    for _ in range(rounds):
        fresh = [p for p in descendants(pid) if p not in hit]
        if not fresh:
            break
        for p in fresh:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
            hit.add(p)
    return len(hit)


def stop_group(proc: Process, grace: float = 10) -> None:
    """Stop a server's process group and reap it: SIGCONT (a stopped process cannot handle SIGTERM) and SIGTERM
    to the group, `grace` seconds to exit, then SIGKILL. Nothing to do if it already exited."""
    if proc.poll() is not None:
        return
    try:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        proc.wait()


def run_group(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float,
    merge_stderr: bool = False,
    max_output: int = DEFAULT_MAX_OUTPUT,
    input: bytes | IO[bytes] | None = None,
    check: Callable[[], str | None] | None = None,
    check_every: float = 0.5,
    read_also: Mapping[int, Capped] | None = None,
    hand_fds: tuple[int, ...] = (),
    **popen_kwargs: Any,
) -> GroupResult:
    """`input`: bytes for its stdin, or a file of the host's it reads itself (a large stream is never held); else
    none; `check`: called every `check_every` s while it runs, a reason
    it returns kills the group (a quota: `GroupResult.stopped`); `read_also`: more descriptors it writes to
    (a result pipe), read with its outputs while it runs, into their Capped; `hand_fds`: descriptors passed to
    it and closed here (started or not) (the write end of such a pipe: its end comes when the group's is)."""
    try:
        proc: subprocess.Popen[bytes] = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            stdin=subprocess.DEVNULL
            if input is None
            else subprocess.PIPE
            if isinstance(input, bytes)
            else input,
            start_new_session=True,
            pass_fds=tuple(popen_kwargs.pop("pass_fds", ())) + tuple(hand_fds),
            **popen_kwargs,
        )
    finally:
        for fd in hand_fds:  # closed here in every case: the caller forgets them
            os.close(fd)
    if isinstance(input, bytes):
        threading.Thread(target=_feed, args=(proc.stdin, input), daemon=True).start()
    assert proc.stdout is not None  # (stdout=PIPE)
    bufs: dict[IO[bytes], Capped] = {proc.stdout: Capped(max_output)}
    if proc.stderr is not None:
        bufs[proc.stderr] = Capped(max_output)
    streams: dict[Readable, Capped] = {}
    for pipe, buf in bufs.items():
        streams[pipe] = buf
    for fd, buf in (read_also or {}).items():
        streams[fd] = buf
    deadline = time.monotonic() + max(0.0, timeout)
    why = drain(streams, deadline=deadline, watch=check, every=check_every)
    timed_out = why == "timeout"
    stopped = why if why and not timed_out else None
    if why:
        kill_group(proc)
        proc.wait()
    else:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc)
            proc.wait()
    kill_group(proc)  # a background job the command left behind (it closed its output pipes)
    for fh in bufs:
        fh.close()
    err = bufs[proc.stderr].data() if proc.stderr is not None else b""
    rc = None if timed_out or stopped else proc.returncode
    dropped = sum(b.dropped for b in bufs.values())
    return GroupResult(rc, bufs[proc.stdout].data(), err, timed_out, dropped, stopped)


def _feed(stream: IO[bytes], data: bytes) -> None:
    try:
        stream.write(data)
    except (OSError, ValueError):  # it exited without reading it all
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass
