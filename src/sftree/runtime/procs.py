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
import time
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
    **popen_kwargs,
) -> GroupResult:
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        **popen_kwargs,
    )
    bufs = {proc.stdout: bytearray()}
    if proc.stderr is not None:
        bufs[proc.stderr] = bytearray()
    dropped = 0
    deadline = time.monotonic() + max(0.0, timeout)
    timed_out = False
    with selectors.DefaultSelector() as sel:
        for fh in bufs:
            sel.register(fh, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                _kill(proc)
                break
            for key, _ in sel.select(timeout=min(left, 1.0)):
                chunk = os.read(key.fd, _CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.fileobj]
                room = max_output - len(buf)
                if room > 0:
                    buf += chunk[:room]
                dropped += max(0, len(chunk) - max(room, 0))
    if not timed_out:
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
    rc = None if timed_out else proc.returncode
    return GroupResult(rc, bytes(bufs[proc.stdout]), err, timed_out, dropped)
