"""The recording proxy: sits between OpenCode and the Teacher and keeps the exact request context of every step.

OpenCode talks to `http://127.0.0.1:<port>/c/<channel>/v1/...`; the proxy forwards each request to the
Teacher's base URL (streaming responses are relayed chunk by chunk as they arrive) and records, per channel
(one channel per edge), the request's exact `messages` and `tools` and the assembled assistant message (SSE
chunks -> one message with `content`, `reasoning_content`, `tool_calls`), in the step-record shape of
docs/architecture.md. A channel per edge, rather than OpenCode's `x-session-id` header, attributes requests
to edges without waiting for the session id to appear in the event stream; the header is kept in each
record (`session_id`) so the two can be cross-checked.

What goes on is the request OpenCode sent cut to its messages, tools and `stream`, with every other field the
host's (teacher/params.py: the settings' model, sampling, seed, tool_choice, extra_body; never what an agent file
or plugin made OpenCode add); a field OpenCode sent with another value is recorded with the step (`params_diff`)
and counted on the channel, and every record keeps what was sent (`request.params`).

Each forwarded request carries the channel's `X-Sftree-*` headers, so `teacher-sim --script` can aim a fault at
one edge as with the native agent. Requests go to the Teacher through the native client's transport
(teacher/transport.py), so transient failures (a connection that fails, 429, 5xx, a stall before the first
chunk) are sent again under the same policy before a byte reaches OpenCode, and an answer that no worker is there
is waited out for `outage_timeout` s; a request that still fails is answered with the Teacher's last status (502
when there was none) so OpenCode reports it. A stream that stalls or breaks once relayed is cut (docs/failures.md,
"The Teacher transport").

Replies are passed on as sent, except that a lone UTF-16 surrogate is replaced by U+FFFD (`repair_json`: OpenCode
would resend it in every later request, which no transcript can hold); they are recorded as the native client
reads them (`reply_fields`: `teacher.response.normalize`, usage estimated when missing, malformed replies as
failed steps). docs/opencode.md, "What OpenCode receives, what is recorded".

Kinds: `title` (OpenCode's title generator), `compaction` (its summarising agent), `summary` (its session
summary agent), else `agent`. A `stopped` channel (the turn ended at `coral eval`) answers new requests with
503 and records nothing, so the step OpenCode starts while it is being interrupted never enters a transcript.

Whatever runs in an edge's sandbox can read that edge's key and reach the proxy (docs/security.md), so the proxy
trusts nothing of a request but its channel: it forwards exactly `POST /c/<edge>~<key>/v1/chat/completions`
(the target as sent, byte for byte) to the Teacher's chat completions, answers `GET .../v1/models` itself with
the Student's id, and refuses anything else with 403, counted (`refused`). The channel and key are checked from
the request line before a byte of the body is read; a request is admitted (`admit`) only within the caps of
`ProxyLimits` (body size, requests and bytes in flight per channel and in all, the turn's steps and bytes), and its
body is read within a deadline. Past the turn's caps the channel is `over_limit` and the backend ends the turn.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import secrets
import shutil
import socket
import socketserver
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import NotRequired, Protocol, TypedDict

from sftree.agents.chain import ChainBreak, SessionChain
from sftree.agents.chain import text_of as _text  # a message's content as text
from sftree.agents.turn_end import cut_call
from sftree.httpserver import QuietThreadingHTTPServer, Serving, send_json, serve_in_background
from sftree.jsontypes import JSONObject, JSONValue, arr, count, obj
from sftree.records.steplog import StepKind, StepRecord, TokenLogprobs, UsageRecord, usage_from
from sftree.runtime import tempdirs
from sftree.settings import AgentSettings, TeacherSettings, schema_defaults
from sftree.teacher.affinity import routing_headers
from sftree.teacher.http import InFlight
from sftree.teacher.logprobs import read_logprobs
from sftree.teacher.params import RequestParams, differences, sent_params, upstream_body
from sftree.teacher.response import MalformedResponse, normalize
from sftree.teacher.stream import StreamAssembler  # one assembler for the proxy and the client
from sftree.teacher.transport import Policy, TeacherError, Transient, Transport

log = logging.getLogger(__name__)

TITLE_MARK = "You are a title generator"
COMPACTION_MARKS = ("produce a structured summary", "summarizing conversations", "<conversation-checkpoint>")
SUMMARY_MARK = "like a pull request description"
HOP_HEADERS = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "host",
    "accept-encoding",
    "expect",
}
# A request body larger than this is refused unread: far above any real context (1M tokens of JSON is a few
# MB), and the proxy must not hold whatever a sandboxed process chooses to send.
MAX_BODY = 64 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")
# A request target names a channel as `/c/<name>~<key>` and then one of the two routes, matched on the target
# exactly as sent: a percent-escape, a dot segment, a repeated slash, a query or a fragment is simply not a route
# (nothing is normalised, so no normaliser can be fooled), and what reaches the Teacher is always its base URL +
# `/chat/completions`, never built from the client's path.
_CHANNEL = re.compile(r"/c/([^/~]+)~([^/]*)(/.*)?", re.S)
ROUTES = {("POST", "/v1/chat/completions"): "chat", ("GET", "/v1/models"): "models"}


@dataclass(frozen=True)
class ProxyLimits:
    """What requests may cost the host (issue #32): a sandboxed process chooses what it sends. Every check is made
    before a byte of the body is read, except the agent-step count, which needs the body's kind."""

    max_body: int = MAX_BODY  # one request's body
    body_timeout: float = 60.0  # seconds to receive one body, in all (a slow drip is cut: 408)
    # requests in flight on one channel (OpenCode sends one step at a time, a title beside it)
    per_channel: int = 4
    # requests in flight in all: as many as the Teacher serves at once by default (teacher.max_concurrency)
    total: int = field(default_factory=lambda: schema_defaults(TeacherSettings).max_concurrency)
    # Bodies held in flight (read, parsed, sent on): a request alone always fits; past it, the sum is capped.
    channel_bytes: int = MAX_BODY
    total_bytes: int = 256 << 20
    # agent model calls of one turn (agent.max_steps_per_turn); None: no cap
    steps_per_turn: int | None = None
    own_calls_per_turn: int = 8  # OpenCode's own calls (title, summary, compaction) a turn may add to those
    # request bytes of one turn (agent.max_request_mib_per_turn)
    bytes_per_turn: int = field(
        default_factory=lambda: schema_defaults(AgentSettings).max_request_mib_per_turn << 20
    )

    @classmethod
    def from_settings(cls, agent: AgentSettings) -> ProxyLimits:
        return cls(
            steps_per_turn=agent.max_steps_per_turn, bytes_per_turn=agent.max_request_mib_per_turn << 20
        )


# ---- pure helpers --------------------------------------------------------------------------------------------
def classify(body: JSONObject) -> StepKind:
    """agent | title | compaction | summary, from the request's system prompt and tools."""
    msgs = _messages(body)
    system = "".join(_text(m.get("content")) for m in msgs if m.get("role") == "system")
    if system.lstrip().startswith(TITLE_MARK):
        return "title"
    if not body.get("tools"):
        if any(mark in system for mark in COMPACTION_MARKS[:2]):
            return "compaction"
        if SUMMARY_MARK in system:
            return "summary"
    return "agent"


def compacted(body: JSONObject) -> bool:
    """The request carries a compacted history (OpenCode's checkpoint replaces earlier turns)."""
    return any(COMPACTION_MARKS[2] in _text(m.get("content")) for m in _messages(body))


def _messages(body: JSONObject) -> list[JSONObject]:
    """The request's messages that are objects (the body is the sandbox's: anything may be in it)."""
    msgs = body.get("messages")
    return [m for m in msgs if isinstance(m, dict)] if isinstance(msgs, list) else []


def message_from_completion(payload: JSONValue) -> JSONObject:
    """The assistant message of a non-streaming completion (as OpenCode reads it); `reply_fields` reads the
    finish reason and usage through `normalize`."""
    choices = arr(obj(payload).get("choices"))
    m = obj(obj(choices[0] if choices else None).get("message"))
    msg: JSONObject = {"role": "assistant", "content": m.get("content") or ""}
    reasoning = m.get("reasoning_content") or m.get("reasoning")
    if reasoning:
        msg["reasoning_content"] = reasoning
    if m.get("tool_calls"):
        msg["tool_calls"] = m["tool_calls"]
    return msg


def _has_surrogate(value: JSONValue) -> bool:
    if isinstance(value, str):
        return bool(_SURROGATE.search(value))
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def _replace_surrogates(value: JSONValue) -> JSONValue:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_SURROGATE.sub("\ufffd", k): _replace_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_surrogates(v) for v in value]
    return value


def repair_json(data: bytes) -> tuple[bytes, bool]:
    """A JSON document with every lone UTF-16 surrogate (`\\ud800`) replaced by U+FFFD, and whether it had one.

    The one change the proxy makes to what OpenCode receives: OpenCode would keep such a string in its session
    and resend it in every later request, which no UTF-8 transcript can hold (the tree could not go on).
    Any other document is returned as it is, byte for byte."""
    if b"\\ud" not in data.lower():  # JSON can only carry a lone surrogate as an escape
        return data, False
    try:
        doc: JSONValue = json.loads(data)
    except ValueError:
        return data, False
    if not _has_surrogate(doc):
        return data, False
    return json.dumps(_replace_surrogates(doc), ensure_ascii=False).encode("utf-8"), True


def repair_sse_line(line: bytes) -> tuple[bytes, bool]:
    """One SSE line (with its newline), its `data:` JSON repaired as `repair_json` does."""
    body = line.rstrip(b"\r\n")
    if not body.startswith(b"data:"):
        return line, False
    fixed, changed = repair_json(body[5:].strip())
    return (b"data: " + fixed + line[len(body) :], True) if changed else (line, False)


def _safe_raw(raw: object, cap: int = 4000) -> str:
    """A reply as ASCII-escaped text (lone surrogates and all), capped: always writable to a transcript."""
    text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=True, default=str)
    return text.encode("ascii", "backslashreplace").decode("ascii")[:cap]


