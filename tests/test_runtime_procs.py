"""The one process-group stop (runtime/procs.py), used by the Teacher servers, the fleet and the OpenCode driver:
a whole group goes, whether it handles SIGTERM, ignores it, or is stopped (SIGSTOP)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from sftree.runtime.procs import kill_group, stop_group

# A leader that starts a child in its group, then waits; `ignore` makes both ignore SIGTERM.
CODE = """
import signal, subprocess, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\\n"
                          "if sys.argv[1] == 'ignore': signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
                          "time.sleep(60)", sys.argv[1]])
print(child.pid, flush=True)
time.sleep(60)
"""


def start(mode: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CODE, mode], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child = int(proc.stdout.readline())
    return proc, child


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:  # a zombie waiting for its (killed) parent's reaper is gone too
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


def wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("mode", ["handles", "ignore", "stopped"])
def test_stop_group_ends_the_whole_group(mode):
    proc, child = start("ignore" if mode == "ignore" else "handles")
    if mode == "stopped":
        os.killpg(proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    stop_group(proc, grace=1)
    assert proc.returncode is not None  # reaped
    assert wait_gone(child), "a child of the group survived"
    took = time.monotonic() - t0
    assert (took >= 1) if mode == "ignore" else (took < 1), took  # SIGKILL only after the grace
    stop_group(proc, grace=1)  # already gone: nothing to do


def test_kill_group_kills_at_once():
    proc, child = start("ignore")
    kill_group(proc)
    proc.wait(timeout=5)
    assert proc.returncode == -signal.SIGKILL and wait_gone(child)
    kill_group(proc)  # reaped already: no error
