"""A Teacher that answers with a real model's recorded replies (tests/fixtures/real_opencode/), so OpenCode, the
proxy, the sandbox, the grader and the export all run for real on real model output, in minutes and the same way
each time.

It answers a request with the recorded reply only when the request is the recorded one, in the chain check's
sense (agents/chain.py): the recorded session's system prompt and tools (the date masked), its previous request,
the recorded reply as OpenCode resends it, one tool result per call of it (their text is the sandbox's, so it is
not compared), then exactly the host's recorded prompt; and as many messages as the recorded request had. Anything
else is answered 400 (not retried by OpenCode or the proxy) and kept in `misses` with the chain's reason: a test
asserts there are none. A recorded failure (an HTTP error) is answered with its status again.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from helpers.real_traffic import Run
from sftree.agents.chain import ChainBreak, Pristine, SessionChain
from sftree.httpserver import QuietThreadingHTTPServer


@dataclass
class _Session:
    runs: list[Run]
    chain: SessionChain
    run: int = 0
    step: int = 0
    done: bool = False
    served: list[int] = field(default_factory=list)

    def current(self) -> tuple[Run, dict]:
        run = self.runs[self.run]
        return run, run.steps[self.step]

    def advance(self) -> None:
        run = self.runs[self.run]
        self.step += 1
        if self.step >= len(run.steps):
            if run.interrupted:
                self.chain.interrupted()
            self.run, self.step = self.run + 1, 0
            self.done = self.run >= len(self.runs)


class ReplayServer:
    """`ReplayServer([(runs, pristine), ...]).start()`; `base_url`; `misses`, `served` afterwards; `stop()`."""

    def __init__(self, sessions: list[tuple[list[Run], Pristine]], host: str = "127.0.0.1"):
        self.sessions = [_Session(runs, SessionChain(pristine)) for runs, pristine in sessions]
        self.misses: list[str] = []
        self.served = 0
        self.lock = threading.Lock()
        self.server = QuietThreadingHTTPServer((host, 0), _handler(self))
        self.server.daemon_threads = True
        self.base_url = f"http://{host}:{self.server.server_address[1]}/v1"

    def start(self) -> ReplayServer:
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def match(self, body: dict) -> dict | None:
        """The recorded step this request is, its session's chain moved on; None (and a miss) if none."""
        reasons = []
        with self.lock:
            for s in self.sessions:
                if s.done:
                    continue
                run, step = s.current()
                trial = copy.deepcopy(s.chain)
                if s.step == 0 and run.prompt is not None:
                    trial.expect_prompt(run.prompt)
                try:
                    trial.check(body)
                except ChainBreak as exc:
                    reasons.append(exc.reason)
                    continue
                want, got = len(step["request"]["messages"]), len(body.get("messages") or [])
                if want != got:
                    reasons.append(f"{got} messages where the recording has {want}")
                    continue
                s.chain = trial
                resp = step.get("response")
                s.chain.answered(resp, bool(step.get("error")) or step.get("finish_reason") == "length")
                s.advance()
                self.served += 1
                return step
            self.misses.append("; ".join(reasons) or "every recorded session has ended")
        return None


def sse(step: dict) -> bytes:
    """The recorded reply as llama-server streams it: a role/content chunk, the calls, the finish, the usage."""
    msg = step["response"]
    base = {
        "id": "chatcmpl-replay",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "replay",
    }
    chunks = [{"role": "assistant", "content": msg.get("content") or ""}]
    if msg.get("reasoning_content"):
        chunks.insert(0, {"role": "assistant", "reasoning_content": msg["reasoning_content"]})
    for i, c in enumerate(msg.get("tool_calls") or []):
        chunks.append({"tool_calls": [{"index": i, **c}]})
    out = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in chunks]
    out.append(
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": step.get("finish_reason") or "stop"}]}
    )
    u = step.get("usage") or {}
    usage = {
        "prompt_tokens": u.get("prompt_tokens", 0),
        "completion_tokens": u.get("completion_tokens", 0),
        "total_tokens": u.get("prompt_tokens", 0) + u.get("completion_tokens", 0),
        "prompt_tokens_details": {"cached_tokens": u.get("cached_tokens", 0)},
    }
    out.append({**base, "choices": [], "usage": usage})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in out) + b"data: [DONE]\n\n"


def completion(step: dict) -> dict:
    """The recorded reply as one (non-streamed) chat completion."""
    u = step.get("usage") or {}
    return {
        "id": "chatcmpl-replay", "object": "chat.completion", "created": int(time.time()), "model": "replay",
        "choices": [{"index": 0, "message": step["response"], "finish_reason": step.get("finish_reason") or "stop"}],
        "usage": {"prompt_tokens": u.get("prompt_tokens", 0), "completion_tokens": u.get("completion_tokens", 0),
                  "prompt_tokens_details": {"cached_tokens": u.get("cached_tokens", 0)}},
    }  # fmt: skip


def _handler(rs: ReplayServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def _json(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._json(200, {"object": "list", "data": [{"id": "replay", "object": "model"}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            step = rs.match(body)
            if step is None:
                return self._json(
                    400, {"error": {"message": f"replay: not a recorded request: {rs.misses[-1]}"}}
                )
            if step.get("response") is None:  # a recorded failure: the same status again
                m = re.match(r"HTTP (\d{3})", str(step.get("error") or ""))
                status = int(m[1]) if m else 502
                return self._json(status, {"error": {"message": f"replayed: {step.get('error')}"}})
            if not body.get("stream"):
                return self._json(200, completion(step))
            data = sse(step)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