class ReplyFields(TypedDict):
    """A reply's part of a step record (`reply_fields`): the message, its usage and finish reason, or why there
    is none."""

    response: JSONObject | None
    usage: UsageRecord | None
    finish_reason: str | None
    error: NotRequired[str]
    raw_response: NotRequired[str]
    notes: NotRequired[list[str]]
    logprobs: NotRequired[
        TokenLogprobs
    ]  # `teacher.logprobs: K`: the sampled tokens, as the native client keeps them
    logprobs_dropped: NotRequired[str]  # asked for, none kept: why


def _failed(error: str | None = None) -> ReplyFields:
    """The reply fields of a step with no answer (`error`: why, when the reply is the reason)."""
    fields: ReplyFields = {"response": None, "usage": None, "finish_reason": None}
    if error is not None:
        fields["error"] = error
    return fields


def reply_fields(
    body: JSONObject, payload: JSONValue, received: JSONObject | None, params: RequestParams | None = None
) -> ReplyFields:
    """The record fields of one 200 reply, read as the native client reads it (`teacher.response.normalize`):
    `usage` as the server reported it, or estimated from the text (`estimated: true`) when it reported none;
    `notes` on what normalisation found; a reply normalize cannot read is a failed step (`response: null`,
    `error: "malformed reply: ..."`, `raw_response`). `response` is the message as OpenCode received it, so the
    transcript matches OpenCode's session: calls written as text or as `function_call`, which normalize would
    turn into tool calls, stay text here (OpenCode did not run them; `notes` says what they were)."""
    offered = (obj(obj(t).get("function")).get("name") for t in arr(body.get("tools")))
    names = {n for n in offered if isinstance(n, str)}
    try:
        reply = normalize(payload, names)
    except MalformedResponse as exc:
        failed = _failed(f"malformed reply: {exc}")
        failed["raw_response"] = _safe_raw(payload)
        return failed
    msg: JSONObject = dict(received or {"role": "assistant", "content": ""})
    if reply.message.get("reasoning_content"):
        msg["reasoning_content"] = reply.message["reasoning_content"]
    usage = usage_record(obj(payload).get("usage")) or estimated_usage_record(body, msg)
    fields: ReplyFields = {"response": msg, "usage": usage, "finish_reason": reply.finish_reason}
    if reply.notes:
        fields["notes"] = list(reply.notes)
    if params is not None and params.logprobs > 0:  # asked for on the way out (teacher/params.py): kept here
        choices = arr(obj(payload).get("choices"))
        kept, dropped = read_logprobs(
            obj(choices[0]) if choices else {}, params.logprobs, max_tokens=params.max_tokens,
            completion_tokens=None if usage is None or usage.get("estimated") else usage["completion_tokens"],
        )  # fmt: skip
        if kept is not None:
            fields["logprobs"] = kept
        elif dropped is not None:
            fields["logprobs_dropped"] = dropped
    return fields


_warned_no_usage = threading.Event()


def estimated_usage_record(body: JSONObject, msg: JSONObject | None) -> UsageRecord | None:
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
    return usage_from(estimate_usage(serialize(body), msg))


def usage_record(usage: JSONValue) -> UsageRecord | None:
    """The server's usage (its counts checked by `normalize` first), or None when it reports no token counts."""
    if not isinstance(usage, dict) or usage.get("prompt_tokens") is None:
        return None
    details = obj(usage.get("prompt_tokens_details"))
    return {
        "prompt_tokens": count(usage.get("prompt_tokens")),
        "completion_tokens": count(usage.get("completion_tokens")),
        "cached_tokens": count(details.get("cached_tokens")),
    }


