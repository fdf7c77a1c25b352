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
the Teacher's status so OpenCode reports it. As in the native client, an answer that no worker is there
(connection refused, sglang-router's 503 `no_available_workers`) is waited out for `outage_timeout` s instead
of being counted against `retries`.

Replies are passed on as sent, except that a lone UTF-16 surrogate is replaced by U+FFFD (`repair_json`: OpenCode
would resend it in every later request, which no transcript can hold); they are recorded as the native client
reads them (`reply_fields`: `teacher.response.normalize`, usage estimated when missing, malformed replies as
failed steps). docs/opencode.md, "What OpenCode receives, what is recorded".

Kinds: `title` (OpenCode's title generator), `compaction` (its summarising agent), `summary` (its session
summary agent), else `agent`. A `stopped` channel (the turn ended at `coral eval`) answers new requests with
503 and records nothing, so the step OpenCode starts while it is being interrupted never enters a transcript.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
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

from sftree.agents.chain import ChainBreak, SessionChain
from sftree.httpserver import QuietThreadingHTTPServer, send_json
from sftree.teacher.client import RetryBudget, no_worker_answer, refused
from sftree.teacher.response import MalformedResponse, normalize
from sftree.teacher.stream import StreamAssembler  # one assembler for the proxy and the client

log = logging.getLogger(__name__)

TITLE_MARK = "You are a title generator"
COMPACTION_MARKS = ("produce a structured summary", "summarizing conversations", "<conversation-checkpoint>")
SUMMARY_MARK = "like a pull request description"
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "accept-encoding"}
RETRY_STATUS = {429, 500, 502, 503, 504}
# A request body larger than this is refused unread: far above any real context (1M tokens of JSON is a few
# MB), and the proxy must not hold whatever a sandboxed process chooses to send.
MAX_BODY = 64 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")


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


