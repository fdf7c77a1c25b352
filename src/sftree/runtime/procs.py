"""Run a command in its own process group, killing the whole group when it overruns its timeout.

A grader or an agent's shell command may start children (a test runner, a background job); killing only the
shell would leave them running and holding the output pipes open. Output is read as it comes and only the
first `max_output` bytes of each stream are kept (the rest is counted and dropped), so a command printing
gigabytes costs no memory.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_MAX_OUTPUT = 16 * 1024 * 1024
_CHUNK = 65536


@dataclass
class GroupResult:
    returncode: int | None  # None when it was killed for its timeout
    stdout: bytes
    stderr: bytes  # empty when stderr was merged into stdout
    timed_out: bool
    dropped: int = 0  # bytes read past max_output and thrown away (both streams)
    stopped: str | None = None  # why `check` stopped it (then returncode is None too)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_group(
    argv,
    *,
    timeout: float,
    merge_stderr: bool = False,
    max_output: int = DEFAULT_MAX_OUTPUT,
    input: bytes | None = None,
    check: Callable[[], str | None] | None = None,
    check_every: float = 0.5,
    **popen_kwargs,
) -> GroupResult:
    """`input`: bytes for its stdin (else none); `check`: called every `check_every` s while it runs, a reason
    it returns kills the group (a quota: `GroupResult.stopped`)."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
        start_new_session=True,
        **popen_kwargs,
    )
    if input is not None:
        threading.Thread(target=_feed, args=(proc.stdin, input), daemon=True).start()
    bufs = {proc.stdout: bytearray()}
    if proc.stderr is not None:
        bufs[proc.stderr] = bytearray()
    dropped = 0
    deadline = time.monotonic() + max(0.0, timeout)
    timed_out = False
    stopped = None
    next_check = time.monotonic() + check_every
    with selectors.DefaultSelector() as sel:
        for fh in bufs:
            sel.register(fh, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                timed_out = True
                _kill(proc)
                break
            if check is not None and now >= next_check:
                next_check = now + check_every
                stopped = check()
                if stopped:
                    _kill(proc)
                    break
            wait = min(left, 1.0, check_every if check is not None else 1.0)
            for key, _ in sel.select(timeout=wait):
                chunk = os.read(key.fd, _CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.fileobj]
                room = max_output - len(buf)
                if room > 0:
                    buf += chunk[:room]
                dropped += max(0, len(chunk) - max(room, 0))
    if stopped:
        proc.wait()
    elif not timed_out:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out:
        _kill(proc)
        proc.wait()
    else:
        _kill(proc)  # a background job the command left behind (it closed its output pipes)
    for fh in bufs:
        fh.close()
    err = bytes(bufs[proc.stderr]) if proc.stderr is not None else b""
    rc = None if timed_out or stopped else proc.returncode
    return GroupResult(rc, bytes(bufs[proc.stdout]), err, timed_out, dropped, stopped)


def _feed(stream, data: bytes) -> None:
    try:
        stream.write(data)
    except (OSError, ValueError):  # it exited without reading it all
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass
