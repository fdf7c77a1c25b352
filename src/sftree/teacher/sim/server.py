"""`sftree teacher-sim`: a deterministic OpenAI-compatible stand-in for SGLang (tests, demo, benchmarks).

    sftree teacher-sim --port 30000 [--host 127.0.0.1] [--seed 0] [--latency-ms-per-token 0]
                       [--latency-tail pareto:2.5] [--script faults.yaml] [--fault-rate http_500=0.05,...]
                       [--hang-s 30] [--model teacher-sim] [--omit-usage] [--chunk-ms 0]

Endpoints: `GET /health`, `GET /v1/models`, `GET /sim/stats` (requests seen, requests being answered now: the
fleet test bed's way to catch a worker while it answers), `POST /v1/chat/completions` (non-streaming, or SSE with
`"stream": true`: a role chunk, content and tool-call chunks, a finish chunk, then - as SGLang does with
`stream_options.include_usage` - a usage chunk with empty `choices`, then `data: [DONE]`).

The policy (policy.py) really works the task through tool calls. Usage: `prompt_tokens` = characters of the
serialized request // 4; `completion_tokens` likewise for the reply; `prompt_tokens_details.cached_tokens` =
the longest prefix, at message boundaries, shared with any earlier request (a set of chained prefix hashes:
O(request size) per request), which is what SGLang's radix cache would reuse.

`--chunk-ms` paces a streamed reply: that many milliseconds between two chunks (a slow but live stream).

`--omit-usage` leaves `usage` out of every reply (and the usage chunk out of a stream), as some OpenAI-compatible
servers do; the client then estimates tokens from the text.

Latency: (completion tokens + uncached prompt tokens / 50) * `--latency-ms-per-token`, times a Pareto(alpha)
draw (>= 1, heavy-tailed) with `--latency-tail pareto:alpha`.

Faults. `--fault-rate KIND=P[,KIND=P...]` gives each request probability P of KIND (drawn from the request's
hash and how often that exact request was seen, so a retried request can succeed). `--script FILE` (YAML or
JSON) is a list of rules aimed by the `X-Sftree-*` headers:

    - match: {edge: e4}              # keys: tree, edge, depth, turn, attempt, session (string compare)
      fault: tool_errors             # one of the kinds below
      count: 4                       # apply to the first N matching requests only (default: all)
    - match: {depth: 3, attempt: 1}
      fault: no_eval
    - match: {edge: e2, turn: 2}
      pad_tokens: 5000               # add ~N completion tokens of filler (a large context)
    - match: {depth: 3, attempt: 1, turn: 1}
      fault: extra_tool_errors       # 3 failing tool calls in that turn, besides its normal work
      count: 3
    - match: {}
      fault: http_503
      count: 2
    - match: {edge: e2, turn: 1}
      fault: length_text
      skip: 4                        # leave the first N matching requests alone (aim at a later step)
      count: 1

Kinds: http_500, http_503, http_429 (error status, no body work), no_worker (HTTP 503 with sglang-router's
`no_available_workers` error: the fleet has no worker to answer; the client waits it out for
`teacher.outage_timeout` instead of counting it against `retries`), hang (sleep `hang_s`, default --hang-s,
then answer: the client's request timeout fires first), stall (a streamed reply sends its first chunks, then
nothing for `hang_s` and closes without its end, as a server hung mid-reply; not streamed: as hang), cut (a
streamed reply sends its first chunks, then the connection closes, as a server killed mid-reply; not streamed:
the connection closes with no answer), malformed_args (tool-call arguments not valid JSON),
unknown_tool, tool_errors (a read of a missing file; after 3 failed calls the policy gives up and submits, so a
turn under it usually has no code change and no score), no_eval (text only: the model stops without an eval),
broken_code (the constant edit writes a syntax error, so the grader crashes), break_workspace (a bash step
that replaces `.coral/public` by a dangling link, without a sandbox: the host refuses it, the search records
`edge_error`).

Real-server shapes (docs/failures.md): context_overflow (HTTP 400 with SGLang's "longer than the model's
context length" message; also sent for every request whose prompt exceeds `--context-tokens`), lone_surrogate
(content holds a lone UTF-16 surrogate), bad_usage (`usage.prompt_tokens` is a string), tool_calls_string
(`tool_calls` is a JSON string), length_mid_call (`finish_reason: length`, the last call's arguments cut in
half), length_text (`finish_reason: length`, the reply cut inside its text: the planned calls never came; the
text is the policy's, or a sentence when it had none), hermes_text / json_text (no tool-call parser: the calls are written in `content` as Hermes
`<tool_call>{...}</tool_call>` blocks / as bare JSON), reasoning (a `reasoning_content` field, as SGLang's
`--reasoning-parser` gives), function_call (the legacy `function_call` field with the first call only),
logprobs_text (the token logprobs without ids, as SGLang's chat API gives them), logprobs_misaligned (two
tokens fewer than the usage counts).

A request with `logprobs: true` gets `choices[0].logprobs.content` from a toy distribution
(`teacher/sim/logprobs.py`), streamed spread over the chunks as llama-server does; a `top_logprobs` that is not
an integer from 0 to 20 is refused with HTTP 400, as SGLang refuses it.

extra_tool_errors / extra_tool_calls put one extra tool call *before* the planned step of each faulted request:
a read of a missing file (a real tool error) / a successful `glob` (no knowledge action). The plan goes on after
it and these errors never make the policy give up, so the turn still edits a constant, evals and gets a numeric
score. With `count: N` and a match that names one turn (`edge` or `depth`+`attempt`, plus `turn`), that turn
makes exactly N extra failing (or successful) calls: the way to set an edge's tool error rate precisely, e.g.
to test the hard-prune boundary (`tool_error_rate > 0.30`). If both apply to one request, that step carries
both calls (the failing read first), so each rule's `count` is still the number of calls it adds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Protocol, TypedDict, Unpack

import yaml

from sftree.errors import InputError
from sftree.httpserver import (
    QuietThreadingHTTPServer,
    Serving,
    local_url,
    read_body,
    send_json,
    serve_in_background,
)
from sftree.jsontypes import WireObject
from sftree.teacher.sim import policy
from sftree.teacher.sim.logprobs import top_k, toy_logprobs

log = logging.getLogger(__name__)

# Reply shapes of real servers (applied to the policy's reply; see `reshape`), not policy behaviour.
SHAPE_FAULTS = {
    "lone_surrogate",
    "bad_usage",
    "tool_calls_string",
    "length_mid_call",
    "length_text",
    "hermes_text",
    "json_text",
    "reasoning",
    "function_call",
    "logprobs_text",
    "logprobs_misaligned",
}
FAULT_KINDS = {
    "http_500",
    "http_503",
    "http_429",
    "no_worker",
    "hang",
    "stall",
    "cut",
    "malformed_args",
    "unknown_tool",
    "tool_errors",
    "extra_tool_errors",
    "extra_tool_calls",
    "no_eval",
    "broken_code",
    "break_workspace",
    "context_overflow",
    *SHAPE_FAULTS,
}
HTTP_FAULTS = {"http_500": 500, "http_503": 503, "http_429": 429}
# what sglang-router 0.3.2 answers when every worker is unhealthy or its circuit breaker open
NO_WORKER_BODY = {"error": {"type": "Service Unavailable", "code": "no_available_workers",
                            "message": "No available workers (all circuits open or unhealthy)"}}  # fmt: skip
MATCH_KEYS = {"tree", "edge", "depth", "turn", "attempt", "session"}


@dataclass
class Rule:
    match: dict[str, str]
    fault: str | None = None
    count: int | None = None
    pad_tokens: int = 0
    hang_s: float | None = None
    skip: int = 0
    used: int = 0
    skipped: int = 0

    def matches(self, headers: dict[str, str]) -> bool:
        return all(headers.get(k) == v for k, v in self.match.items())


def parse_rules(data: object, source: str = "script") -> list[Rule]:
    if data is None:
        return []
    if not isinstance(data, list):
        raise InputError(f"{source}: expected a list of rules")
    rules = []
    for i, r in enumerate(data):
        if not isinstance(r, dict):
            raise InputError(f"{source}: rule {i} is not a mapping")
        unknown = set(r) - {"match", "fault", "count", "pad_tokens", "hang_s", "skip"}
        if unknown:
            raise InputError(f"{source}: rule {i}: unknown keys {sorted(unknown)}")
        match = r.get("match") or {}
        if not isinstance(match, dict) or set(match) - MATCH_KEYS:
            raise InputError(f"{source}: rule {i}: match keys must be among {sorted(MATCH_KEYS)}")
        fault = r.get("fault")
        if fault is not None and fault not in FAULT_KINDS:
            raise InputError(f"{source}: rule {i}: unknown fault {fault!r} (one of {sorted(FAULT_KINDS)})")
        skip = r.get("skip", 0)
        if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
            raise InputError(f"{source}: rule {i}: skip must be a non-negative integer, not {skip!r}")
        rules.append(
            Rule(
                {k: str(v) for k, v in match.items()},
                fault,
                r.get("count"),
                int(r.get("pad_tokens", 0)),
                r.get("hang_s"),
                skip,
            )
        )
    return rules


def load_script(path: str | Path) -> list[Rule]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"teacher-sim script {path}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"teacher-sim script {path} is not valid YAML/JSON: {exc}") from None
    return parse_rules(data, str(path))


def parse_fault_rate(spec: Mapping[str, object] | str | None) -> dict[str, float]:
    if not spec:
        return {}
    items: list[tuple[str, object]] = []
    if isinstance(spec, Mapping):
        items = list(spec.items())
    else:
        for part in str(spec).split(","):
            if "=" not in part:
                raise InputError(f"--fault-rate: expected KIND=P, got {part!r}")
            key, value = part.split("=", 1)
            items.append((key.strip(), value))
    out: dict[str, float] = {}
    for k, v in items:
        if k not in FAULT_KINDS:
            raise InputError(f"--fault-rate: unknown fault {k!r} (one of {sorted(FAULT_KINDS)})")
        try:
            p = float(v) if isinstance(v, int | float | str) else float("nan")
        except ValueError:
            p = float("nan")
        if not 0 <= p <= 1:
            raise InputError(f"--fault-rate: {k}={v!r} is not a probability between 0 and 1")
        out[k] = p
    return out


def parse_tail(spec: str | None) -> float | None:
    if not spec:
        return None
    kind, _, alpha = str(spec).partition(":")
    try:
        value = float(alpha) if kind == "pareto" else 0.0
    except ValueError:
        value = 0.0
    if not value > 0:
        raise InputError(f"--latency-tail: expected pareto:ALPHA with ALPHA > 0, got {spec!r}")
    return value


@dataclass
class SimState:
    seed: int = 0
    latency_ms_per_token: float = 0.0
    tail_alpha: float | None = None
    rules: list[Rule] = field(default_factory=list)
    fault_rate: dict[str, float] = field(default_factory=dict)
    hang_s: float = 30.0
    model: str = "teacher-sim"
    context_tokens: int | None = None
    omit_usage: bool = False
    chunk_s: float = 0.0  # pause between two chunks of a streamed reply
    lock: threading.Lock = field(default_factory=threading.Lock)
    prefixes: set[bytes] = field(default_factory=set)
    seen: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    in_flight: int = 0  # POSTs being handled now (GET /sim/stats)

    def usage(self, messages: list[WireObject], tools: object, reply: WireObject) -> WireObject:
        """Token counts and the prefix-cache estimate (see module docstring)."""
        h = hashlib.sha256(json.dumps(tools or [], sort_keys=True).encode())
        chars = len(json.dumps(tools or [], sort_keys=True))
        boundaries = []
        for m in messages:
            s = json.dumps(m, sort_keys=True, ensure_ascii=False)
            h = hashlib.sha256(h.digest() + s.encode())
            chars += len(s)
            boundaries.append((h.digest(), chars // 4))
        cached = 0
        with self.lock:
            for digest, toks in boundaries:
                if digest in self.prefixes:
                    cached = toks
            self.prefixes.update(d for d, _ in boundaries)
        prompt = chars // 4
        completion = max(1, len(json.dumps(reply, ensure_ascii=False)) // 4)
        # A request is never all cached: the last message is new work (as SGLang reports it).
        cached = min(cached, max(0, prompt - 1))
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def faults_for(self, headers: dict[str, str], body_hash: str) -> tuple[set[str], int, float | None]:
        faults: set[str] = set()
        pad = 0
        hang = None
        with self.lock:
            n = self.seen.get(body_hash, 0)
            self.seen[body_hash] = n + 1
            self.requests += 1
            for r in self.rules:
                if not r.matches(headers) or (r.count is not None and r.used >= r.count):
                    continue
                if r.skipped < r.skip:
                    r.skipped += 1
                    continue
                r.used += 1
                if r.fault:
                    faults.add(r.fault)
                pad += r.pad_tokens
                if r.hang_s is not None:
                    hang = float(r.hang_s)
        if self.fault_rate:
            rng = random.Random(f"{self.seed}|{body_hash}|{n}")
            for kind, p in sorted(self.fault_rate.items()):
                if rng.random() < p:
                    faults.add(kind)
        return faults, pad, hang

    def latency(self, usage: WireObject, body_hash: str) -> float:
        if not self.latency_ms_per_token:
            return 0.0
        toks = (
            usage["completion_tokens"]
            + (usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]) / 50
        )
        secs: float = toks * self.latency_ms_per_token / 1000.0
        if self.tail_alpha:
            secs *= random.Random(f"lat|{self.seed}|{body_hash}").paretovariate(self.tail_alpha)
        return secs


def _header_view(handler: BaseHTTPRequestHandler) -> dict[str, str]:
    out: dict[str, str] = {}
    for k in MATCH_KEYS:
        v = handler.headers.get(f"X-Sftree-{k.capitalize()}")
        if v is not None:
            out[k] = v
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sftree-teacher-sim/1"
    state: SimState  # set on the subclass made per server

    def log_message(self, fmt: str, *args: object) -> None:  # quiet: the client logs what matters
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, status: int, obj: object) -> None:
        send_json(self, status, obj)

    def do_GET(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        if path == "/health":
            self._send(200, {"status": "ok"})
        elif path == "/sim/stats":  # the test bed's view: requests answered and being answered now
            with self.state.lock:
                stats = {"requests": self.state.requests, "in_flight": self.state.in_flight}
            self._send(200, stats)
        elif path in ("/v1/models", "/models"):
            self._send(
                200,
                {
                    "object": "list",
                    "data": [{"id": self.state.model, "object": "model", "owned_by": "sftree"}],
                },
            )
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        with self.state.lock:
            self.state.in_flight += 1
        try:
            self._post()
        finally:
            with self.state.lock:
                self.state.in_flight -= 1

    def _post(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        raw = read_body(self)
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(raw)
            messages = body["messages"]
            assert isinstance(messages, list)
        except (ValueError, KeyError, AssertionError):
            self._send(400, {"error": {"message": "body must be JSON with a `messages` list"}})
            return
        st = self.state
        body_hash = hashlib.sha256(_unstreamed(body, raw)).hexdigest()
        headers = _header_view(self)
        faults, pad, hang = st.faults_for(headers, body_hash)
        if "no_worker" in faults:
            self._send(503, NO_WORKER_BODY)
            return
        for kind, status in HTTP_FAULTS.items():
            if kind in faults:
                self._send(status, {"error": {"message": f"teacher-sim injected {kind}"}})
                return
        k = top_k(body)
        if isinstance(k, str):
            self._send(400, {"error": {"message": k, "type": "BadRequestError", "param": "top_logprobs"}})
            return
        hang_s = hang if hang is not None else st.hang_s
        streamed = bool(body.get("stream"))
        if "hang" in faults or ("stall" in faults and not streamed):
            time.sleep(hang_s)
        if "cut" in faults and not streamed:  # killed before answering: the connection just closes
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        reply = policy.decide(
            messages,
            seed=st.seed,
            edge=headers.get("edge", ""),
            faults=frozenset(faults - SHAPE_FAULTS - {"context_overflow"}),
            pad_tokens=pad,
            tools=_tool_names(body.get("tools")),
        )
        usage = st.usage(messages, body.get("tools"), reply)
        if "context_overflow" in faults or (st.context_tokens and usage["prompt_tokens"] > st.context_tokens):
            limit = st.context_tokens or usage["prompt_tokens"] - 1
            self._send(400, overflow_body(usage["prompt_tokens"], limit))
            return
        delay = st.latency(usage, body_hash)
        if delay:
            time.sleep(delay)
        finish = "tool_calls" if reply.get("tool_calls") else "stop"
        rid = f"chatcmpl-{body_hash[:24]}"
        payload: WireObject = {
            "id": rid,
            "object": "chat.completion",
            "created": 0,
            "model": st.model,
            "choices": [{"index": 0, "message": reply, "finish_reason": finish}],
        }
        if not st.omit_usage:
            payload["usage"] = usage
        payload = reshape(payload, faults & SHAPE_FAULTS)
        tokens = None
        if k is not None:  # drawn for the reply as sent (reshaped), as many as the usage counts
            choice = payload["choices"][0]
            tokens = toy_logprobs(choice["message"], usage["completion_tokens"], k, st.seed,
                                  with_ids="logprobs_text" not in faults)  # fmt: skip
            if "logprobs_misaligned" in faults:
                tokens = tokens[:-2]
            payload["choices"] = [dict(choice, logprobs={"content": tokens})]
        if streamed:  # the same (reshaped) reply as SSE chunks
            choice = payload["choices"][0]
            stop = ("stall", hang_s) if "stall" in faults else ("cut", 0.0) if "cut" in faults else None
            self._stream(rid, choice["message"], choice["finish_reason"], payload.get("usage"), stop, tokens)
            return
        self._send(200, payload)

    def _stream(
        self,
        rid: str,
        reply: WireObject,
        finish: str,
        usage: object,
        stop: tuple[str, float] | None = None,
        tokens: list[WireObject] | None = None,
    ) -> None:
        """The reply as SSE chunks; `stop` = ("stall", s) or ("cut", 0): after the first two chunks, hang for s
        seconds / close at once, never sending the rest (a server hung or killed mid-reply)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        sent = [0]

        pending = list(tokens or [])  # logprobs entries, a few per text chunk, the rest with the finish

        def chunk(delta: WireObject | None, finish_reason: str | None = None, usage_: object = None) -> None:
            if stop is not None and sent[0] == 2:
                self.wfile.flush()
                if stop[0] == "stall":
                    time.sleep(stop[1])
                self.connection.shutdown(socket.SHUT_RDWR)
                raise _StreamStopped
            if sent[0] and self.state.chunk_s:
                self.wfile.flush()
                time.sleep(self.state.chunk_s)
            sent[0] += 1
            choice: WireObject = {"index": 0, "delta": delta, "finish_reason": finish_reason}
            if tokens is not None and delta is not None and (delta or finish_reason):
                take = len(pending) if finish_reason else min(len(pending), 16)
                choice["logprobs"] = {"content": pending[:take]}
                del pending[:take]
            obj: WireObject = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": 0,
                "model": self.state.model,
                "choices": [] if delta is None else [choice],
            }
            if usage_ is not None:
                obj["usage"] = usage_
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        try:
            self._chunks(chunk, reply, finish, usage)
        except (_StreamStopped, OSError):  # stopped on purpose, or the client hung up
            self.close_connection = True

    def _chunks(self, chunk: _Chunk, reply: WireObject, finish: str, usage: object) -> None:
        chunk({"role": "assistant", "content": ""})
        if reply.get("reasoning_content"):
            chunk({"reasoning_content": reply["reasoning_content"]})
        content = reply.get("content") or ""
        for i in range(0, len(content), 64):
            chunk({"content": content[i : i + 64]})
        if reply.get("function_call"):  # legacy shape: one delta with the whole call
            chunk({"function_call": reply["function_call"]})
        if isinstance(reply.get("tool_calls"), str):  # the tool_calls_string shape, as one delta
            chunk({"tool_calls": reply["tool_calls"]})
        calls = reply.get("tool_calls")
        for j, c in enumerate(calls if isinstance(calls, list) else []):
            args = c["function"]["arguments"]
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": j,
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
            for i in range(0, len(args), 64):
                chunk({"tool_calls": [{"index": j, "function": {"arguments": args[i : i + 64]}}]})
        chunk({}, finish_reason=finish)
        if usage is not None:
            chunk(None, usage_=usage)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def _tool_names(tools: object) -> frozenset[str]:
    """The names of the offered tools (a tool without one names none)."""
    fns = (
        [(t.get("function") or {}) for t in tools or [] if isinstance(t, dict)]
        if isinstance(tools, list)
        else []
    )
    return frozenset(n for fn in fns if isinstance(n := fn.get("name"), str))


