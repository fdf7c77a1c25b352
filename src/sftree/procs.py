"""Run a command in its own process group, killing the whole group when it overruns its timeout.

A grader or an agent's shell command may start children (a test runner, a background job); killing only the
shell would leave them running and holding the output pipes open.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass


@dataclass
class GroupResult:
    returncode: int | None  # None when it was killed for its timeout
    stdout: bytes
    stderr: bytes  # empty when stderr was merged into stdout
    timed_out: bool


def run_group(argv, *, timeout: float, merge_stderr: bool = False, **popen_kwargs) -> GroupResult:
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        **popen_kwargs,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return GroupResult(proc.returncode, out, err or b"", False)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return GroupResult(None, out, err or b"", True)
