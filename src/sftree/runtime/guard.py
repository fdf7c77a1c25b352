"""A server started by an `sftree` process ends when that process does, however it ended.

`sftree explore` stops what it started when it ends or is sent SIGTERM (runtime/tempdirs.py), and a sandbox dies
with its parent (`bwrap --die-with-parent`); a server started outside a sandbox (llama-server for
`teacher.launch`, the fleet's workers and router) is another program, which cannot watch anything, so a
`kill -9` of the `sftree` process left it running. So such a server is started under this guard
(`guarded(command)`): a small Python process that starts the command as its child, passes signals on to it, and
polls its own parent; when the parent is gone (its parent pid changed: the process that started it died, however
it died), it sends SIGTERM to every process below it, then SIGKILL to what is left after `GRACE` seconds, and
exits. The caller sees one process (its pid leads the server's process group; `procs.stop_group` stops both) whose
exit code is the server's.

    python -m sftree.runtime.guard COMMAND [ARG...]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from sftree.runtime.procs import signal_descendants

POLL = 0.5  # seconds between looks at the parent
GRACE = 10.0  # seconds between SIGTERM and SIGKILL once the parent is gone


def guarded(command: list[str]) -> list[str]:
    """`command` run under the guard (this interpreter: the guard needs sftree, the server nothing of it)."""
    return [sys.executable, "-m", "sftree.runtime.guard", *command]


def _end_below(child: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to every process below this one, SIGKILL to any still there after `grace` seconds."""
    signal_descendants(os.getpid(), signal.SIGTERM, rounds=1)
    deadline = time.monotonic() + grace
    # (the child reaped as it ends: a zombie is still below us)
    while child.poll() is None or signal_descendants(os.getpid(), 0, rounds=1):
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    signal_descendants(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m sftree.runtime.guard COMMAND [ARG...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    child = subprocess.Popen(argv)

    def forward(sig: int, _frame: object) -> None:
        try:
            child.send_signal(sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            code = child.wait(timeout=POLL)
            break
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:  # the process that started us is gone
            _end_below(child, GRACE)
            code = child.wait()
            break
    return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as a shell says it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
