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

from helpers.sse import reply_chunks, send_sse, send_sse_headers
from sftree import httpserver

MESSAGE = {"role": "assistant", "content": "Done."}
USAGE = {"prompt_tokens": 12, "completion_tokens": 2}


class FaultyTeacher:
    def __init__(self, script: list[str], hang_s: float = 10.0):
        self.script = list(script)
        self.hang_s = hang_s
        self.arrivals: list[float] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.server = httpserver.QuietThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.base_url = httpserver.local_url(self.server)
        self.serving: httpserver.Serving | None = None

    def start(self) -> FaultyTeacher:
        self.serving = httpserver.serve_in_background(self.server, "faulty-teacher")
        return self

    def stop(self) -> None:
        self.stopped.set()
        if self.serving:
            self.serving.stop()

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
            body = json.loads(httpserver.read_body(self) or b"{}")
            stream = bool(body.get("stream"))
            fault = teacher.next_fault()
            if fault == "503":
                return httpserver.send_json(self, 503, {"error": {"message": "queue full"}})
            if fault == "reset":  # SO_LINGER 0: close sends RST, not FIN
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
                return None
            if fault == "stall":
                if stream:
                    send_sse_headers(self)
                teacher.stopped.wait(teacher.hang_s)
                self.close_connection = True
                return None
            if stream:
                return send_sse(self, reply_chunks(MESSAGE, "stop", USAGE))
            choice = {"index": 0, "message": MESSAGE, "finish_reason": "stop"}
            return httpserver.send_json(
                self, 200, {"id": "x", "object": "chat.completion", "choices": [choice], "usage": USAGE}
            )

    return Handler
