"""The host's end of an edge's driver (`agents/opencode.py`, `_Driver`) against a hostile other end. The sandbox
runs agent code (a plugin in OpenCode's server publishes what it likes, relayed by the driver), so what comes back
must stay bounded in the host's memory, and a driver that stops reading must not block the host."""

from __future__ import annotations

import sys
import threading
import time

from sftree.agents import opencode
from sftree.agents.opencode import EOF, QUEUE_MAX, _Driver

FLOOD = r"""
import json, os, sys
out = int(sys.argv[sys.argv.index("--fds") + 2])
part = {"tool": "bash", "callID": "c", "state": {"status": "completed", "input": {}, "output": "x" * 100}}
line = (json.dumps({"type": "tool_use", "sessionID": "s", "part": part}) + "\n").encode()
while True:
    os.write(out, line)
"""
DEAF = "import time; time.sleep(120)"  # holds its end of the host's pipe, never reads it


def _wait(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.02)
    return cond()


def _pump_threads(name):
    return [t for t in threading.enumerate() if t.name == f"oc-{name}"]


def test_a_flooding_sandbox_waits_on_its_pipe(tmp_path):
    d = _Driver([sys.executable, "-c", FLOOD], "flood", tmp_path / "stderr.log", start_new_session=True)
    try:
        assert _wait(lambda: d.lines.qsize() == QUEUE_MAX)
        time.sleep(0.5)  # it writes as fast as it can: nothing more is read while nobody takes
        held = d.received
        assert held <= QUEUE_MAX + 1 and d.lines.qsize() == QUEUE_MAX and d.alive()
        for _ in range(10):
            assert d.next(1.0)["type"] == "tool_use"
        assert _wait(lambda: d.received == held + 10)  # room for ten: ten more read, no more
        time.sleep(0.3)
        assert d.received == held + 10
    finally:
        d.kill()
    assert d.next(0.1) is EOF and d.next(0.1) is EOF
    assert _wait(lambda: not _pump_threads("flood"))  # the reader drops the rest and ends


def test_a_driver_that_stops_reading_is_killed_not_waited_for(tmp_path, monkeypatch):
    monkeypatch.setattr(opencode, "SEND_TIMEOUT", 1.0)
    d = _Driver([sys.executable, "-c", DEAF], "deaf", tmp_path / "stderr.log", start_new_session=True)
    sent = threading.Thread(target=lambda: [d.send({"op": "turn", "text": "x" * 100_000}) for _ in range(3)])
    t0 = time.monotonic()
    sent.start()
    sent.join(20)
    try:
        assert not sent.is_alive(), "send blocked on a pipe nobody reads"
        assert time.monotonic() - t0 < 10 and not d.alive()
        assert d.next(0.1) is EOF
    finally:
        d.kill()


def test_a_driver_that_reads_gets_every_request(tmp_path):
    """The other side of the same pipe: requests larger than the pipe arrive whole and in order."""
    echo = r"""
import json, os, sys
i, o = (int(x) for x in sys.argv[sys.argv.index("--fds") + 1:][:2])
f = os.fdopen(i, "rb")
for line in f:
    req = json.loads(line)
    os.write(o, (json.dumps({"type": "got", "n": req["n"], "size": len(req["text"])}) + "\n").encode())
"""
    d = _Driver([sys.executable, "-c", echo], "echo", tmp_path / "stderr.log", start_new_session=True)
    try:
        for n in range(3):
            d.send({"op": "turn", "n": n, "text": "y" * 300_000})
        got = [d.wait_for("got", 10) for _ in range(3)]
        assert [(g["n"], g["size"]) for g in got] == [(0, 300_000), (1, 300_000), (2, 300_000)]
        assert d.alive()
    finally:
        d.kill()
