"""A server started under the guard (runtime/guard.py: llama-server for `teacher.launch`) ends when the process
that started it ends, however it ended: a `kill -9` of that process leaves nothing running. Its exit code and the
signals sent to it pass through."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from sftree.runtime import guard
from sftree.runtime.procs import descendants

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
# a stand-in for `sftree explore`: starts a guarded server as teacher/llm_server.py does, says the guard's pid
STARTER = f"""
import subprocess, sys, time
from sftree.runtime.guard import guarded
p = subprocess.Popen(guarded({SLEEPER!r}), start_new_session=True, stdin=subprocess.DEVNULL)
print(p.pid, flush=True)
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie (a process whose parent died waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _wait(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_a_kill_9_of_the_starter_ends_the_guarded_server_within_seconds():
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True)
    server = None
    try:
        guard_pid = int(starter.stdout.readline())
        assert _wait(lambda: bool(descendants(guard_pid)), 20), "the guard started no server"
        server = descendants(guard_pid)[0]
        assert _running(server)
        starter.kill()
        starter.wait()
        assert _wait(lambda: not _running(server) and not _running(guard_pid), 3 * guard.POLL + 5), (
            "the server outlived the process that started it"
        )
    finally:
        starter.kill()
        starter.wait()
        if server is not None and _running(server):
            os.kill(server, signal.SIGKILL)


def test_the_guard_exits_with_the_servers_code_and_passes_sigterm_on():
    assert subprocess.run(guard.guarded(["sh", "-c", "exit 3"]), timeout=30).returncode == 3
    p = subprocess.Popen(guard.guarded(SLEEPER))
    try:
        assert _wait(lambda: bool(descendants(p.pid)), 20)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        p.kill()
        p.wait()