def message_from_completion(obj: dict) -> dict:
    """The assistant message of a non-streaming completion (as OpenCode reads it); `reply_fields` reads the
    finish reason and usage through `normalize`."""
    choices = obj.get("choices") if isinstance(obj, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    m = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    msg: dict = {"role": "assistant", "content": m.get("content") or ""}
    reasoning = m.get("reasoning_content") or m.get("reasoning")
    if reasoning:
        msg["reasoning_content"] = reasoning
    if m.get("tool_calls"):
        msg["tool_calls"] = m["tool_calls"]
    return msg


def _has_surrogate(obj: Any) -> bool:
    if isinstance(obj, str):
        return bool(_SURROGATE.search(obj))
    if isinstance(obj, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in obj.items())
    if isinstance(obj, list):
        return any(_has_surrogate(v) for v in obj)
    return False


def _replace_surrogates(obj: Any) -> Any:
    if isinstance(obj, str):
        return _SURROGATE.sub("\ufffd", obj)
    if isinstance(obj, dict):
        return {_replace_surrogates(k): _replace_surrogates(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_replace_surrogates(v) for v in obj]
    return obj


def repair_json(data: bytes) -> tuple[bytes, bool]:
    """A JSON document with every lone UTF-16 surrogate (`\\ud800`) replaced by U+FFFD, and whether it had one.

    The one change the proxy makes to what OpenCode receives: OpenCode would keep such a string in its session
    and resend it in every later request, which no UTF-8 transcript can hold (the tree could not go on).
    Any other document is returned as it is, byte for byte."""
    if b"\\ud" not in data.lower():  # JSON can only carry a lone surrogate as an escape
        return data, False
    try:
        obj = json.loads(data)
    except ValueError:
        return data, False
    if not _has_surrogate(obj):
        return data, False
    return json.dumps(_replace_surrogates(obj), ensure_ascii=False).encode("utf-8"), True


def repair_sse_line(line: bytes) -> tuple[bytes, bool]:
    """One SSE line (with its newline), its `data:` JSON repaired as `repair_json` does."""
    body = line.rstrip(b"\r\n")
    if not body.startswith(b"data:"):
        return line, False
    fixed, changed = repair_json(body[5:].strip())
    return (b"data: " + fixed + line[len(body) :], True) if changed else (line, False)


def _safe_raw(raw: Any, cap: int = 4000) -> str:
    """A reply as ASCII-escaped text (lone surrogates and all), capped: always writable to a transcript."""
    text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=True, default=str)
    return text.encode("ascii", "backslashreplace").decode("ascii")[:cap]


def reply_fields(body: dict, payload: Any, received: dict | None) -> dict:
    """The record fields of one 200 reply, read as the native client reads it (`teacher.response.normalize`):
    `usage` as the server reported it, or estimated from the text (`estimated: true`) when it reported none;
    `notes` on what normalisation found; a reply normalize cannot read is a failed step (`response: null`,
    `error: "malformed reply: ..."`, `raw_response`). `response` is the message as OpenCode received it, so the
    transcript matches OpenCode's session: calls written as text or as `function_call`, which normalize would
    turn into tool calls, stay text here (OpenCode did not run them; `notes` says what they were)."""
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    names = {
        t["function"]["name"]
        for t in tools
        if isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
    }
    try:
        reply = normalize(payload, names)
    except MalformedResponse as exc:
        return {
            "response": None,
            "usage": None,
            "finish_reason": None,
            "error": f"malformed reply: {exc}",
            "raw_response": _safe_raw(payload),
        }
    msg = dict(received or {"role": "assistant", "content": ""})
    if reply.message.get("reasoning_content"):
        msg["reasoning_content"] = reply.message["reasoning_content"]
    usage = usage_record(payload.get("usage")) or estimated_usage_record(body, msg)
    fields = {"response": msg, "usage": usage, "finish_reason": reply.finish_reason}
    if reply.notes:
        fields["notes"] = list(reply.notes)
    return fields


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
    """The server's usage (counts checked by `normalize` first), or None when it reports no token counts."""
    if not isinstance(usage, dict) or usage.get("prompt_tokens") is None:
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
    # The session's chain (agents/chain.py), set by the backend for each edge; a request that breaks it is
    # refused and `tampered` says why (the backend ends the edge).
    chain: SessionChain | None = None
    tampered: str | None = None
    probe: bool = (
        False  # the host's own fresh session: its request is recorded and answered here, never sent on
    )
    lock: threading.Lock = field(default_factory=threading.Lock)
    # In the channel's URL: an edge's sandbox knows only its own, so its Teacher cannot post into another
    # edge's transcript (every sandbox reaches the proxy's port).
    key: str = field(default_factory=lambda: secrets.token_hex(12))

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
        model: str | None = None,
        host: str = "127.0.0.1",
        outage_timeout: float = 600.0,
    ):
        self.upstream = upstream.rstrip("/")
        self.api_key = api_key
        self.timeout, self.retries, self.backoff_max = timeout, retries, backoff_max
        self.outage_timeout = float(outage_timeout or 0)
        self.extra_body = dict(extra_body or {})  # e.g. chat_template_kwargs: sent on, not recorded
        # The Teacher's real model name: OpenCode asks for the Student's model id (docs/opencode.md), which the
        # record keeps; the request goes on for this one.
        self.model = model
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
            self.unix_server = _QuietUnixServer(str(self.unix_socket), _handler_for(self, tcp=False))
            # Sandboxes run as unprivileged uids: they must reach the socket (any local user reaches the
            # TCP port as well; the socket adds nothing they could not do already).
            self.unix_dir.chmod(0o755)
            self.unix_socket.chmod(0o666)
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
            # An existing channel keeps `stopped`: only the backend's run opens it (not this, a turn's set-up).
            ch = self.channels.get(name) or Channel(name)
            ch.headers = dict(headers or ch.headers)
            self.channels[name] = ch
            return ch

    def drop(self, name: str) -> None:
        with self._lock:
            self.channels.pop(name, None)

    def base_url(self, name: str) -> str:
        ch = self.channels.get(name) or self.channel(name)
        return f"http://{self.host}:{self.port}/c/{name}~{ch.key}/v1"

    # forwarding
    def forward(self, method: str, path: str, headers: dict, body: bytes | None, stream: bool):
        """requests.Response from the Teacher, retrying transient failures; raises after the budget. Answers that
        no worker is there do not count against `retries` until they have lasted `outage_timeout` s."""
        url = self.upstream + path
        budget = RetryBudget(self.retries, self.outage_timeout, 0.5, self.backoff_max)
        while True:
            t_try = time.monotonic()
            resp = err = None
            try:
                resp = self.session.request(
                    method, url, headers=headers, data=body, stream=stream, timeout=(10, self.timeout)
                )
                if resp.status_code not in RETRY_STATUS:
                    return resp
                why = f"HTTP {resp.status_code}"
                unavailable = resp.status_code == 503 and no_worker_answer(503, resp.text)
            except requests.ConnectionError as exc:
                err, why, unavailable = exc, f"connection: {exc}", refused(exc)
            verdict, delay, waited = budget.spend(unavailable, t_try)
            if verdict in ("outage_over", "exhausted"):
                if err is not None:
                    raise err
                return resp
            if verdict == "waiting":
                log.warning("teacher %s: waiting for a Teacher worker: %.0f s of %g", why, waited,
                            self.outage_timeout)  # fmt: skip
            else:
                log.warning("teacher %s (attempt %d/%d), retrying in %.1fs", why, budget.failures, self.retries,
                            delay)  # fmt: skip
            if resp is not None:
                resp.close()
            time.sleep(delay)