class _QuietUnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def handle_error(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: object
    ) -> None:
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
    records: list[StepRecord] = field(default_factory=list)
    stopped: bool = False
    teacher_failures: int = 0  # requests the Teacher failed past the proxy's retries (not client hang-ups)
    # The session's chain (agents/chain.py), set by the backend for each edge; a request that breaks it is
    # refused and `tampered` says why (the backend ends the edge).
    chain: SessionChain | None = None
    tampered: str | None = None
    # A reply of this run was cut at max_tokens inside a tool call (agents/turn_end.py): the channel stopped as
    # the reply was recorded, before OpenCode saw its end, so no later request pays for the cut arguments.
    cut_call: bool = False
    probe: bool = (
        False  # the host's own fresh session: its request is recorded and answered here, never sent on
    )
    lock: threading.Lock = field(default_factory=threading.Lock)
    # What this turn used (ProxyLimits), under the proxy's lock; counted per value of `turn`, so they start again
    # at zero when the backend sets the next turn.
    counted_turn: int = 0
    requests: int = 0  # admitted
    agent_steps: int = 0
    request_bytes: int = 0
    over: str | None = None
    inflight: int = 0
    inflight_bytes: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # reason -> requests refused on this channel
    # field -> requests in which OpenCode sent it with a value other than the host's (teacher/params.py)
    params_diffs: Counter[str] = field(default_factory=Counter)
    warned: bool = False
    # In the channel's URL: an edge's sandbox knows only its own, so its Teacher cannot post into another
    # edge's transcript (every sandbox reaches the proxy's port).
    key: str = field(default_factory=lambda: secrets.token_hex(12))

    @property
    def over_limit(self) -> str | None:
        """Why this turn's requests are refused (`step_limit: ...`, `byte_limit: ...`): the backend ends the turn."""
        return self.over if self.counted_turn == self.turn else None

    def roll(self) -> None:
        """Start the counts again if the turn changed (the caller holds the proxy's lock)."""
        if self.counted_turn != self.turn:
            self.counted_turn, self.requests, self.agent_steps, self.request_bytes = self.turn, 0, 0, 0
            self.over = None

    def take(self) -> list[StepRecord]:
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
        timeout: float | None = None,
        retries: int | None = None,
        backoff_max: float | None = None,
        extra_body: Mapping[str, JSONValue] | None = None,
        model: str | None = None,
        host: str = "127.0.0.1",
        outage_timeout: float | None = None,
        student_model: str | None = None,
        limits: ProxyLimits | None = None,
        tool_choice: str | None = None,
        policy: Policy | None = None,
        params: RequestParams | None = None,
    ):
        self.upstream = upstream.rstrip("/")
        self.api_key = api_key
        # The native client's policy (`teacher.*`, its `policy`), or the schema's; the keywords override it.
        given = {"request_timeout": timeout, "retries": retries, "backoff_max": backoff_max,
                 "outage_timeout": outage_timeout}  # fmt: skip
        base = asdict(policy) if policy is not None else {}
        self.transport = Transport(
            Policy.from_config({**base, **{k: v for k, v in given.items() if v is not None}})
        )
        # Every field of a request but its messages, tools and `stream` is the host's (teacher/params.py): the
        # settings' (`params`), else the schema's defaults; `model`, `extra_body` and `tool_choice` override them.
        chosen = params or RequestParams.from_settings(schema_defaults(TeacherSettings))
        if model is not None:
            chosen = replace(chosen, model=model)
        if tool_choice is not None:
            chosen = replace(chosen, tool_choice=tool_choice)
        if extra_body is not None:
            chosen = replace(chosen, extra_body=dict(extra_body))
        self.params = chosen
        # The id `GET .../v1/models` answers: OpenCode's (the Student's), never the Teacher's.
        self.student_model = student_model
        self.limits = limits or ProxyLimits()
        self.channels: dict[str, Channel] = {}
        self._lock = threading.Lock()
        # Admission (under _lock): requests and body bytes in flight in all; refusals by reason, in all.
        self.inflight = self.inflight_bytes = 0
        self.refused: Counter[str] = Counter()
        self._warned_unknown = False
        self._stopped = False
        self.server = QuietThreadingHTTPServer((host, 0), _handler_for(self))
        self.server.daemon_threads = True
        self.host, self.port = host, self.server.server_address[1]
        self._serving: list[Serving] = []
        self.unix_server: socketserver.ThreadingUnixStreamServer | None = None
        self.unix_dir: Path | None = None

    @property
    def unix_socket(self) -> Path | None:
        return self.unix_dir / "proxy.sock" if self.unix_dir else None

    # lifecycle
    def start(self, unix: bool = False) -> RecordingProxy:
        """Serve on TCP, and with `unix` also on a Unix socket (for agents in a network-less sandbox)."""
        servers: list[socketserver.BaseServer] = [self.server]
        if unix:
            self.unix_dir = tempdirs.make("sftree-proxy-")  # pid-named, short: socket paths < 108 bytes
            sock = self.unix_dir / "proxy.sock"
            self.unix_server = _QuietUnixServer(str(sock), _handler_for(self, tcp=False))
            # Sandboxes run as unprivileged uids: they must reach the socket (any local user reaches the
            # TCP port as well; the socket adds nothing they could not do already).
            self.unix_dir.chmod(0o755)
            sock.chmod(0o666)
            servers.append(self.unix_server)
        self._serving = [serve_in_background(srv, "recording-proxy", poll_s=0.2) for srv in servers]
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
        if self._stopped:
            return
        self._stopped = True
        for serving in self._serving:
            serving.stop()
        self.server.server_close()  # also when it never served
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

    # admission: the one place every request's cost is counted
    def admit(self, ch: Channel, length: int) -> tuple[int, str, str] | None:
        """Before a byte of the body is read: None when it may be read and sent on (then `release` it), else
        (status, reason, message) to refuse it with."""
        lim = self.limits
        with self._lock:
            ch.roll()
            if ch.over:
                return 503, "limit", f"turn ended: {ch.over}"
            if lim.steps_per_turn is not None and ch.requests >= lim.steps_per_turn + lim.own_calls_per_turn:
                return self._over(ch, f"step_limit: {ch.requests} requests this turn (max_steps_per_turn "
                                      f"{lim.steps_per_turn} + {lim.own_calls_per_turn} of OpenCode's own)")  # fmt: skip
            if ch.request_bytes + length > lim.bytes_per_turn:
                return self._over(
                    ch, f"byte_limit: requests of this turn past {lim.bytes_per_turn >> 20} MiB"
                )
            if (
                ch.inflight >= lim.per_channel
                or self.inflight >= lim.total
                or (ch.inflight_bytes and ch.inflight_bytes + length > lim.channel_bytes)
                or (self.inflight_bytes and self.inflight_bytes + length > lim.total_bytes)
            ):
                return 429, "busy", "too many requests in flight"
            ch.requests += 1
            ch.request_bytes += length
            ch.inflight += 1
            ch.inflight_bytes += length
            self.inflight += 1
            self.inflight_bytes += length
        return None

    def count_step(self, ch: Channel, kind: str) -> tuple[int, str, str] | None:
        """After the body is read: an agent model call counts against the turn's step limit."""
        steps = self.limits.steps_per_turn
        if kind != "agent" or steps is None:
            return None
        with self._lock:
            ch.roll()
            if ch.agent_steps >= steps:
                return self._over(ch, f"step_limit: over {steps} agent model calls this turn")
            ch.agent_steps += 1
        return None

    def release(self, ch: Channel, length: int) -> None:
        with self._lock:
            ch.inflight -= 1
            ch.inflight_bytes -= length
            self.inflight -= 1
            self.inflight_bytes -= length

    def _over(self, ch: Channel, why: str) -> tuple[int, str, str]:
        """Mark the channel's turn over its caps (caller holds _lock): refused, as a stopped channel is."""
        if not ch.over:
            ch.over = why
            log.warning("proxy: edge %s turn %d: %s; the request is refused and the turn ends", ch.name,
                        ch.turn, why)  # fmt: skip
        return 503, "limit", f"turn ended: {why}"

    def count_diff(self, ch: Channel, diff: Mapping[str, object]) -> None:
        """Count the fields of a request OpenCode sent with values other than the host's; the first such request of
        a channel is logged (something OpenCode loaded tried to choose how the reply is sampled)."""
        with self._lock:
            first = not ch.params_diffs
            ch.params_diffs.update(diff.keys())
        if first:
            log.warning("proxy: edge %s: OpenCode sent request fields of its own (%s); the host's were sent "
                        "instead and the difference is recorded", ch.name, ", ".join(sorted(diff))[:300])  # fmt: skip

    def count_refusal(self, ch: Channel | None, reason: str, what: str) -> None:
        """Count a refused request; the first on each channel (and the first without one) is logged."""
        with self._lock:
            self.refused[reason] += 1
            if ch is not None:
                ch.refused[reason] += 1
                first, ch.warned = not ch.warned, True
            else:
                first, self._warned_unknown = not self._warned_unknown, True
        if first and reason != "limit":  # `_over` logged that one
            log.warning("proxy: %s: refused %s (%s); later refusals %s are counted, not logged",
                        f"edge {ch.name}" if ch else "no channel", what[:300], reason,
                        "on this channel" if ch else "without a channel")  # fmt: skip

    # forwarding
    def forward(self, headers: dict[str, str], body: bytes, stream: bool, label: str) -> Upstream:
        """The Teacher's answer to a chat completion, sent through the transport and so retried as the native
        client's requests are (teacher/transport.py); TeacherError once it is given up. A streamed answer's first
        bytes are read before the answer is returned, so a stall before them is retried too: after them,
        OpenCode has seen the answer begin and only it can send the request again."""
        url = self.upstream + "/chat/completions"

        def attempt(n: int) -> Upstream:
            t0 = time.monotonic()
            entry = InFlight(t0, t0, label)
            r = self.transport.send(url, body, headers, stream=stream, entry=entry)
            self.transport.check_status(r, t0)
            if not stream or r.status_code != 200:
                return Upstream(r, entry)
            rest = self.transport.chunks(r, entry)
            try:
                first = next(rest, b"")
            except Transient:
                r.close()
                raise
            return Upstream(r, entry, first, rest)

        return self.transport.run(attempt, url=url, label=label, log=log)


