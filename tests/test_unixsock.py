"""The host's Unix-socket servers read a hostile client's request with a size cap and one deadline for the whole
request (runtime/unixsock.py; the coral client's socket and the graded program's forwarder use it)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from sftree.runtime import tempdirs
from sftree.runtime.unixsock import Listener, RequestError, read_request


@pytest.fixture
def server():
    d = tempdirs.make("sftree-sock-test-")
    seen: list = []

    def handle(conn):
        with conn:
            try:
                seen.append(read_request(conn, limit=1000, timeout=1.0))
            except RequestError as exc:
                seen.append(exc)
            conn.sendall(b"done")

    lst = Listener(d / "s.sock", handle, name="test", threaded=True)
    yield d / "s.sock", seen
    lst.stop()
    tempdirs.remove(d)


def ask(path, *pieces, pause=0.0):
    c = socket.socket(socket.AF_UNIX)
    c.connect(str(path))
    for p in pieces:
        c.sendall(p)
        time.sleep(pause)
    c.settimeout(5)
    out = c.recv(100)
    c.close()
    return out


def test_a_request_is_read_to_its_newline(server):
    path, seen = server
    assert ask(path, b'{"argv": ', b'["log"]}\n', pause=0.05) == b"done"
    assert seen == [b'{"argv": ["log"]}\n']


def test_a_request_over_the_cap_is_refused_without_reading_on(server):
    path, seen = server
    assert ask(path, b"x" * 4000) == b"done"  # no newline: the cap, not the client, ends it
    assert isinstance(seen[0], RequestError) and "too large" in str(seen[0])


def test_a_slow_drip_is_stopped_at_the_deadline_for_the_whole_request(server):
    path, seen = server
    t = time.monotonic()
    stop = threading.Event()

    def drip():  # a byte every 0.2 s keeps every single recv() within any per-call timeout
        c = socket.socket(socket.AF_UNIX)
        c.connect(str(path))
        try:
            while not stop.is_set():
                c.sendall(b"a")
                time.sleep(0.2)
        except OSError:
            pass
        c.close()

    th = threading.Thread(target=drip)
    th.start()
    while not seen and time.monotonic() - t < 10:
        time.sleep(0.05)
    stop.set()
    th.join()
    assert isinstance(seen[0], RequestError) and "within 1 s" in str(seen[0])
    assert time.monotonic() - t < 3
