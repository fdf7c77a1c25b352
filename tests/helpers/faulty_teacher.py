"""A Teacher that misbehaves on cue: each chat request takes the next fault of its script, then it answers.

    teacher = FaultyTeacher(["503", "reset", "stall"]).start()   # base_url; `arrivals` afterwards; stop()

Faults: `503` (HTTP 503, a JSON error), `reset` (the request is read, then the connection is reset: RST, no
answer), `stall` (the request is read; a streamed one gets its 200 and SSE headers, a plain one nothing; then
nothing at all for `hang_s`). Past the script every request is answered: a streamed one as SSE chunks, a plain one
as one JSON completion, with usage. `arrivals` has each request's arrival (time.monotonic()) in order.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler

from sftree.httpserver import QuietThreadingHTTPServer

MESSAGE = {"role": "assistant", "content": "Done."}
USAGE = {"prompt_tokens": 12, "completion_tokens": 2}


class FaultyTeacher:
    def __init__(self, script: list[str], hang_s: float = 10.0):
        self.script = list(script)
        self.hang_s = hang_s
        self.arrivals: list[float] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.server = QuietThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def start(self) -> FaultyTeacher:
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()

    def next_fault(self) -> str:
        with self.lock:
            self.arrivals.append(time.monotonic())
            return self.script.pop(0) if self.script else "ok"


def _handler(teacher: FaultyTeacher):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            stream = bool(body.get("stream"))
            fault = teacher.next_fault()
            if fault == "503":
                return self._send(503, {"error": {"message": "queue full"}})
            if fault == "reset":  # SO_LINGER 0: close sends RST, not FIN
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
                return None
            if fault == "stall":
                if stream:
                    self._sse_headers()
                teacher.stopped.wait(teacher.hang_s)
                self.close_connection = True
                return None
            if stream:
                return self._stream()
            choice = {"index": 0, "message": MESSAGE, "finish_reason": "stop"}
            return self._send(
                200, {"id": "x", "object": "chat.completion", "choices": [choice], "usage": USAGE}
            )

        def _send(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _sse_headers(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.flush()

        def _stream(self) -> None:
            self._sse_headers()
            self.close_connection = True
            chunks = [
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": "Done."},
                            "finish_reason": None,
                        }
                    ]
                },
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                {"choices": [], "usage": USAGE},
            ]
            for c in chunks:
                self.wfile.write(f"data: {json.dumps({'id': 'x', **c})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler
