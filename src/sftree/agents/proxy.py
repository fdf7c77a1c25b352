"""The recording proxy: sits between OpenCode and the Teacher and keeps the exact request context of every step.

OpenCode talks to `http://127.0.0.1:<port>/c/<channel>/v1/...`; the proxy forwards each request to the
Teacher's base URL (streaming responses are relayed chunk by chunk as they arrive) and records, per channel
(one channel per edge), the request's exact `messages` and `tools` and the assembled assistant message (SSE
chunks -> one message with `content`, `reasoning_content`, `tool_calls`), in the step-record shape of
docs/architecture.md. A channel per edge, rather than OpenCode's `x-session-id` header, attributes requests
to edges without waiting for the session id to appear in the event stream; the header is kept in each
record (`session_id`) so the two can be cross-checked.

Each forwarded request carries the channel's `X-Sftree-*` headers, so `teacher-sim --script` can aim a fault at
one edge as with the native agent. Transient Teacher failures (connection refused, 429, 5xx) are retried here
with capped exponential backoff before a byte reaches OpenCode; a request that still fails is answered with
the Teacher's status so OpenCode reports it.

Kinds: `title` (OpenCode's title generator), `compaction` (its summarising agent), `summary` (its session
summary agent), else `agent`. A `stopped` channel (the turn ended at `coral eval`) answers new requests with
503 and records nothing, so the step OpenCode starts while it is being interrupted never enters a transcript.
"""

from __future__ import annotations

import json
import logging
import shutil
import socketserver
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import requests

from sftree.httpserver import QuietThreadingHTTPServer, send_json

log = logging.getLogger(__name__)

TITLE_MARK = "You are a title generator"
COMPACTION_MARKS = ("produce a structured summary", "summarizing conversations", "<conversation-checkpoint>")
SUMMARY_MARK = "like a pull request description"
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "accept-encoding"}
RETRY_STATUS = {429, 500, 502, 503, 504}


# ---- pure helpers --------------------------------------------------------------------------------------------
def _text(content: Any) -> str:
    """A message's content as text (OpenAI content may be a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def classify(body: dict) -> str:
    """agent | title | compaction | summary, from the request's system prompt and tools."""
    msgs = body.get("messages") or []
    system = "".join(_text(m.get("content")) for m in msgs if m.get("role") == "system")
    if system.lstrip().startswith(TITLE_MARK):
        return "title"
    if not body.get("tools"):
        if any(mark in system for mark in COMPACTION_MARKS[:2]):
            return "compaction"
        if SUMMARY_MARK in system:
            return "summary"
    return "agent"


def compacted(body: dict) -> bool:
    """The request carries a compacted history (OpenCode's checkpoint replaces earlier turns)."""
    return any(COMPACTION_MARKS[2] in _text(m.get("content")) for m in body.get("messages") or [])


class StreamAssembler:
    """Folds OpenAI chat-completion SSE chunks into one assistant message, finish reason and usage."""

    def __init__(self):
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict] = {}
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self._buf = b""

    def feed(self, data: bytes) -> None:
        self._buf += data
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            self._line(line.strip())

    def close(self) -> None:
        if self._buf.strip():
            self._line(self._buf.strip())
        self._buf = b""

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            return
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                self.reasoning.append(reasoning)
            for tc in delta.get("tool_calls") or []:
                slot = self.calls.setdefault(
                    int(tc.get("index", len(self.calls))), {"id": None, "name": "", "args": []}
                )
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["args"].append(fn["arguments"])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def message(self) -> dict:
        msg: dict = {"role": "assistant", "content": "".join(self.content)}
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        calls = [
            {
                "id": slot["id"] or f"call_{i}",
                "type": "function",
                "function": {"name": slot["name"], "arguments": "".join(slot["args"])},
            }
            for i, slot in sorted(self.calls.items())
        ]
        if calls:
            msg["tool_calls"] = calls
        return msg


def message_from_completion(obj: dict) -> tuple[dict, str | None, dict | None]:
    """(assistant message, finish reason, usage) of a non-streaming completion."""
    choice = (obj.get("choices") or [{}])[0]
    m = dict(choice.get("message") or {})
    msg: dict = {"role": "assistant", "content": m.get("content") or ""}
    if m.get("reasoning_content"):
        msg["reasoning_content"] = m["reasoning_content"]
    if m.get("tool_calls"):
        msg["tool_calls"] = m["tool_calls"]
    return msg, choice.get("finish_reason"), obj.get("usage")


_warned_no_usage = threading.Event()


def estimated_usage_record(body: dict, msg: dict | None) -> dict | None:
    """Usage counted from the text when the server reported none (`teacher.estimate_usage`); warns once."""
    if msg is None:
        return None
    from sftree.teacher.client import CHARS_PER_TOKEN, estimate_usage, serialize

    if not _warned_no_usage.is_set():
        _warned_no_usage.set()
        log.warning(
            "the Teacher reports no token usage; estimating it from the text (%d characters per token, "
            "recorded as `estimated`)",
            CHARS_PER_TOKEN,
        )
    return estimate_usage(serialize(body), msg).to_dict()


