"""The Teacher transport's wire (teacher/transport.py): a streamed request in flight, and the urllib3 connection
classes that hand each request's socket to it, so the client can abandon a request on a dead worker even while it
waits for the reply's headers (teacher/client.py, "Behind sglang-router")."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter


@dataclass(eq=False)
class InFlight:
    """A streamed request on the wire: when it was sent, when its last bytes came, its socket (to abandon it)."""

    started: float
    last: float
    label: str
    chunks: int = 0
    sock: socket.socket | None = None
    aborted: str | None = None

    def abort(self, why: str) -> None:
        self.aborted = why
        sock = self.sock
        if sock is not None:
            try:  # wakes the reading thread: its recv returns at once
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


tracking = threading.local()  # the streamed request this thread is sending (its socket is taken on the wire)


class TrackedHTTPConnection(urllib3.connection.HTTPConnection):
    """Hands the socket of each request to the streamed request being sent (`tracking.entry`), so the fleet
    watcher can abandon it even while it waits for the reply's headers."""

    def request(self, *args: Any, **kwargs: Any) -> None:  # urllib3's own signature, passed on as it is
        super().request(*args, **kwargs)
        entry = getattr(tracking, "entry", None)
        if entry is not None:
            entry.sock = self.sock
            if entry.aborted:  # abandoned while it was being sent
                entry.abort(entry.aborted)


class TrackedHTTPSConnection(urllib3.connection.HTTPSConnection, TrackedHTTPConnection):
    pass


class TrackedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = TrackedHTTPConnection


class TrackedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = TrackedHTTPSConnection


class TrackingAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:  # requests' own signature, passed on
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": TrackedHTTPPool, "https": TrackedHTTPSPool}


def socket_of(r: requests.Response) -> socket.socket | None:
    """The socket a streamed response is read from: the pooled connection's, or (a `Connection: close` reply,
    whose connection object let go of it) the one under the response's file."""
    sock = getattr(getattr(r.raw, "connection", None), "sock", None)
    if sock is None:
        fp = getattr(getattr(r.raw, "_fp", None), "fp", None)
        sock = getattr(getattr(fp, "raw", None), "_sock", None)
    return sock if isinstance(sock, socket.socket) else None
