"""The host's end of the bridge to the user's Coral: one long-lived `bridge_main.py` process in Coral's interpreter
per explore job (a turn does not pay Coral's import), answering JSON-lines requests; thread-safe.

    b = CoralBridge(install)          # starts the process
    b.call("coral_md", task=..., agent_id="agent-1", single_agent=True)
    b.close()

A request that Coral's code refuses raises `CoralError` naming the op and Coral's message; a bridge that died, or
whose answer is larger than ANSWER_MAX or later than ANSWER_TIMEOUT (read by the one bounded reader,
runtime/bounded.py: the answers carry the agent's texts), is restarted once per call.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import IO, Any

from sftree.errors import SftreeError
from sftree.runtime.bounded import LineReader, ReadError
from sftree.world.locate import CoralInstall

SCRIPT = Path(__file__).with_name("bridge_main.py")
ANSWER_MAX = 64 << 20  # one answer line (an eval's output carries its feedback and the agent's message)
ANSWER_TIMEOUT = 600.0  # seconds for one answer: Coral's code runs one tick or one template, never a grading


class CoralError(SftreeError):
    """Coral's own code failed on a request (its message and traceback are in the text)."""


class CoralBridge:
    def __init__(self, install: CoralInstall) -> None:
        self.install = install
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._requests: IO[bytes]  # the process's stdin and its answers, as `_start` made them
        self._answers: LineReader
        self._start()

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [self.install.python, "-I", "-B", str(SCRIPT), self.install.root],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd="/",
        )
        if self._proc.stdin is None or self._proc.stdout is None:  # (stdin=PIPE, stdout=PIPE)
            raise CoralError(f"coral bridge ({self.install.python}) started without its pipes")
        self._requests = self._proc.stdin
        self._answers = LineReader(self._proc.stdout, ANSWER_MAX)

    def call(self, op: str, **req: object) -> Any:
        """The value of `op` as Coral's code gave it (JSON; each op's shape is the stand-in's, world/standin.py)."""
        line = (json.dumps({"op": op, **req}) + "\n").encode("utf-8")
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._proc is None or self._proc.poll() is not None:
                        self._start()
                    self._requests.write(line)
                    self._requests.flush()
                    answer = self._answers.line(ANSWER_TIMEOUT, what="answer")
                    break
                except (OSError, ReadError) as exc:
                    self._kill()
                    if attempt == 2:
                        raise CoralError(
                            f"coral bridge ({self.install.python}) died during {op!r}: {exc}"
                        ) from None
        data = json.loads(answer.decode("utf-8"))
        if not data.get("ok"):
            raise CoralError(
                f"Coral ({self.install.python}, {self.install.version}) failed on {op!r}: {data.get('error')}\n"
                f"{data.get('traceback', '')}"
            )
        return data["value"]

    def _kill(self) -> None:
        if self._proc is not None:
            try:
                self._proc.kill()
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._proc = None

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                try:
                    self._requests.close()
                    self._proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    self._kill()
                self._proc = None