def usage_record(usage: dict | None) -> dict | None:
    if not usage or usage.get("prompt_tokens") is None:
        return None
    details = usage.get("prompt_tokens_details") or {}
    return {
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
        "cached_tokens": int(details.get("cached_tokens") or 0),
    }


class _QuietUnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


# ---- channels ------------------------------------------------------------------------------------------------
@dataclass
class Channel:
    """One edge's traffic: the records of its model calls, in arrival order of their responses."""

    name: str
    headers: dict[str, str] = field(default_factory=dict)  # added to every forwarded request
    turn: int = 1
    records: list[dict] = field(default_factory=list)
    stopped: bool = False
    teacher_failures: int = 0  # requests the Teacher failed past the proxy's retries (not client hang-ups)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> list[dict]:
        """The records so far (and forget them): the backend enriches and writes them per turn."""
        with self.lock:
            out, self.records = self.records, []
        return out


class RecordingProxy:
    """`RecordingProxy(teacher_url).start()`; `channel(name)` gives the base URL OpenCode should use."""

    def __init__(
        self,
        upstream: str,
        *,
        api_key: str | None = None,
        timeout: float = 900.0,
        retries: int = 8,
        backoff_max: float = 60.0,
        extra_body: dict | None = None,
        host: str = "127.0.0.1",
    ):
        self.upstream = upstream.rstrip("/")
        self.api_key = api_key
        self.timeout, self.retries, self.backoff_max = timeout, retries, backoff_max
        self.extra_body = dict(extra_body or {})  # e.g. chat_template_kwargs: sent on, not recorded
        self.channels: dict[str, Channel] = {}
        self._lock = threading.Lock()
        self.server = QuietThreadingHTTPServer((host, 0), _handler_for(self))
        self.server.daemon_threads = True
        self.host, self.port = host, self.server.server_address[1]
        self._threads: list[threading.Thread] = []
        self._local = threading.local()  # one requests.Session per handler thread (not thread-safe)
        self.unix_server: socketserver.ThreadingUnixStreamServer | None = None
        self.unix_dir: Path | None = None

    @property
    def session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    @property
    def unix_socket(self) -> Path | None:
        return self.unix_dir / "proxy.sock" if self.unix_dir else None

    # lifecycle
    def start(self, unix: bool = False) -> RecordingProxy:
        """Serve on TCP, and with `unix` also on a Unix socket (for agents in a network-less sandbox)."""
        servers = [self.server]
        if unix:
            self.unix_dir = Path(tempfile.mkdtemp(prefix="sftree-proxy-"))  # short: socket paths < 108 bytes
            self.unix_server = _QuietUnixServer(str(self.unix_socket), _handler_for(self))
            servers.append(self.unix_server)
        for srv in servers:
            t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
            t.start()
            self._threads.append(t)
        log.info(
            "recording proxy on http://%s:%d%s -> %s",
            self.host,
            self.port,
            f" and {self.unix_socket}" if unix else "",
            self.upstream,
        )
        return self

    def stop(self) -> None:
        """Idempotent: also runs at interpreter exit when the owner forgot (see OpenCodeAgent)."""
        if getattr(self, "_stopped", False):
            return
        self._stopped = True
        for srv in (self.server, self.unix_server):
            if srv is not None:
                srv.shutdown()
                srv.server_close()
        if self.unix_dir is not None:
            shutil.rmtree(self.unix_dir, ignore_errors=True)

    # channels
    def channel(self, name: str, headers: dict[str, str] | None = None) -> Channel:
        with self._lock:
            ch = self.channels.get(name) or Channel(name)
            ch.headers = dict(headers or ch.headers)
            ch.stopped = False
            self.channels[name] = ch
            return ch

    def drop(self, name: str) -> None:
        with self._lock:
            self.channels.pop(name, None)

    def base_url(self, name: str) -> str:
        return f"http://{self.host}:{self.port}/c/{name}/v1"

    # forwarding
    def forward(self, method: str, path: str, headers: dict, body: bytes | None, stream: bool):
        """requests.Response from the Teacher, retrying transient failures; raises after the budget."""
        url = self.upstream + path
        delay = 0.5
        for attempt in range(self.retries + 1):
            try:
                resp = self.session.request(
                    method, url, headers=headers, data=body, stream=stream, timeout=(10, self.timeout)
                )
                if resp.status_code not in RETRY_STATUS or attempt == self.retries:
                    return resp
                resp.close()
                why = f"HTTP {resp.status_code}"
            except requests.ConnectionError as exc:
                if attempt == self.retries:
                    raise
                why = f"connection: {exc}"
            log.warning(
                "teacher %s (attempt %d/%d), retrying in %.1fs", why, attempt + 1, self.retries, delay
            )
            time.sleep(delay)
            delay = min(delay * 2, self.backoff_max)
        raise AssertionError("unreachable")