def _handler_for(proxy: RecordingProxy, tcp: bool = True):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # A streamed reply is many small writes: with Nagle's algorithm each waits for the client's delayed ACK
        # (~40 ms a request on loopback). A Unix socket has no such algorithm.
        disable_nagle_algorithm = tcp

        def log_message(self, fmt, *args):  # the explore log has what matters
            pass

        def _route(self) -> tuple[Channel | None, str]:
            parts = self.path.split("/", 3)  # "", "c", "name~key", "v1/..."
            if len(parts) == 4 and parts[1] == "c":
                name, _, key = parts[2].partition("~")
                ch = proxy.channels.get(name)
                if ch is not None and not secrets.compare_digest(ch.key, key):
                    ch = None
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
            # As for a POST: without an edge's key nothing reaches the Teacher with our API key.
            if ch is None:
                return self._reply(403, {"error": {"message": "unknown channel"}})
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
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY:
                # The body stays unread, so this connection cannot carry another request.
                self.close_connection = True
                return self._reply(413, {"error": {"message": f"request body must be 0-{MAX_BODY} bytes"}})
            raw = self.rfile.read(length)
            if ch is None:  # no edge's channel (or not its key): nothing reaches the Teacher unrecorded
                return self._reply(403, {"error": {"message": "unknown channel"}})
            if ch.stopped:
                # The turn ended at `coral eval`; OpenCode is being stopped. Nothing of this reaches the Teacher.
                return self._reply(503, {"error": {"message": "turn ended (sftree interrupted the agent)"}})
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {}
            if not isinstance(body, dict):
                body = {}
            if ch.tampered:
                return self._reply(409, {"error": {"message": "session ended (tampered)"}})
            if ch.probe:  # what a fresh session sends is all the host wants of it (agents/chain.py Pristine)
                self._record(ch, body, ch.turn, {"response": None, "usage": None, "finish_reason": None}, 0.0,
                             "probe")  # fmt: skip
                return self._reply(400, {"error": {"message": "probe: no model behind this session"}})
            if ch.chain is not None and classify(body) == "agent":
                try:
                    with ch.lock:
                        ch.chain.check(body)
                except ChainBreak as exc:  # never reaches the Teacher; kept with its diff, never trained
                    ch.tampered = exc.reason
                    self._record(ch, body, ch.turn, {"response": None, "usage": None, "finish_reason": None},
                                 0.0, f"tampered: {exc.reason}", tampered=exc.diff)  # fmt: skip
                    log.warning("edge %s: a request broke the session's chain: %s", ch.name, exc.reason)
                    return self._reply(409, {"error": {"message": "session ended (tampered)"}})
            stream = bool(body.get("stream"))
            turn = ch.turn
            sent_on = dict(proxy.extra_body)
            if proxy.model and body.get("model") not in (None, proxy.model):
                sent_on["model"] = proxy.model
            if sent_on and body:
                raw = json.dumps({**body, **sent_on}).encode()
            t0 = time.monotonic()
            failed = {"response": None, "usage": None, "finish_reason": None}
            try:
                resp = proxy.forward("POST", path, self._headers(ch), raw, stream)
            except requests.RequestException as exc:
                self._record(ch, body, turn, failed, time.monotonic() - t0, f"teacher unreachable: {exc}")
                ch.teacher_failures += 1
                return self._reply(502, {"error": {"message": f"teacher unreachable: {exc}"}})
            if resp.status_code != 200:
                data = resp.content
                self._record(ch, body, turn, failed, time.monotonic() - t0, f"HTTP {resp.status_code}")
                ch.teacher_failures += 1
                self.send_response(resp.status_code)
                self.send_header("Content-Type", resp.headers.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if not stream:
                data, repaired = repair_json(resp.content)
                try:
                    payload = json.loads(data)
                except ValueError as exc:
                    fields = dict(failed, error=f"malformed reply: reply is not JSON ({exc})")
                    fields["raw_response"] = _safe_raw(data.decode("utf-8", "replace"))
                else:
                    fields = reply_fields(body, payload, message_from_completion(payload))
                self._record(ch, body, turn, fields, time.monotonic() - t0, None, repaired)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            # Streaming: relay each complete line at once (chunked encoding), assemble on the side.
            asm = StreamAssembler()
            self.send_response(200)
            self.send_header("Content-Type", resp.headers.get("Content-Type", "text/event-stream"))
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            recorded = False
            repaired = False
            pending = b""

            def record(error: str | None = None) -> None:
                nonlocal recorded
                if not recorded:
                    recorded = True
                    asm.close()
                    fields = reply_fields(body, asm.completion(), asm.message())
                    self._record(ch, body, turn, fields, time.monotonic() - t0, error, repaired)

            def send(data: bytes) -> None:
                if data:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()

            try:
                for piece in resp.iter_content(chunk_size=None):
                    if not piece:
                        continue
                    pending += piece
                    head, sep, pending = pending.rpartition(b"\n")
                    if not sep:  # no complete line yet (rpartition left it all in `pending`)
                        continue
                    lines = []
                    for line in (head + sep).splitlines(keepends=True):
                        line, fixed = repair_sse_line(line)
                        repaired |= fixed
                        lines.append(line)
                    out = b"".join(lines)
                    asm.feed(out)
                    if b"[DONE]" in out:  # record before the client can see the end of the answer
                        record()
                    send(out)
                if pending:
                    out, fixed = repair_sse_line(pending)
                    repaired |= fixed
                    asm.feed(out)
                    record()
                    send(out)
                record()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (OSError, requests.RequestException) as exc:  # OpenCode went away, or the Teacher broke
                self.close_connection = True
                record(f"stream cut: {type(exc).__name__}")
            finally:
                resp.close()

        def _record(self, ch, body, turn, fields, latency, error, repaired=False, tampered=None) -> None:
            rec = {
                "turn": turn,
                "kind": classify(body),
                "request": {
                    "model": body.get("model"),
                    "messages": body.get("messages") or [],
                    "tools": body.get("tools") or [],
                },
                "response": fields["response"],
                "tool_results": [],
                "usage": fields["usage"],
                "latency_s": round(latency, 4),
                "finish_reason": fields["finish_reason"],
                "session_id": self.headers.get("x-session-id"),
            }
            notes = list(fields.get("notes") or [])
            if repaired:
                notes.append("lone_surrogate_replaced")
            if notes:
                rec["notes"] = notes
            if compacted(body):
                rec["compacted"] = True
            if error or fields.get("error"):
                rec["error"] = error or fields["error"]
            if fields.get("raw_response") is not None:
                rec["raw_response"] = fields["raw_response"]
            if tampered is not None:
                rec["tampered"] = tampered
            with ch.lock:
                if ch.chain is not None and tampered is None and rec["kind"] == "agent":
                    cut = bool(rec.get("error")) or rec["finish_reason"] == "length"
                    ch.chain.answered(rec["response"], cut)
                ch.records.append(rec)

    return Handler