def _unstreamed(body: WireObject, raw: bytes) -> bytes:
    """The request as it would be sent without `stream`: a streamed request and its non-streamed twin are the same
    request to the sim (same reply id, faults and latency), as a real server's reply does not depend on it."""
    if "stream" not in body and "stream_options" not in body:
        return raw
    rest = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    return json.dumps(rest, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


class _Chunk(Protocol):
    """Sends one SSE chunk: its delta (None: the usage chunk), finish reason and usage."""

    def __call__(
        self, delta: WireObject | None, finish_reason: str | None = None, usage_: object = None
    ) -> None: ...


class _StreamStopped(Exception):
    """A `stall` or `cut` fault ended the stream."""


def overflow_body(tokens: int, limit: int) -> WireObject:
    """SGLang's answer to a prompt longer than the context (HTTP 400)."""
    msg = f"The input ({tokens} tokens) is longer than the model's context length ({limit} tokens)."
    return {"object": "error", "message": msg, "type": "BadRequestError", "param": None, "code": 400}


def reshape(payload: WireObject, shapes: set[str]) -> WireObject:
    """The reply as a real server would shape it under `shapes` (module docstring); pure."""
    if not shapes:
        return payload
    choice = payload["choices"][0]
    msg = dict(choice["message"])
    calls = [dict(c, function=dict(c["function"])) for c in msg.get("tool_calls") or []]
    if "reasoning" in shapes:
        msg["reasoning_content"] = "I should look at the code, change one thing, then run `coral eval`."
    if "lone_surrogate" in shapes:
        msg["content"] = (msg.get("content") or "") + "\ud800"
    if "bad_usage" in shapes:
        payload = dict(payload, usage=dict(payload["usage"], prompt_tokens="many"))
    if "length_text" in shapes:
        text = (
            msg.get("content")
            or "Next I will change one constant in the solution and then run the evaluation"
        )
        msg["content"] = text[: max(1, len(text) * 2 // 3)]
        calls = []
        choice = dict(choice, finish_reason="length")
    if calls and "length_mid_call" in shapes:
        args = calls[-1]["function"]["arguments"]
        calls[-1]["function"]["arguments"] = args[: max(1, len(args) // 2)]
        choice = dict(choice, finish_reason="length")
    if calls and "hermes_text" in shapes:
        blocks = [
            "<tool_call>\n"
            + json.dumps({"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])})
            + "\n</tool_call>"
            for c in calls
        ]
        msg["content"] = "\n".join([msg.get("content") or "", *blocks]).strip()
        calls = []
        choice = dict(choice, finish_reason="stop")
    elif calls and "json_text" in shapes:
        objs = [
            {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
            for c in calls
        ]
        msg["content"] = json.dumps(objs[0] if len(objs) == 1 else objs)
        calls = []
        choice = dict(choice, finish_reason="stop")
    elif calls and "function_call" in shapes:
        msg["function_call"] = calls[0]["function"]
        calls = []
        choice = dict(choice, finish_reason="function_call")
    if calls and "tool_calls_string" in shapes:
        msg["tool_calls"] = json.dumps(calls)
    elif calls:
        msg["tool_calls"] = calls
    else:
        msg.pop("tool_calls", None)
    return dict(payload, choices=[dict(choice, message=msg)])


def make_state(
    *,
    seed: int = 0,
    latency_ms_per_token: float = 0.0,
    latency_tail: str | None = None,
    script: list[object] | str | Path | None = None,
    fault_rate: Mapping[str, object] | str | None = None,
    hang_s: float = 30.0,
    model: str = "teacher-sim",
    context_tokens: int | None = None,
    omit_usage: bool = False,
    chunk_ms: float = 0.0,
) -> SimState:
    if isinstance(script, list):
        rules = parse_rules(script, "teacher.sim.script")
    elif script:
        rules = load_script(script)
    else:
        rules = []
    return SimState(
        seed=int(seed),
        latency_ms_per_token=float(latency_ms_per_token),
        tail_alpha=parse_tail(latency_tail),
        rules=rules,
        fault_rate=parse_fault_rate(fault_rate),
        hang_s=float(hang_s),
        model=model,
        context_tokens=context_tokens,
        omit_usage=bool(omit_usage),
        chunk_s=float(chunk_ms) / 1000.0,
    )


class SimOptions(TypedDict, total=False):
    """`make_state`'s options (config `teacher.sim`, the `teacher-sim` command's flags)."""

    seed: int
    latency_ms_per_token: float
    latency_tail: str | None
    script: list[object] | str | Path | None
    fault_rate: Mapping[str, object] | str | None
    hang_s: float
    model: str
    context_tokens: int | None
    omit_usage: bool
    chunk_ms: float


class SimServer(QuietThreadingHTTPServer):
    """teacher-sim's server: its handler class reads `state`, which tests read too."""

    state: SimState


def make_server(host: str = "127.0.0.1", port: int = 0, **opts: Unpack[SimOptions]) -> SimServer:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InputError(f"--port: {port!r} is not a TCP port (0-65535)")
    state = make_state(**opts)
    handler = type("SimHandler", (Handler,), {"state": state})
    try:
        server = SimServer((host, port), handler)
    except OSError as exc:  # in use, no such address, not permitted
        raise InputError(f"teacher-sim cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    server.daemon_threads = True
    server.state = state
    return server


def start_teacher_sim(
    port: int = 0, host: str = "127.0.0.1", **opts: Unpack[SimOptions]
) -> tuple[str, SimStop]:
    """Serve in a background thread; returns (base_url ending in /v1, stop). Port 0 picks a free port."""
    server = make_server(host, port, **opts)
    return local_url(server), SimStop(server, serve_in_background(server, "teacher-sim").thread)


class SimStop(Serving):
    """Stops a teacher-sim served in a background thread; `server.state` is its state (tests read it)."""

    server: SimServer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency-ms-per-token", type=float, default=0.0)
    parser.add_argument("--latency-tail", default=None, help="pareto:ALPHA (heavy-tailed latency multiplier)")
    parser.add_argument("--script", default=None, help="YAML/JSON list of fault rules (see module docstring)")
    parser.add_argument("--fault-rate", default=None, help="KIND=P[,KIND=P...]")
    parser.add_argument("--hang-s", type=float, default=30.0, help="how long a `hang` fault sleeps")
    parser.add_argument("--model", default="teacher-sim", help="model name served at /v1/models")
    parser.add_argument(
        "--context-tokens",
        type=int,
        default=None,
        help="answer HTTP 400 (context overflow) above this prompt",
    )
    parser.add_argument(
        "--omit-usage",
        action="store_true",
        help="leave token usage out of replies (a server that reports none)",
    )
    parser.add_argument(
        "--chunk-ms", type=float, default=0.0, help="milliseconds between two chunks of a streamed reply"
    )


def run(args: argparse.Namespace) -> int:
    server = make_server(
        args.host,
        args.port,
        seed=args.seed,
        latency_ms_per_token=args.latency_ms_per_token,
        latency_tail=args.latency_tail,
        script=args.script,
        fault_rate=args.fault_rate,
        hang_s=args.hang_s,
        model=args.model,
        context_tokens=args.context_tokens,
        omit_usage=args.omit_usage,
        chunk_ms=args.chunk_ms,
    )
    host, port = str(server.server_address[0]), server.server_address[1]
    print(f"teacher-sim serving on http://{host}:{port}/v1 (seed {args.seed})", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