def _handler_for(proxy: RecordingProxy):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # the explore log has what matters
            pass

        def _route(self) -> tuple[Channel | None, str]:
            parts = self.path.split("/", 3)  # "", "c", name, "v1/..."
            if len(parts) == 4 and parts[1] == "c":
                ch = proxy.channels.get(parts[2])
                rest = "/" + parts[3]
                return ch, rest[3:] if rest.startswith("/v1/") or rest == "/v1" else rest
            return None, self.path[3:] if self.path.startswith("/v1/") else self.path

        def _headers(self, ch: Channel | None) -> dict:
            out = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            out.pop("Authorization", None)
            out.pop("authorization", None)
            if proxy.api_key:
                out["Authorization"] = f"Bearer {proxy.api_key}"
            if ch is not None:
                out.update(ch.headers)
                out["X-Sftree-Turn"] = str(ch.turn)
            return out

        def _reply(self, status: int, obj) -> None:
            send_json(self, status, obj)

        def do_GET(self):
            ch, path = self._route()
            try:
                resp = proxy.forward("GET", path, self._headers(ch), None, False)
            except requests.RequestException as exc:
                return self._reply(502, {"error": {"message": f"teacher unreachable: {exc}"}})
            data = resp.content
            self.send_response(resp.status_code)
            self.send_header("Content-Type", resp.headers.get("Content-Type", "application/json"))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            ch, path = self._route()
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if ch is not None and ch.stopped:
                # The turn ended at `coral eval`; OpenCode is being stopped. Nothing of this reaches the Teacher.
                return self._reply(503, {"error": {"message": "turn ended (sftree interrupted the agent)"}})
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {}
            stream = bool(body.get("stream"))
            turn = ch.turn if ch is not None else 0
            if proxy.extra_body and body:
                raw = json.dumps({**body, **proxy.extra_body}).encode()
            t0 = time.monotonic()
            try:
                resp = proxy.forward("POST", path, self._headers(ch), raw, stream)
            except requests.RequestException as exc:
                self._record(
                    ch, body, turn, None, None, None, time.monotonic() - t0, f"teacher unreachable: {exc}"
                )
                if ch is not None:
                    ch.teacher_failures += 1
                return self._reply(502, {"error": {"message": f"teacher unreachable: {exc}"}})
            if resp.status_code != 200:
                data = resp.content
                self._record(
                    ch, body, turn, None, None, None, time.monotonic() - t0, f"HTTP {resp.status_code}"
                )
                if ch is not None:
                    ch.teacher_failures += 1
                self.send_response(resp.status_code)
                self.send_header("Content-Type", resp.headers.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if not stream:
                data = resp.content
                try:
                    msg, finish, usage = message_from_completion(json.loads(data))
                except ValueError:
                    msg, finish, usage = None, None, None
                self._record(ch, body, turn, msg, finish, usage, time.monotonic() - t0, None)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            # Streaming: relay each piece at once (chunked encoding), assemble on the side.
            asm = StreamAssembler()
            self.send_response(200)
            self.send_header("Content-Type", resp.headers.get("Content-Type", "text/event-stream"))
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            recorded = False

            def record(error: str | None = None) -> None:
                nonlocal recorded
                if not recorded:
                    recorded = True
                    asm.close()
                    msg, latency = asm.message(), time.monotonic() - t0
                    self._record(ch, body, turn, msg, asm.finish_reason, asm.usage, latency, error)

            try:
                for piece in resp.iter_content(chunk_size=None):
                    if not piece:
                        continue
                    asm.feed(piece)
                    if b"[DONE]" in piece:  # record before the client can see the end of the answer
                        record()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
                record()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (OSError, requests.RequestException) as exc:  # OpenCode went away, or the Teacher broke
                self.close_connection = True
                record(f"stream cut: {type(exc).__name__}")
            finally:
                resp.close()

        def _record(self, ch, body, turn, msg, finish, usage, latency, error) -> None:
            if ch is None:
                return
            rec = {
                "turn": turn,
                "kind": classify(body),
                "request": {
                    "model": body.get("model"),
                    "messages": body.get("messages") or [],
                    "tools": body.get("tools") or [],
                },
                "response": msg,
                "tool_results": [],
                "usage": usage_record(usage) or estimated_usage_record(body, msg),
                "latency_s": round(latency, 4),
                "finish_reason": finish,
                "session_id": self.headers.get("x-session-id"),
            }
            if compacted(body):
                rec["compacted"] = True
            if error:
                rec["error"] = error
            with ch.lock:
                ch.records.append(rec)

    return Handler
