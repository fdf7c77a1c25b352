"""The host's Unix-socket servers that sandboxed processes talk to (the coral client, the graded program's
forwarder): an accept loop until `stop()`, and a bounded read of one newline-terminated request.

Whatever connects is hostile (the agent's commands, the graded code), so a request is read with a size cap and a
deadline for the whole request, by the one bounded reader (runtime/bounded.py).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from sftree.runtime.bounded import ReadError, read_line

RequestError = ReadError  # a request that was too large, too slow or cut off


def read_request(conn: socket.socket, limit: int, timeout: float) -> bytes:
    """One request up to and including its newline: at most `limit` bytes, within `timeout` seconds in all
    (the one bounded reader, runtime/bounded.py)."""
    return read_line(conn, limit, timeout)


class Listener:
    """Accepts on `path` and calls `handle(conn)` for each connection, in the accept thread (`threaded=False`:
    one at a time) or in a thread of its own; `handle` owns and closes the connection."""

    def __init__(self, path: Path, handle: Callable[[socket.socket], None], *, name: str, backlog: int = 8,
                 threaded: bool = False, mode: int | None = None):  # fmt: skip
        self.handle = handle
        self.threaded = threaded
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        if mode is not None:
            os.chmod(path, mode)
        self._sock.listen(backlog)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            if self.threaded:
                t = threading.Thread(target=self.handle, args=(conn,), daemon=True)
                t.start()
                self._threads.append(t)
            else:
                self.handle(conn)

    def stop(self) -> None:
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept() at once
        except OSError:
            pass
        self._sock.close()
        self._thread.join(timeout=5)
        for t in self._threads:
            t.join(timeout=5)
