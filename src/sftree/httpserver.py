"""The threading HTTP server behind teacher-sim, the recording proxy and the tests' Teachers, and the one way
they are served from a background thread."""

from __future__ import annotations

import json
import socket
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import BaseServer


class QuietThreadingHTTPServer(ThreadingHTTPServer):
    """Daemon threads, and no traceback when a client hangs up mid-request (an interrupted OpenCode, a client
    that timed out on a `hang` fault): expected, not an error."""

    daemon_threads = True

    def handle_error(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: object
    ) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


@dataclass
class Serving:
    """A server serving from a daemon thread. Calling it (or `stop()`) shuts the server down, closes its socket
    and joins the thread."""

    server: BaseServer
    thread: threading.Thread

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    __call__ = stop


def serve_in_background(server: BaseServer, name: str, poll_s: float = 0.1) -> Serving:
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": poll_s}, daemon=True, name=name
    )
    thread.start()
    return Serving(server, thread)


def local_url(server: ThreadingHTTPServer) -> str:
    """The OpenAI-style base URL (ending in /v1) of a server listening on TCP."""
    host, port = server.server_address[:2]
    return f"http://{host if isinstance(host, str) else host.decode()}:{port}/v1"


def read_body(handler: BaseHTTPRequestHandler) -> bytes:
    """A request's body, as long as its Content-Length says (none: empty)."""
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


def send_json(handler: BaseHTTPRequestHandler, status: int, obj: object) -> None:
    """Answer a request of a BaseHTTPRequestHandler with a JSON body."""
    data = json.dumps(obj).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
