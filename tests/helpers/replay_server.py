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
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from helpers.real_traffic import Run
from helpers.sse import reply_chunks, send_sse
from sftree import httpserver
from sftree.agents.chain import ChainBreak, Pristine, SessionChain


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
        self.server = httpserver.QuietThreadingHTTPServer((host, 0), _handler(self))
        self.base_url = httpserver.local_url(self.server)
        self.serving: httpserver.Serving | None = None

    def start(self) -> ReplayServer:
        self.serving = httpserver.serve_in_background(self.server, "replay-teacher", poll_s=0.2)
        return self

    def stop(self) -> None:
        if self.serving:
            self.serving.stop()

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


def _usage(step: dict) -> dict:
    u = step.get("usage") or {}
    return {
        "prompt_tokens": u.get("prompt_tokens", 0),
        "completion_tokens": u.get("completion_tokens", 0),
        "total_tokens": u.get("prompt_tokens", 0) + u.get("completion_tokens", 0),
        "prompt_tokens_details": {"cached_tokens": u.get("cached_tokens", 0)},
    }


def completion(step: dict) -> dict:
    """The recorded reply as one (non-streamed) chat completion."""
    finish = step.get("finish_reason") or "stop"
    return {
        "id": "chatcmpl-replay", "object": "chat.completion", "created": 0, "model": "replay",
        "choices": [{"index": 0, "message": step["response"], "finish_reason": finish}], "usage": _usage(step),
    }  # fmt: skip


def _handler(rs: ReplayServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def do_GET(self):
            httpserver.send_json(self, 200, {"object": "list", "data": [{"id": "replay", "object": "model"}]})

        def do_POST(self):
            body = json.loads(httpserver.read_body(self) or b"{}")
            step = rs.match(body)
            if step is None:
                return httpserver.send_json(
                    self, 400, {"error": {"message": f"replay: not a recorded request: {rs.misses[-1]}"}}
                )
            if step.get("response") is None:  # a recorded failure: the same status again
                m = re.match(r"HTTP (\d{3})", str(step.get("error") or ""))
                status = int(m[1]) if m else 502
                return httpserver.send_json(
                    self, status, {"error": {"message": f"replayed: {step.get('error')}"}}
                )
            if not body.get("stream"):
                return httpserver.send_json(self, 200, completion(step))
            finish = step.get("finish_reason") or "stop"
            send_sse(self, reply_chunks(step["response"], finish, _usage(step), "chatcmpl-replay", "replay"))

    return Handler
