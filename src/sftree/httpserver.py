"""The threading HTTP server behind teacher-sim and the recording proxy."""

from __future__ import annotations

import json
import sys
from http.server import ThreadingHTTPServer


class QuietThreadingHTTPServer(ThreadingHTTPServer):
    """Daemon threads, and no traceback when a client hangs up mid-request (an interrupted OpenCode, a client
    that timed out on a `hang` fault): expected, not an error."""

    daemon_threads = True

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def send_json(handler, status: int, obj) -> None:
    """Answer a request of a BaseHTTPRequestHandler with a JSON body."""
    data = json.dumps(obj).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
