"""The one way to the Teacher over HTTP: the native client (`teacher/client.py`) and the OpenCode backend's
recording proxy (`agents/proxy.py`) both send through a `Transport`, so a server fault is met the same way on
either backend (docs/failures.md, "The Teacher transport").

The policy (`Policy`, from the validated `teacher.*` config; its defaults are the schema's):
- transient: HTTP 429 and every 5xx; a connection that fails or breaks; a timeout; a streamed reply that stalls
  (no first chunk within `first_chunk_timeout`, no next one within `stall_timeout`, not complete within
  `request_timeout`) or ends before its end. Anything else (a 4xx, a 200) is the caller's to read.
- a transient failure is sent again after `backoff_base * 2**k` s, at most `backoff_max` (no jitter: reruns
  stay reproducible), `retries` times; an answer that no worker is there (connection refused, sglang-router's
  503 `no_available_workers`) is waited out for `outage_timeout` s instead of being counted.
- every request: `connect_timeout` to connect; a plain reply within `request_timeout`, a streamed one's headers
  within `first_chunk_timeout`.

One `requests.Session` per thread (a Session is not thread-safe; keep-alive saves a handshake per step), its
connections handing their socket to the streamed request in flight (`teacher/http.py`), so the client's fleet
watcher can abandon a request on a dead worker. This module is the only one in src/ that imports `requests`
(besides `teacher/http.py`, its connection classes; scripts/check_design.py, rule one-http-client): the fleet's and the
launcher's health probes go through `probe`.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import TypeVar

import requests
import urllib3

from sftree.errors import TeacherUnavailable
from sftree.jsontypes import WireObject
from sftree.teacher.http import InFlight, TrackingAdapter, socket_of, tracking

T = TypeVar("T")
RequestFailed = (
    requests.RequestException
)  # what a probe or a single request raises (callers need not import it)
Response = requests.Response  # what a probe or a single request gives


class TeacherError(TeacherUnavailable):
    """A request failed past the retry budget or with a non-retryable status."""

    def __init__(self, message: str, last: Transient | None = None):
        super().__init__(message)
        self.last = last  # the last failed attempt (its `response` when the server answered one)


@functools.cache
def teacher_defaults() -> WireObject:
    """The `teacher.*` defaults of workflow/schemas/config.schema.yaml: a config read without validation (a test,
    `TeacherClient.from_config({})`) gets the values a validated one would."""
    from sftree.config import load_schema

    props = load_schema()["properties"]["teacher"]["properties"]
    return {k: v["default"] for k, v in props.items() if "default" in v}


@dataclass(frozen=True)
class Policy:
    """How a request to the Teacher is sent and sent again (the module docstring); `teacher.*` keys."""

    retries: int
    backoff_base: float
    backoff_max: float
    outage_timeout: float
    connect_timeout: float
    request_timeout: float
    first_chunk_timeout: float
    stall_timeout: float

    @classmethod
    def from_config(cls, cfg: Mapping[str, object]) -> Policy:
        """From the `teacher` section (None values and missing keys: the schema's defaults)."""
        given = {k: v for k, v in cfg.items() if v is not None}
        values = {**teacher_defaults(), **given}
        return cls(**{f.name: float(values[f.name]) for f in fields(cls) if f.name != "retries"},
                   retries=int(values["retries"]))  # fmt: skip

    @property
    def first_limit(self) -> float:
        """Seconds to a streamed reply's first chunk (never past the whole reply's)."""
        return min(self.first_chunk_timeout, self.request_timeout)


def transient_status(status: int) -> bool:
    """An HTTP status worth sending the request again for: 429 (busy) and every 5xx (SGLang's 503 when its queue
    is full, the router's 500 when a worker died under it)."""
    return status == 429 or 500 <= status <= 599


# sglang-router's error codes (HTTP 503) for a request it has no worker to send to: every worker unhealthy or
# its circuit breaker open (`no_available_workers`), or none healthy (the others; prefill-decode pairs)
NO_WORKER_CODES = ("no_available_workers", "no_healthy_workers", "no_available_pd_worker_pairs",
                   "no_healthy_worker_pair")  # fmt: skip


def no_worker_answer(status: int, text: str) -> bool:
    """The server answered that no worker can take the request now (sglang-router's 503 no_available_workers):
    the fleet is out of workers for a while, not failing."""
    return status == 503 and any(code in (text or "") for code in NO_WORKER_CODES)


def _causes(exc: BaseException | None) -> Iterator[BaseException]:
    """An exception and everything it wraps (cause, context, urllib3's `reason`, exceptions in its args)."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None)]
        todo += [a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]


def refused(exc: BaseException) -> bool:
    """A request error that is a connection never made: refused (nothing listening at the URL: the server or
    router is restarting) or not made in time. Not a connection that broke once made (that is a failed attempt)."""
    never = (ConnectionRefusedError, urllib3.exceptions.NewConnectionError, requests.ConnectTimeout,
             urllib3.exceptions.ConnectTimeoutError)  # fmt: skip
    return any(isinstance(e, never) for e in _causes(exc))


def is_timeout(exc: BaseException) -> bool:
    """A read that timed out, however urllib3/requests wrapped the socket's timeout."""
    return any(
        isinstance(e, TimeoutError | socket.timeout | requests.Timeout) or "Timeout" in type(e).__name__
        for e in _causes(exc)
    )


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Capped exponential backoff: base * 2**attempt, at most cap (no jitter: reruns stay reproducible)."""
    return min(cap, base * float(2**attempt))  # (int ** int is typed Any: it may be a float)


class Transient(Exception):
    """One attempt failed in a way worth another: `kind` is connection | http | stall | cut | worker_down |
    stream_error; `waited` the seconds it took; `unavailable` when no worker was there to answer (an outage,
    timed by `outage_timeout` instead of counted against `retries`); `response` the server's answer (kind http,
    read for its text)."""

    def __init__(self, kind: str, detail: str, waited: float = 0.0, *, unavailable: bool = False,
                 response: requests.Response | None = None):  # fmt: skip
        super().__init__(detail)
        self.kind, self.detail, self.waited, self.unavailable = kind, detail, waited, unavailable
        self.response = response

    @property
    def backoff(self) -> bool:
        """False: sent again at once (after a worker went down the router already places it elsewhere)."""
        return self.kind != "worker_down"

    @property
    def last(self) -> str:
        """As error messages name it: `HTTP 503: ...`, `stall: no chunk for 60s after 12 chunks`."""
        return self.detail if self.kind == "http" else f"{self.kind}: {self.detail}"


@dataclass
class RetryBudget:
    """What one request has spent: failed attempts against `retries`, and the current outage (answers that no
    worker is there), which is timed by `outage_timeout` instead (`outage_timeout` 0: counted against `retries`)."""

    retries: int
    outage_timeout: float
    base: float
    backoff_max: float
    failures: int = 0
    outage: float | None = None  # when the current spell of "no worker to answer" began (monotonic)
    spell: int = 0  # attempts in that spell

    @classmethod
    def of(cls, p: Policy) -> RetryBudget:
        return cls(p.retries, p.outage_timeout, p.backoff_base, p.backoff_max)

    def spend(self, unavailable: bool, t_try: float) -> tuple[str, float, float]:
        """Account one failed attempt begun at `t_try`: (verdict, seconds to wait, seconds of outage so far).
        verdict: `waiting` (no worker yet; not counted), `outage_over` (no worker for `outage_timeout` s: give
        up), `retry`, or `exhausted` (`retries` + 1 failed attempts: give up)."""
        if unavailable and self.outage_timeout > 0:
            if self.outage is None:
                self.outage = t_try
            waited = time.monotonic() - self.outage
            if waited >= self.outage_timeout:
                return "outage_over", 0.0, waited
            self.spell += 1
            delay = min(
                backoff_delay(self.spell - 1, self.base, self.backoff_max), self.outage_timeout - waited
            )
            return "waiting", delay, waited
        self.outage, self.spell = None, 0  # a worker answered, if with a failure: the outage is over
        self.failures += 1
        if self.failures > self.retries:
            return "exhausted", 0.0, 0.0
        return "retry", backoff_delay(self.failures - 1, self.base, self.backoff_max), 0.0


# on_failure(attempt index, the failure, seconds it took, whether it is sent again)
FailureHook = Callable[[int, Transient, float, bool], None]


def probe(url: str, timeout: float, headers: Mapping[str, str] | None = None) -> requests.Response | None:
    """One GET, not retried (a health check: the caller polls); None when no answer came."""
    try:
        return requests.get(url, timeout=timeout, headers=headers)
    except requests.RequestException:
        return None


class Transport:
    """Sends requests to the Teacher under one `Policy` (the module docstring)."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self._local = threading.local()

    def session(self) -> requests.Session:
        """This thread's Session."""
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = new_session()
        return s

    def get(
        self, url: str, headers: Mapping[str, str] | None = None, timeout: float = 10
    ) -> requests.Response:
        """One GET on this thread's Session (raises RequestFailed): `/health`, `/v1/models`, `/workers`."""
        return self.session().get(url, timeout=timeout, headers=headers)

    def send(
        self,
        url: str,
        data: bytes,
        headers: Mapping[str, str],
        *,
        stream: bool,
        entry: InFlight | None = None,
    ) -> requests.Response:
        """One POST attempt: the response (its status unread), or Transient for a connection that failed or an
        answer that did not come in time. Streamed: returns at the headers, which must come within
        `first_chunk_timeout`; `entry` (the request on the wire) is handed the socket (`teacher/http.py`)."""
        p, t0 = self.policy, time.monotonic()
        read = p.first_limit if stream else p.request_timeout
        tracking.entry = entry
        try:
            return self.session().post(
                url, data=data, headers=headers, timeout=(p.connect_timeout, read), stream=stream
            )
        except requests.RequestException as exc:
            waited = time.monotonic() - t0
            if entry is not None and entry.aborted:
                raise Transient("worker_down", entry.aborted, waited) from None
            unavailable = refused(exc)
            if isinstance(exc, requests.Timeout) and not unavailable:
                detail = f"no reply within {read:g}s" if stream else f"{type(exc).__name__}: {exc}"
                raise Transient("stall", detail, waited) from None
            raise Transient(
                "connection", f"{type(exc).__name__}: {exc}", waited, unavailable=unavailable
            ) from None
        finally:
            tracking.entry = None

    @staticmethod
    def check_status(r: requests.Response, t0: float) -> None:
        """Raise Transient for a transient status (the response goes with it, closed once read)."""
        if transient_status(r.status_code):
            text = r.text
            r.close()
            raise Transient("http", f"HTTP {r.status_code}: {text[:200]}", time.monotonic() - t0,
                            unavailable=no_worker_answer(r.status_code, text), response=r)  # fmt: skip

    def chunks(self, r: requests.Response, entry: InFlight) -> Iterator[bytes]:
        """The raw bytes of a streamed reply as they come, each read within its limit: the first chunk within
        `first_chunk_timeout` of `entry.started`, the next within `stall_timeout` (once `entry.chunks` counts
        one), the whole within `request_timeout`. A stall, a broken stream or an abandoned one raises Transient;
        the iterator ends with the stream."""
        p, t0 = self.policy, entry.started
        total = t0 + p.request_timeout
        entry.sock = entry.sock or socket_of(r)
        if entry.aborted:  # abandoned while the headers came
            entry.abort(entry.aborted)
        while True:
            try:
                chunk = self._read(r, entry, t0, total)
            except Exception as exc:  # noqa: BLE001 - the socket's timeout, a reset, a shut-down socket
                raise self._broken(exc, entry, total) from None
            if not chunk:
                return
            entry.last = time.monotonic()
            yield chunk

    def _read(self, r: requests.Response, entry: InFlight, t0: float, total: float) -> bytes:
        now = time.monotonic()
        limit = self.policy.stall_timeout if entry.chunks else max(0.0, t0 + self.policy.first_limit - now)
        limit = min(limit, max(0.0, total - now))
        if limit <= 0:
            raise TimeoutError
        if entry.sock is not None:
            entry.sock.settimeout(limit)
        data: bytes = r.raw.read1(65536, decode_content=True)  # (requests types `raw` as Any)
        return data

    def _broken(self, exc: BaseException, entry: InFlight, total: float) -> Transient:
        """What a failed read of a stream was: abandoned, a stall (which limit), or a cut."""
        waited = time.monotonic() - entry.started
        if entry.aborted:
            return Transient("worker_down", entry.aborted, waited)
        if is_timeout(exc):
            p = self.policy
            if time.monotonic() >= total - 0.01:
                why = f"reply not complete within request_timeout {p.request_timeout:g}s"
            elif entry.chunks:
                why = f"no chunk for {p.stall_timeout:g}s after {entry.chunks} chunks"
            else:
                why = f"no chunk within {p.first_limit:g}s"
            return Transient("stall", why, waited)
        return Transient("cut", f"stream broke after {entry.chunks} chunks ({type(exc).__name__})", waited)

    def run(self, attempt: Callable[[int], T], *, url: str, label: str, log: logging.Logger,
            on_failure: FailureHook | None = None) -> T:  # fmt: skip
        """`attempt(n)` (n = 0, 1, ...) until it returns, sent again after each Transient it raises as the policy
        says; TeacherError (with the last failure) once the request is given up."""
        budget = RetryBudget.of(self.policy)
        n = 0
        while True:
            t_try = time.monotonic()
            try:
                return attempt(n)
            except Transient as exc:
                verdict, delay, waited = budget.spend(exc.unavailable, t_try)
                if on_failure is not None:
                    on_failure(n, exc, time.monotonic() - t_try, verdict in ("retry", "waiting"))
                delay = self._verdict(verdict, delay, waited, exc, budget, url, label, log)
            n += 1
            if delay > 0:
                time.sleep(delay)

    def _verdict(self, verdict: str, delay: float, waited: float, exc: Transient, budget: RetryBudget, url: str,
                 label: str, log: logging.Logger) -> float:  # fmt: skip
        """Log one failed attempt; the seconds to wait before the next, or TeacherError when it is given up."""
        p, last = self.policy, exc.last
        if verdict == "outage_over":
            raise TeacherError(
                f"Teacher at {url} had no worker to answer for {waited:.0f}s (teacher.outage_timeout "
                f"{p.outage_timeout:g}s); last error: {last}",
                exc,
            )
        if verdict == "waiting":
            log.warning("teacher request %s: waiting for a Teacher worker: %.0f s of %g (%s)", label, waited,
                        p.outage_timeout, last[:200])  # fmt: skip
            return delay
        line = f"teacher answered {last}" if exc.kind == "http" else f"teacher request {label}: {last[:300]}"
        log.warning("%s, attempt %d/%d", line, budget.failures, p.retries + 1)
        if verdict == "exhausted":
            raise TeacherError(f"Teacher at {url} failed {p.retries + 1} times; last error: {last}", exc)
        return delay if exc.backoff else 0.0


def new_session() -> requests.Session:
    """A Session whose connections hand their socket to the streamed request being sent (`teacher/http.py`)."""
    s = requests.Session()
    for prefix in ("http://", "https://"):
        s.mount(prefix, TrackingAdapter())
    return s
