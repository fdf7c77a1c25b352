"""Client for the Teacher: an OpenAI-compatible `/v1/chat/completions` server with tool calling (SGLang).

- `wait_ready()` polls `/health` then `/v1/models` until `health_timeout`, and fails with a message naming the
  URL and how to start SGLang.
- `chat()` sends through the Teacher transport (`teacher/transport.py`, shared with the OpenCode backend's
  recording proxy), which sends connection errors, timeouts, stalls, 429 and 5xx (SGLang answers 503 when its
  queue is full) again with capped exponential backoff; under a semaphore of `max_concurrency` in flight.
- An answer that there is nobody to answer - connection refused (a server or router restarting), or
  sglang-router's 503 `no_available_workers` (every worker unhealthy or its circuit open, e.g. one worker dead
  and the other just restarted) - does not count against `retries`: the request keeps being sent again, with
  the same backoff, until it has found no worker for `outage_timeout` s on end, logging "waiting for a Teacher
  worker: N s of M", and only then gives up (docs/failures.md, "No worker to answer").
- A 400 that says the request outgrew the model's context raises `ContextOverflow` (never retried: the agent
  ends the turn with `context_overflow`); a 200 reply that is not a readable completion raises `BadReply` with
  the reason (the agent records one failed step). Replies are normalised in `teacher/response.py`.
- Every reply carries its usage (`prompt_tokens`, `completion_tokens`,
  `usage.prompt_tokens_details.cached_tokens`) and latency. A server that reports no usage gets an estimate from
  the text (`estimate_usage`, 4 characters per token), a warning once per client, and `estimated: true` in the
  usage it records, so the token reward and the token limit still work.
- Requests are serialized deterministically (fixed key order, compact separators, UTF-8), so a forked session
  resends its earlier turns byte for byte and SGLang's radix cache can reuse the prefix.
- `constrain: tool_call` adds a `response_format` JSON schema built from the offered tools, so a server that
  honours it (llama-server) answers one JSON tool call from the first token; `normalize` reads it as a call
  (docs/real_teacher.md).
- `X-Sftree-*` headers name the tree, edge, depth, turn, attempt and session (SGLang ignores them; teacher-sim
  matches scripted faults on them).
- `stream: true` (the default) asks for the reply as SSE chunks (`stream_options.include_usage`) and folds them
  into the completion a non-streamed reply would be (`teacher/stream.py`), so the recorded step is the same.
  A server that sends nothing for `first_chunk_timeout` s after the request, or `stall_timeout` s between two
  chunks, or closes the stream before its end, has stalled or died: the request is abandoned and sent again
  (it counts against `retries`), and the incident is logged and kept in `stats["incidents"]` (tree.json
  `teacher`, the report).
- Behind `sglang-router` the client also watches the router's worker list (`GET /workers`, every `fleet_poll`
  s): when a worker turns unhealthy, every request in flight that has had no chunk for `FLEET_GRACE` s is
  abandoned and sent again at once, so the router places it on a live worker instead of the client waiting out
  a timeout on a dead one (docs/failures.md, "Stalled and dying servers"; docs/serving.md).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Literal, TypedDict, get_args

from sftree.errors import TeacherUnavailable
from sftree.jsontypes import ChatMessages, ForeignJSON, Tools, WireObject
from sftree.records.steplog import TokenLogprobs
from sftree.settings import JSONMap, TeacherSettings
from sftree.teacher.affinity import routing_headers
from sftree.teacher.http import InFlight
from sftree.teacher.logprobs import read_logprobs
from sftree.teacher.params import RequestParams
from sftree.teacher.response import MalformedResponse, Reply, is_context_overflow, normalize
from sftree.teacher.router_watch import RouterWatcher, read_workers
from sftree.teacher.stream import StreamAssembler
from sftree.teacher.transport import (  # noqa: F401 - TeacherError, backoff_delay, no_worker_answer, refused:
    Policy,  # the client's names for the transport's (tests, callers)
    RequestFailed,
    Response,
    TeacherError,
    Transient,
    Transport,
    backoff_delay,
    no_worker_answer,
    refused,
    teacher_defaults,
)

log = logging.getLogger(__name__)

SGLANG_HINT = (
    "start SGLang first, e.g. `python -m sglang.launch_server --model-path <model> --port 30000 "
    "--tool-call-parser <parser> --enable-cache-report`, or set `teacher.sim` / run `sftree teacher-sim` for a "
    "stand-in"
)


class ContextOverflow(Exception):
    """The server refused the request as longer than the model's context (HTTP 400): ends the turn, no retry."""


class BadReply(Exception):
    """The server answered 200 with a reply that is not a readable chat completion: one failed step."""

    def __init__(self, reason: str, raw: str = ""):
        super().__init__(reason)
        self.raw = raw  # the reply body, ASCII-escaped and capped (safe to record)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    estimated: bool = False  # counted from the text: the server reported no usage


# A rough, tokenizer-free rate (also teacher-sim's); only used when the server reports none.
CHARS_PER_TOKEN = 4


def estimate_usage(request: bytes | str, message: Mapping[str, object]) -> Usage:
    """Token counts from the text of a request and its reply, for a server whose reply has no `usage`."""
    chars = len(request.decode("utf-8", "replace") if isinstance(request, bytes) else request)
    reply = len(json.dumps(message, ensure_ascii=False, sort_keys=True, separators=(",", ":")))
    return Usage(chars // CHARS_PER_TOKEN, max(1, reply // CHARS_PER_TOKEN), 0, estimated=True)


def reported_usage(payload: ForeignJSON) -> Usage | None:
    """The server's own usage of a reply, or None when it reports none (no `usage` or no token counts)."""
    u = payload.get("usage")
    if not isinstance(u, dict) or u.get("prompt_tokens") is None:
        return None
    details = u.get("prompt_tokens_details") or {}
    return Usage(
        int(u.get("prompt_tokens") or 0),
        int(u.get("completion_tokens") or 0),
        int(details.get("cached_tokens") or 0),
    )


@dataclass
class Completion:
    message: WireObject  # the assistant message (role, content, tool_calls, reasoning_content if any)
    finish_reason: str | None
    usage: Usage
    latency_s: float
    attempts: int = 1
    raw: WireObject = field(default_factory=dict, repr=False)
    notes: list[str] = field(default_factory=list)  # what normalisation did (teacher/response.py)
    truncated_calls: bool = False  # finish_reason length cut a tool call
    # the sampled tokens (`teacher.logprobs`) where the server gave them, else why none are kept
    logprobs: TokenLogprobs | None = None
    logprobs_dropped: str | None = None


CONSTRAIN_MODES = ("none", "tool_call", "tool_call_required")


def serialize(body: Mapping[str, object]) -> bytes:
    """Deterministic request bytes (see module docstring)."""
    return json.dumps(body, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _server_root(base_url: str) -> str:
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# A request in flight when the router reports a worker down, with no chunk since, is taken to be on that worker
# once this long has passed without one (a live stream sends a chunk per token).
FLEET_GRACE = 5.0
MAX_INCIDENTS = 200  # kept in stats["incidents"] (tree.json `teacher`); the counters count them all
POLICY_KEYS = tuple(f.name for f in fields(Policy))


class Incident(TypedDict):
    """One failed attempt (tree.json `teacher.incidents`)."""

    at: str
    request: int
    label: str
    attempt: int
    kind: str
    waited_s: float
    detail: str


class WorkerEvent(TypedDict):
    """A worker's health change as the router reported it (tree.json `teacher.worker_events`)."""

    at: str
    worker: str
    healthy: bool
    healthy_workers: int
    workers: int


# The client's counters (TeacherStats' int fields), each continued by `absorb` on a resumed tree.
Counter = Literal["requests", "retries", "prompt_tokens", "completion_tokens", "cached_tokens", "stalls",
                  "cut_streams", "worker_down_aborts", "failed_attempts"]  # fmt: skip
COUNTERS: tuple[Counter, ...] = get_args(Counter)
# the counter each kind of incident adds to (the others count only as failed_attempts)
INCIDENT_COUNTER: dict[str, Counter] = {
    "stall": "stalls",
    "cut": "cut_streams",
    "worker_down": "worker_down_aborts",
}


class TeacherStats(TypedDict):
    """The client's counters and incidents (tree.json `teacher`, the report)."""

    requests: int
    retries: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stalls: int  # no chunk within first_chunk_timeout / stall_timeout
    cut_streams: int  # the stream or connection ended before the reply did
    worker_down_aborts: int  # abandoned because the router reported a worker down
    failed_attempts: int  # every attempt that was sent again (all kinds, HTTP errors included)
    incidents: list[Incident]  # the first MAX_INCIDENTS of them, each with its edge, kind and seconds lost
    worker_events: list[WorkerEvent]  # the router's worker health changes seen by the fleet watcher


class TeacherReport(TeacherStats):
    """tree.json `teacher`: the stats, and how the client reached the Teacher."""

    stream: bool
    router: bool


class TeacherClient:
    def __init__(self, t: TeacherSettings, *, api_key: str | None = None):
        """From config `teacher:` (sftree.settings; `from_config` for a section given as a dict). A None among
        the transport's policy keys (teacher/transport.py) takes the schema's default."""
        self.base_url = t.base_url.rstrip("/")
        self.root_url = _server_root(self.base_url)
        self.model = t.model
        self.api_key = api_key
        self.temperature = t.temperature
        self.max_tokens = t.max_tokens
        self.policy = Policy.from_config({
            "request_timeout": t.request_timeout, "retries": t.retries, "backoff_max": t.backoff_max,
            "backoff_base": t.backoff_base, "first_chunk_timeout": t.first_chunk_timeout,
            "stall_timeout": t.stall_timeout, "outage_timeout": t.outage_timeout, "connect_timeout": t.connect_timeout,
        })  # fmt: skip
        self.transport = Transport(self.policy)
        self.health_timeout = t.health_timeout
        self.extra_body = dict(t.extra_body or {})
        self.context_tokens = t.context_tokens
        self.tool_choice = t.tool_choice
        constrain = t.constrain or "none"
        if constrain not in CONSTRAIN_MODES:
            raise ValueError(
                f"teacher.constrain must be one of {', '.join(CONSTRAIN_MODES)}, not {constrain!r}"
            )
        self.constrain = constrain
        self.logprobs = int(t.logprobs or 0)
        self.seed = t.seed
        self.stream = bool(t.stream)
        self.params = RequestParams.from_settings(t)  # every field of a request but its messages and tools
        self.fleet_poll = float(t.fleet_poll or 0)
        self.fleet: RouterWatcher | None = None
        self._sem = threading.BoundedSemaphore(t.max_concurrency)
        self._warned_no_usage = False
        self._inflight: set[InFlight] = set()
        self._request_ids = 0
        self.stats_lock = threading.Lock()
        self.stats: TeacherStats = {
            "requests": 0, "retries": 0, "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0,
            "stalls": 0, "cut_streams": 0, "worker_down_aborts": 0, "failed_attempts": 0,
            "incidents": [], "worker_events": [],
        }  # fmt: skip

    @classmethod
    def from_config(cls, cfg: JSONMap) -> TeacherClient:
        """From a `teacher` section as a dict (a tool's, a test's); a key it lacks takes the schema's default
        (transport.teacher_defaults)."""
        merged = {**teacher_defaults(), **cfg}
        return cls.from_settings(TeacherSettings(**{f.name: merged[f.name] for f in fields(TeacherSettings)}))

    @classmethod
    def from_settings(cls, t: TeacherSettings) -> TeacherClient:
        """From config `teacher:` (sftree.settings), the API key from the environment variable it names."""
        return cls(t, api_key=os.environ.get(t.api_key_env) if t.api_key_env else None)

    def _headers(self, extra: Mapping[str, object] | None) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        if extra:
            h.update({k: str(v) for k, v in extra.items()})
            h.update(routing_headers(h))  # behind smg: the session's requests stay on one worker
        return h

    def _workers(self) -> dict[str, bool] | None:
        """The router's worker list ({url: healthy}), or None when the server is no router (no `/workers`)."""
        r = self.transport.get(f"{self.root_url}/workers", headers=self._headers(None))
        if r.status_code != 200:
            return None
        try:
            return read_workers(r.json())
        except ValueError:
            return None

    def wait_ready(self) -> None:
        """Block until /health and /v1/models answer (behind sglang-router: and one worker is healthy), or raise
        TeacherUnavailable naming the URL. Behind a router, starts the fleet watcher (`fleet_poll`)."""
        deadline = time.monotonic() + self.health_timeout
        last = "no answer"
        delay = 0.2
        while True:
            try:
                r = self.transport.get(f"{self.root_url}/health", headers=self._headers(None))
                if r.status_code == 200:
                    m = self.transport.get(f"{self.base_url}/models", headers=self._headers(None))
                    if m.status_code == 200:
                        names = [d.get("id") for d in m.json().get("data", [])]
                        workers = self._workers()
                        if workers is None or any(workers.values()):
                            self._ready(names, workers)
                            return
                        last = f"the router has no healthy worker yet ({len(workers)} known)"
                    else:
                        last = f"/v1/models answered HTTP {m.status_code}"
                else:
                    last = f"/health answered HTTP {r.status_code}"
            except (RequestFailed, ValueError) as exc:
                last = f"{type(exc).__name__}"
            if time.monotonic() >= deadline:
                raise TeacherUnavailable(
                    f"Teacher server at {self.root_url} not ready after {self.health_timeout:g}s ({last}); "
                    f"{SGLANG_HINT}"
                )
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 5.0)

    def _ready(self, names: list[object], workers: dict[str, bool] | None) -> None:
        if workers is None:
            log.info("teacher ready at %s (models: %s)", self.base_url, ", ".join(map(str, names)))
            return
        # sglang-router lists one model `unknown` when its workers do not name theirs (llama-server): the
        # requests' `model` is passed on to the worker as it is, so nothing here depends on it
        log.info(
            "teacher ready at %s: router (smg or sglang-router), %d of %d workers healthy (%s); models: %s",
            self.base_url, sum(workers.values()), len(workers),
            ", ".join(f"{u}{'' if ok else ' (unhealthy)'}" for u, ok in sorted(workers.items())),
            ", ".join(map(str, names)),
        )  # fmt: skip
        if self.fleet_poll > 0 and self.fleet is None:
            # the watcher's thread has its own Session (the transport's are per thread)
            self.fleet = RouterWatcher(self._workers, self.fleet_poll, self._worker_changed, workers).start()

    def close(self) -> None:
        """Stop the fleet watcher (if any)."""
        if self.fleet is not None:
            self.fleet.stop()
            self.fleet = None

    def _worker_changed(self, url: str, healthy: bool, view: dict[str, bool]) -> None:
        """The router reported `url` healthy or not. Down: the requests sent before it that have had no chunk
        since are abandoned after FLEET_GRACE s (then sent again; the router now places them elsewhere)."""
        at = time.monotonic()
        n_ok = sum(view.values())
        with self.stats_lock:
            if len(self.stats["worker_events"]) < MAX_INCIDENTS:
                self.stats["worker_events"].append(
                {"at": _now_iso(), "worker": url, "healthy": healthy, "healthy_workers": n_ok,
                 "workers": len(view)}
            )  # fmt: skip
        if healthy:
            log.warning("teacher fleet: worker %s is healthy at the router (%d of %d)", url, n_ok, len(view))
            return
        log.warning(
            "teacher fleet: worker %s is down at the router (%d of %d healthy); requests with no reply since "
            "are sent again in %gs",
            url, n_ok, len(view), FLEET_GRACE,
        )  # fmt: skip

        def sweep() -> None:
            why = f"worker {url} went down at the router"
            with self.stats_lock:  # marked while still in flight: a request that just ended is left alone
                stuck = [f for f in self._inflight if f.started <= at and f.last <= at and f.aborted is None]
                for f in stuck:
                    f.aborted = why
            for f in stuck:
                f.abort(why)
            if stuck:
                log.warning(
                    "teacher fleet: %d request(s) with no reply since %s went down sent again: %s",
                    len(stuck), url, ", ".join(sorted(f.label for f in stuck)),
                )  # fmt: skip

        t = threading.Timer(FLEET_GRACE, sweep)
        t.daemon = True
        t.start()

    def request_body(
        self, messages: ChatMessages, tools: Tools | None, headers: Mapping[str, object] | None = None
    ) -> WireObject:
        """The whole request: the messages and tools, every other field the host's (teacher/params.py, the one
        place both backends take them from)."""
        return self.params.body(list(messages), list(tools) if tools else None, headers)

    def chat(
        self,
        messages: ChatMessages,
        tools: Tools | None = None,
        *,
        headers: Mapping[str, object] | None = None,
    ) -> Completion:
        """One chat completion, sent again as the transport's policy says; raises TeacherError once it is given
        up, ContextOverflow or TeacherError for a status that is not retried, BadReply for an unreadable 200."""
        body = self.request_body(messages, tools, headers)
        data = serialize(body)
        hdrs = self._headers(headers)
        url = f"{self.base_url}/chat/completions"
        post = self._post_stream if body.get("stream") else self._post
        label = _label(headers)
        with self.stats_lock:
            self._request_ids += 1
            rid = self._request_ids

        def failed(attempt: int, exc: Transient, waited: float, again: bool) -> None:
            self._incident(rid, label, attempt, exc.kind, exc.detail, waited)
            if again:
                with self.stats_lock:
                    self.stats["retries"] += 1

        with self._sem:
            t0 = time.monotonic()
            attempt, (status, text, payload) = self.transport.run(
                lambda n: (n, post(url, data, hdrs, label)), url=url, label=label, log=log, on_failure=failed
            )
            self._check_logprobs_accepted(url, status, text)
            reply = self._read_answer(url, status, text, payload, tools)
            if attempt:
                log.warning(
                    "teacher request %s answered at attempt %d, %.1fs after it was first sent",
                    label, attempt + 1, time.monotonic() - t0,
                )  # fmt: skip
            return self._completion(reply[0], reply[1], time.monotonic() - t0, attempt + 1, body)

    def _check_logprobs_accepted(self, url: str, status: int, text: str) -> None:
        """A server that refuses `logprobs`/`top_logprobs` (a K over its bound, or no logprobs at all) answers 400
        or 422 naming them: the setting is what is wrong, said as such (the explore job fails, nothing is kept)."""
        if self.logprobs and status in (400, 422) and "logprob" in text.lower():
            # llama-server (b11434) gives no logprobs for a streamed request with tools
            hint = "teacher.stream: false, " if self.stream and "stream" in text.lower() else ""
            raise TeacherError(
                f"teacher.logprobs: {self.logprobs} refused by the Teacher at {url} (HTTP {status}: {text[:300]}); "
                f"set {hint}teacher.logprobs to a top-K the server accepts, or 0"
            )

    @staticmethod
    def _read_answer(
        url: str, status: int, text: str, payload: WireObject | None, tools: Tools | None
    ) -> tuple[WireObject, Reply]:
        """The answer of the attempt that was not retried: (payload, normalised reply), or the error it is."""
        if status != 200:
            if is_context_overflow(status, text):
                raise ContextOverflow(f"HTTP {status}: {text[:300]}")
            raise TeacherError(f"Teacher at {url} answered HTTP {status}: {text[:500]}")
        # a reply that is not a completion is the model's step failing, not the server: no retry
        if payload is None:
            try:
                payload = json.loads(text)
            except ValueError as exc:
                raise BadReply(f"reply is not JSON ({exc})", _safe(text)) from None
        names = {fn["name"] for fn in (t.get("function") for t in tools or []) if isinstance(fn, dict)}
        try:
            return payload, normalize(payload, names)
        except MalformedResponse as exc:
            raise BadReply(str(exc), _safe(payload)) from None

    def _incident(self, rid: int, label: str, attempt: int, kind: str, detail: str, waited: float) -> None:
        key = INCIDENT_COUNTER.get(kind)
        with self.stats_lock:
            self.stats["failed_attempts"] += 1
            if key:
                self.stats[key] += 1
            if len(self.stats["incidents"]) < MAX_INCIDENTS:
                self.stats["incidents"].append(
                    {"at": _now_iso(), "request": rid, "label": label, "attempt": attempt + 1, "kind": kind,
                     "waited_s": round(waited, 3), "detail": detail[:300]}
                )  # fmt: skip

    def _post(
        self, url: str, data: bytes, hdrs: dict[str, str], label: str
    ) -> tuple[int, str, WireObject | None]:
        """One plain attempt: (status, body text, None); Transient for a failure worth another."""
        t0 = time.monotonic()
        r = self.transport.send(url, data, hdrs, stream=False)
        self.transport.check_status(r, t0)
        return r.status_code, r.text, None

    def _post_stream(
        self, url: str, data: bytes, hdrs: dict[str, str], label: str
    ) -> tuple[int, str, WireObject | None]:
        """One streamed attempt: (status, body text, assembled completion or None). Raises Transient when the
        server stalls (no bytes within the limit), the stream ends early, or the fleet watcher abandons it."""
        t0 = time.monotonic()
        entry = InFlight(t0, t0, label)
        with self.stats_lock:  # seen by the fleet watcher while on the wire
            self._inflight.add(entry)
        r = None
        try:
            r = self.transport.send(url, data, hdrs, stream=True, entry=entry)
            self.transport.check_status(r, t0)
            if r.status_code != 200 or "text/event-stream" not in r.headers.get("Content-Type", ""):
                return r.status_code, r.text, None  # an error status, or a server that ignored `stream`
            asm = self._assemble(r, entry)
        finally:
            with self.stats_lock:
                self._inflight.discard(entry)
            if r is not None:
                r.close()
        return self._assembled(asm, entry)

    def _assemble(self, r: Response, entry: InFlight) -> StreamAssembler:
        """The reply's chunks folded as they come, within the transport's stall limits."""
        asm = StreamAssembler()
        for chunk in self.transport.chunks(r, entry):
            asm.feed(chunk)
            entry.chunks = asm.chunks
            if asm.done:
                break
        asm.close()
        return asm

    @staticmethod
    def _assembled(asm: StreamAssembler, entry: InFlight) -> tuple[int, str, WireObject | None]:
        """What a stream that ended came to: the completion, an error the server reported, or a failure worth
        another attempt (Transient: abandoned, an error chunk, no finish)."""
        waited = time.monotonic() - entry.started
        if entry.aborted and not asm.done:  # a reply that came in full before it was abandoned is kept
            raise Transient("worker_down", entry.aborted, waited)
        if asm.error is not None:
            text = json.dumps(asm.error, ensure_ascii=False)
            if is_context_overflow(400, text):
                return 400, text, None
            raise Transient("stream_error", f"the stream reported an error: {text[:200]}", waited)
        if not asm.done and asm.finish_reason is None:
            raise Transient("cut", f"stream ended after {asm.chunks} chunks without a finish", waited)
        if asm.chunks == 0:
            return 200, "", None  # nothing readable: BadReply (not JSON) below
        return 200, "", asm.completion(fill_ids=False)

    def _completion(
        self, payload: WireObject, reply: Reply, latency: float, attempts: int, body: WireObject
    ) -> Completion:
        if reported_usage(payload) is None:
            # counted on the request as it would be without `stream`: the same estimate either way
            plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
            usage = estimate_usage(serialize(plain), reply.message)
            with self.stats_lock:
                warn, self._warned_no_usage = not self._warned_no_usage, True
            if warn:
                log.warning(
                    "Teacher at %s reports no token usage; estimating it from the text (%d characters per token, "
                    "recorded as `estimated`). SGLang reports usage; check the server or proxy in between",
                    self.base_url,
                    CHARS_PER_TOKEN,
                )
        else:
            usage = Usage(reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens)
        with self.stats_lock:
            self.stats["requests"] += 1
            self.stats["prompt_tokens"] += usage.prompt_tokens
            self.stats["completion_tokens"] += usage.completion_tokens
            self.stats["cached_tokens"] += usage.cached_tokens
        choices = payload.get("choices")
        kept, note = read_logprobs(
            choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {},
            self.logprobs, max_tokens=self.max_tokens,
            completion_tokens=None if usage.estimated else usage.completion_tokens,
        )  # fmt: skip
        return Completion(
            reply.message, reply.finish_reason, usage, latency, attempts, payload, reply.notes,
            reply.truncated_calls, kept, note,
        )  # fmt: skip

    def absorb(self, previous: Mapping[str, object] | None) -> None:
        """Continue the counters and lists of an earlier run of the same tree (a resumed explore)."""
        if not isinstance(previous, dict):
            return
        with self.stats_lock:
            for k in COUNTERS:
                p = previous.get(k)
                if isinstance(p, int) and not isinstance(p, bool):
                    self.stats[k] += p
            incidents, events = previous.get("incidents"), previous.get("worker_events")
            if isinstance(incidents, list):  # as the earlier run wrote them (tree.json)
                self.stats["incidents"] = (incidents + self.stats["incidents"])[:MAX_INCIDENTS]
            if isinstance(events, list):
                self.stats["worker_events"] = (events + self.stats["worker_events"])[:MAX_INCIDENTS]

    def report(self) -> TeacherReport:
        """The counters and incidents so far (a copy): tree.json `teacher`."""
        with self.stats_lock:
            s = self.stats
            return {**s, "incidents": list(s["incidents"]), "worker_events": list(s["worker_events"]),
                    "stream": self.stream, "router": self.fleet is not None}  # fmt: skip


def _label(headers: Mapping[str, object] | None) -> str:
    """`e3 turn 1` from the X-Sftree-* headers (for log lines and incidents)."""
    h = headers or {}
    edge, turn = h.get("X-Sftree-Edge"), h.get("X-Sftree-Turn")
    if not edge:
        return "request"
    return f"{edge} turn {turn}" if turn else str(edge)


def _safe(raw: object, cap: int = 4000) -> str:
    """A reply body as ASCII-escaped text (lone surrogates and all), capped: always writable to a transcript."""
    text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=True)
    return text.encode("ascii", "backslashreplace").decode("ascii")[:cap]