class UpstreamResponse(Protocol):
    """What the proxy reads of the transport's response (a requests.Response)."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content(self) -> bytes: ...
    def close(self) -> None: ...


@dataclass
class Upstream:
    """The Teacher's answer to one forwarded request: its response and, streamed, the bytes read so far (`first`)
    and an iterator of the rest, read within the transport's stall limits."""

    response: UpstreamResponse
    entry: InFlight
    first: bytes = b""
    rest: Iterator[bytes] = field(default_factory=lambda: iter(()))


class _Handler(BaseHTTPRequestHandler):
    """A connection to the proxy: `_serve` answers each request by its route (`_models`, `_chat`) or refuses it.
    `proxy` is set per server (`_handler_for`)."""

    protocol_version = "HTTP/1.1"
    proxy: RecordingProxy
    # The request that went on for the one being answered (None: it did not), and what OpenCode sent otherwise
    sent: JSONObject | None = None
    diff: dict[str, dict[str, str]] = {}  # noqa: RUF012 - replaced per request, never changed in place

    def log_message(self, format: str, *args: object) -> None:  # the explore log has what matters
        pass

    def _channel(self) -> tuple[Channel, str] | None:
        """The channel the request target names with that channel's own key, and the rest of the target."""
        m = _CHANNEL.fullmatch(self.path)
        ch = self.proxy.channels.get(m[1]) if m else None
        # bytes: the target is any latin-1 text, which compare_digest takes only as bytes
        if m is None or ch is None or not secrets.compare_digest(ch.key.encode(), m[2].encode("latin-1")):
            return None
        return ch, m[3] or ""

    def _headers(self, ch: Channel | None) -> dict[str, str]:
        out = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in HOP_HEADERS and not k.lower().startswith("x-sftree-")
        }
        out.pop("Authorization", None)
        out.pop("authorization", None)
        if self.proxy.api_key:
            out["Authorization"] = f"Bearer {self.proxy.api_key}"
        if ch is not None:
            out.update(ch.headers)
            out["X-Sftree-Turn"] = str(ch.turn)
            out.update(routing_headers(out))  # behind smg: the session stays on one worker
        return out

    def _reply(self, status: int, doc: JSONValue) -> None:
        send_json(self, status, doc)

    def _refuse(self, ch: Channel | None, status: int, reason: str, message: str) -> None:
        """Refused, counted; the body stays unread, so the connection is closed after the answer."""
        self.proxy.count_refusal(ch, reason, f"{self.command} {self.path!r}")
        self._close(status, message, retry=status == 429)

    def _close(self, status: int, message: str, retry: bool = False) -> None:
        self.close_connection = True
        data = json.dumps({"error": {"message": message}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        if retry:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(data)

    def handle_expect_100(self) -> bool:
        # `100 Continue` only once the request is admitted (`_chat`): no body is invited before.
        return True

    def __getattr__(self, name: str) -> Callable[[], None]:
        # BaseHTTPRequestHandler looks up `do_<METHOD>` by name: every method (PUT, DELETE, HEAD, OPTIONS, any
        # name) is answered as GET and POST are, by `_serve`, which refuses all but the two routes, counted.
        if name.startswith("do_"):
            return self._serve
        raise AttributeError(name)

    def do_POST(self) -> None:
        self._serve()

    do_GET = do_POST

    def _serve(self) -> None:
        """The request line and headers are in; nothing of the body has been read."""
        self.sent, self.diff = None, {}
        found = self._channel()
        if found is None:  # no edge's channel, or not its key: nothing reaches the Teacher unrecorded
            self._refuse(None, 403, "key", "unknown channel")
            return
        ch, rest = found
        route = ROUTES.get((self.command, rest))
        if route is None:  # e.g. `/v1/../../flush_cache`: the Teacher server's other endpoints
            self._refuse(ch, 403, "path", "only POST <channel>/v1/chat/completions is served")
            return
        if route == "models":
            self._models()
            return
        length = self._length(ch)
        if length is None:
            return
        if ch.stopped:
            # The turn ended at `coral eval`; OpenCode is being stopped. Nothing of this reaches the Teacher.
            self._close(503, "turn ended (sftree interrupted the agent)")
            return
        refusal = self.proxy.admit(ch, length)
        if refusal is not None:
            self._refuse(ch, *refusal)
            return
        try:
            self._chat(ch, length)
        finally:
            self.proxy.release(ch, length)

    def _models(self) -> None:
        """The Student's id only: the Teacher's name reaches no prompt and no record."""
        ids = [self.proxy.student_model] if self.proxy.student_model else []
        data: list[JSONValue] = [
            {"id": i, "object": "model", "created": 0, "owned_by": "sftree"} for i in ids
        ]
        self._reply(200, {"object": "list", "data": data})

    def _length(self, ch: Channel) -> int | None:
        """The body's length as its one Content-Length says, within `max_body`; None when refused for it."""
        lengths = self.headers.get_all("Content-Length") or []
        if (
            self.headers.get("Transfer-Encoding")
            or len(lengths) != 1
            or not re.fullmatch(r"[0-9]+", lengths[0])
        ):
            self._refuse(ch, 411, "body", "one Content-Length is required (no chunked bodies)")
            return None
        if len(lengths[0]) > 18 or int(lengths[0]) > self.proxy.limits.max_body:
            self._refuse(ch, 413, "body", f"request body over {self.proxy.limits.max_body} bytes")
            return None
        return int(lengths[0])

    def _read_body(self, length: int) -> tuple[bytes | None, str]:
        """The body, read within `body_timeout` s in all (a byte now and then does not keep it going), or
        (None, why)."""
        deadline = time.monotonic() + self.proxy.limits.body_timeout
        parts: list[bytes] = []
        got = 0
        try:
            while got < length:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None, "slow"
                self.connection.settimeout(left)
                part = self.rfile.read1(min(length - got, 1 << 20))
                if not part:
                    return None, "closed"
                parts.append(part)
                got += len(part)
        except TimeoutError:
            return None, "slow"
        except OSError:
            return None, "closed"
        finally:
            try:
                self.connection.settimeout(None)
            except OSError:
                pass
        return b"".join(parts), ""

    def _chat(self, ch: Channel, length: int) -> None:
        """An admitted chat completion: read, checked, sent on, relayed, recorded."""
        request = self._request(ch, length)
        if request is None or not self._may_go_on(ch, request[1]):
            return
        raw, body = request
        del request, raw  # what goes on is built afresh: OpenCode's messages and tools, the host's fields
        turn, t0, stream = ch.turn, time.monotonic(), bool(body.get("stream"))
        headers = self._headers(ch)
        self.sent = upstream_body(body, self.proxy.params, headers)
        self.diff = differences(body, self.sent)
        if self.diff:
            self.proxy.count_diff(ch, self.diff)
        raw = json.dumps(self.sent).encode()
        try:
            up = self.proxy.forward(headers, raw, stream, f"{ch.name} turn {turn}")
        except TeacherError as exc:
            if exc.last is not None and exc.last.response is not None:  # the Teacher's own last answer
                self._pass_failure(ch, body, turn, t0, exc.last.response)
                return
            self._record(ch, body, turn, _failed(), time.monotonic() - t0, f"teacher unreachable: {exc}")
            ch.teacher_failures += 1
            self._reply(502, {"error": {"message": f"teacher unreachable: {exc}"}})
            return
        if up.response.status_code != 200:
            self._pass_failure(ch, body, turn, t0, up.response)
        elif not stream:
            self._pass_reply(ch, body, turn, t0, up.response)
        else:
            _Relay(self, ch, body, turn, t0).run(up)

    def _request(self, ch: Channel, length: int) -> tuple[bytes, JSONObject] | None:
        """The request's bytes and its JSON object, or None when it was answered for being unreadable."""
        if self.headers.get("Expect", "").lower() == "100-continue":
            self.send_response_only(100)
            self.end_headers()
        raw, why = self._read_body(length)
        if raw is None:
            self.close_connection = True
            if why == "slow":
                self._refuse(
                    ch, 408, "slow", f"request body not received within {self.proxy.limits.body_timeout:g} s"
                )
            return None
        try:
            body: JSONValue = json.loads(raw)
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict):
            self._refuse(ch, 400, "body", "the request body is not a JSON object")
            return None
        return raw, body

    def _may_go_on(self, ch: Channel, body: JSONObject) -> bool:
        """Whether the request goes on to the Teacher; else it has been answered here (a tampered session, the
        host's probe, the turn's step limit, a request that breaks the session's chain)."""
        if ch.tampered:
            self._reply(409, {"error": {"message": "session ended (tampered)"}})
            return False
        if ch.probe:  # what a fresh session sends is all the host wants of it (agents/chain.py Pristine)
            self._record(ch, body, ch.turn, _failed(), 0.0, "probe")
            self._reply(400, {"error": {"message": "probe: no model behind this session"}})
            return False
        refusal = self.proxy.count_step(ch, classify(body))
        if refusal is not None:
            self._refuse(ch, *refusal)
            return False
        if ch.chain is not None and classify(body) == "agent":
            try:
                with ch.lock:
                    ch.chain.check(body)
            except ChainBreak as exc:  # never reaches the Teacher; kept with its diff, never trained
                ch.tampered = exc.reason
                self._record(ch, body, ch.turn, _failed(), 0.0, f"tampered: {exc.reason}", tampered=exc.diff)
                log.warning("edge %s: a request broke the session's chain: %s", ch.name, exc.reason)
                self._reply(409, {"error": {"message": "session ended (tampered)"}})
                return False
        return True

    def _pass_failure(
        self, ch: Channel, body: JSONObject, turn: int, t0: float, resp: UpstreamResponse
    ) -> None:
        """The Teacher's failure (a status that is not retried, or the last of a request given up), passed on."""
        data = resp.content
        # The server's own words (bounded): a context overflow says so (agents/turn_end.py)
        said = _safe_raw(data.decode("utf-8", "replace"), 300)
        self._record(ch, body, turn, _failed(), time.monotonic() - t0, f"HTTP {resp.status_code}: {said}")
        ch.teacher_failures += 1
        self.send_response(resp.status_code)
        self.send_header("Content-Type", resp.headers.get("Content-Type", "application/json"))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _pass_reply(
        self, ch: Channel, body: JSONObject, turn: int, t0: float, resp: UpstreamResponse
    ) -> None:
        """A plain (not streamed) reply, recorded and passed on (lone surrogates repaired)."""
        data, repaired = repair_json(resp.content)
        try:
            payload: JSONValue = json.loads(data)
        except ValueError as exc:
            fields = _failed(f"malformed reply: reply is not JSON ({exc})")
            fields["raw_response"] = _safe_raw(data.decode("utf-8", "replace"))
        else:
            fields = reply_fields(body, payload, message_from_completion(payload), self.proxy.params)
        self._record(ch, body, turn, fields, time.monotonic() - t0, None, repaired)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(
        self,
        ch: Channel,
        body: JSONObject,
        turn: int,
        fields: ReplyFields,
        latency: float,
        error: str | None,
        repaired: bool = False,
        tampered: dict[str, str] | None = None,
    ) -> None:
        """The step record of one request (and its answer, `fields`), kept on the channel; the chain learns the
        answer, and a call cut at max_tokens stops the channel."""
        rec: StepRecord = {
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
        if "raw_response" in fields:
            rec["raw_response"] = fields["raw_response"]
        if "logprobs" in fields:
            rec["logprobs"] = fields["logprobs"]
        if "logprobs_dropped" in fields:
            rec["logprobs_dropped"] = fields["logprobs_dropped"]
        if tampered is not None:
            rec["tampered"] = tampered
        if self.sent is not None:  # it went on: with the host's fields (teacher/params.py)
            rec["request"]["params"] = sent_params(self.sent)
        if self.diff:
            rec["params_diff"] = self.diff
        with ch.lock:
            if ch.chain is not None and tampered is None and rec["kind"] == "agent":
                cut = bool(rec.get("error")) or rec["finish_reason"] == "length"
                ch.chain.answered(rec["response"], cut)
            if rec["kind"] == "agent" and cut_call(rec) and not ch.probe:
                ch.cut_call = ch.stopped = True  # the turn ends here (agents/turn_end.py)
            ch.records.append(rec)


class _Relay:
    """A streamed reply relayed to OpenCode as it comes, each complete line at once (chunked encoding),
    assembled on the side and recorded once: before OpenCode can see the answer's end, or when it breaks."""

    def __init__(self, handler: _Handler, ch: Channel, body: JSONObject, turn: int, t0: float):
        self.h, self.ch, self.body, self.turn, self.t0 = handler, ch, body, turn, t0
        self.asm = StreamAssembler()
        self.recorded = self.repaired = False
        self.pending = b""

    def run(self, up: Upstream) -> None:
        h = self.h
        h.send_response(200)
        h.send_header("Content-Type", up.response.headers.get("Content-Type", "text/event-stream"))
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        try:
            for piece in itertools.chain((up.first,), up.rest):
                self._piece(piece)
                up.entry.chunks = self.asm.chunks  # past the first chunk, the stall limit applies
            if self.pending:  # a last line without its newline
                self._lines(self.pending, last=True)
            self.record()
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (OSError, Transient) as exc:  # OpenCode went away, or the Teacher broke off or stalled
            h.close_connection = True
            why = f"{exc.kind}: {exc.detail}" if isinstance(exc, Transient) else type(exc).__name__
            self.record(f"stream cut: {why}")
        finally:
            up.response.close()

    def _piece(self, piece: bytes) -> None:
        """Bytes from the Teacher: the complete lines among them are passed on, the rest waits for its end."""
        if not piece:
            return
        self.pending += piece
        head, sep, self.pending = self.pending.rpartition(b"\n")
        if sep:  # else no complete line yet (rpartition left it all in `pending`)
            self._lines(head + sep)

    def _lines(self, data: bytes, last: bool = False) -> None:
        lines = []
        for line in data.splitlines(keepends=True):
            line, fixed = repair_sse_line(line)
            self.repaired |= fixed
            lines.append(line)
        out = b"".join(lines)
        self.asm.feed(out)
        if last or b"[DONE]" in out:  # record before the client can see the end of the answer
            self.record()
        self.h.wfile.write(b"%x\r\n%s\r\n" % (len(out), out))
        self.h.wfile.flush()

    def record(self, error: str | None = None) -> None:
        if not self.recorded:
            self.recorded = True
            self.asm.close()
            fields = reply_fields(self.body, self.asm.completion(), self.asm.message(), self.h.proxy.params)
            self.h._record(
                self.ch, self.body, self.turn, fields, time.monotonic() - self.t0, error, self.repaired
            )


def _handler_for(proxy: RecordingProxy, tcp: bool = True) -> type[_Handler]:
    """The handler class of one of the proxy's servers. A streamed reply is many small writes: with Nagle's
    algorithm each waits for the client's delayed ACK (~40 ms a request on loopback); a Unix socket has none."""

    class Handler(_Handler):
        pass

    Handler.proxy, Handler.disable_nagle_algorithm = proxy, tcp
    return Handler
