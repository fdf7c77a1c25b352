"""Client for the Teacher: an OpenAI-compatible `/v1/chat/completions` server with tool calling (SGLang).

- `wait_ready()` polls `/health` then `/v1/models` until `health_timeout`, and fails with a message naming the
  URL and how to start SGLang.
- `chat()` retries connection errors, timeouts, 429 and 5xx (SGLang answers 503 when its queue is full) with
  capped exponential backoff, under a semaphore of `max_concurrency` requests in flight.
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
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import zlib
from dataclasses import dataclass, field

import requests

from sftree.errors import TeacherUnavailable
from sftree.teacher.response import MalformedResponse, Reply, is_context_overflow, normalize

log = logging.getLogger(__name__)

SGLANG_HINT = (
    "start SGLang first, e.g. `python -m sglang.launch_server --model-path <model> --port 30000 "
    "--tool-call-parser <parser> --enable-cache-report`, or set `teacher.sim` / run `sftree teacher-sim` for a "
    "stand-in"
)


class TeacherError(TeacherUnavailable):
    """A request failed past the retry budget or with a non-retryable status."""


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

    def to_dict(self) -> dict:
        d = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
        }
        if self.estimated:
            d["estimated"] = True
        return d


# A rough, tokenizer-free rate (also teacher-sim's); only used when the server reports none.
CHARS_PER_TOKEN = 4


def estimate_usage(request: bytes | str, message: dict) -> Usage:
    """Token counts from the text of a request and its reply, for a server whose reply has no `usage`."""
    chars = len(request.decode("utf-8", "replace") if isinstance(request, bytes) else request)
    reply = len(json.dumps(message, ensure_ascii=False, sort_keys=True, separators=(",", ":")))
    return Usage(chars // CHARS_PER_TOKEN, max(1, reply // CHARS_PER_TOKEN), 0, estimated=True)


def reported_usage(payload: dict) -> Usage | None:
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
    message: dict  # the assistant message (role, content, tool_calls, reasoning_content if any)
    finish_reason: str | None
    usage: Usage
    latency_s: float
    attempts: int = 1
    raw: dict = field(default_factory=dict, repr=False)
    notes: list[str] = field(default_factory=list)  # what normalisation did (teacher/response.py)
    truncated_calls: bool = False  # finish_reason length cut a tool call


CONSTRAIN_MODES = ("none", "tool_call", "tool_call_required")


def required_only(params: dict) -> dict:
    """A tool's parameter schema cut to its required properties (`additionalProperties: false`): a small model
    given optional arguments fills them with invented values (docs/real_teacher.md, "tool_call_required")."""
    props = params.get("properties")
    if params.get("type") != "object" or not isinstance(props, dict):
        return params
    req = [r for r in params.get("required") or [] if r in props]
    return {
        **params,
        "properties": {k: props[k] for k in req},
        "required": req,
        "additionalProperties": False,
    }


def tool_call_schema(tools: list[dict], *, required_args_only: bool = False) -> dict:
    """A JSON schema whose instances are exactly one call of one of `tools`: {"name": <tool>, "arguments": <its
    parameters>}, or only its required ones with `required_args_only`. Built from the tool schemas alone
    (docs/real_teacher.md, "teacher.constrain")."""
    calls = []
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters") or {"type": "object"}
        if required_args_only:
            params = required_only(params)
        calls.append({
            "type": "object",
            "properties": {"name": {"const": fn["name"]}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })  # fmt: skip
    return {"anyOf": calls}


def tool_call_response_format(tools: list[dict], *, required_args_only: bool = False) -> dict:
    """`response_format` for `teacher.constrain: tool_call[_required]`: llama-server compiles it to a grammar that
    is active from the first token (not lazy like its tool-call grammar); the reply's content is then one JSON
    call, which `teacher.response.normalize` turns into a tool call (`text_tool_calls:json`)."""
    schema = tool_call_schema(tools, required_args_only=required_args_only)
    return {"type": "json_schema", "json_schema": {"name": "tool_call", "strict": True, "schema": schema}}


SEED_HEADERS = ("X-Sftree-Tree", "X-Sftree-Edge", "X-Sftree-Attempt", "X-Sftree-Turn")


def request_seed(base: int, headers: dict | None, n_messages: int) -> int:
    """The sampling seed of one request under `teacher.seed`: a pure function of the base seed, the tree, edge,
    attempt and turn (the request's `X-Sftree-*` headers) and the session's length. A tree rerun the same way
    samples the same replies (llama-server on the CPU is deterministic for a fixed seed, prompt and prefix-cache
    state, docs/real_teacher.md), while sibling edges, whose first requests are byte-identical, still draw
    different ones (one seed for all would make them copies)."""
    key = [str(base)] + [str((headers or {}).get(h, "")) for h in SEED_HEADERS] + [str(n_messages)]
    return zlib.crc32("\x1f".join(key).encode("utf-8")) & 0x7FFFFFFF


def serialize(body: dict) -> bytes:
    """Deterministic request bytes (see module docstring)."""
    return json.dumps(body, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Capped exponential backoff: base * 2**attempt, at most cap (no jitter: reruns stay reproducible)."""
    return min(cap, base * (2**attempt))


def _server_root(base_url: str) -> str:
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


class TeacherClient:
    def __init__(
        self,
        base_url: str,
        model: str = "default",
        *,
        api_key: str | None = None,
        temperature: float = 0.7,
        max_tokens: int = 4096,
        request_timeout: float = 900,
        retries: int = 8,
        backoff_max: float = 60,
        backoff_base: float = 0.5,
        health_timeout: float = 600,
        max_concurrency: int = 64,
        extra_body: dict | None = None,
        context_tokens: int | None = None,
        tool_choice: str = "auto",
        constrain: str = "none",
        seed: int | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.root_url = _server_root(self.base_url)
        self.model = model
        self.api_key = api_key
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.request_timeout = request_timeout
        self.retries = retries
        self.backoff_max = backoff_max
        self.backoff_base = backoff_base
        self.health_timeout = health_timeout
        self.extra_body = dict(extra_body or {})
        self.context_tokens = context_tokens
        self.tool_choice = tool_choice
        if constrain not in CONSTRAIN_MODES:
            raise ValueError(
                f"teacher.constrain must be one of {', '.join(CONSTRAIN_MODES)}, not {constrain!r}"
            )
        self.constrain = constrain
        self.seed = seed
        self._sem = threading.BoundedSemaphore(max_concurrency)
        self._warned_no_usage = False
        self._local = threading.local()
        self.stats_lock = threading.Lock()
        self.stats = {
            "requests": 0,
            "retries": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "cached_tokens": 0,
        }

    @classmethod
    def from_config(cls, cfg: dict) -> TeacherClient:
        key_env = cfg.get("api_key_env", "SFTREE_TEACHER_API_KEY")
        return cls(
            cfg.get("base_url", "http://127.0.0.1:30000/v1"),
            cfg.get("model", "default"),
            api_key=os.environ.get(key_env) if key_env else None,
            temperature=cfg.get("temperature", 0.7),
            max_tokens=cfg.get("max_tokens", 4096),
            request_timeout=cfg.get("request_timeout", 900),
            retries=cfg.get("retries", 8),
            backoff_max=cfg.get("backoff_max", 60),
            backoff_base=cfg.get("backoff_base", 0.5),
            health_timeout=cfg.get("health_timeout", 600),
            max_concurrency=cfg.get("max_concurrency", 64),
            extra_body=cfg.get("extra_body"),
            context_tokens=cfg.get("context_tokens", 131072),
            tool_choice=cfg.get("tool_choice", "auto"),
            constrain=cfg.get("constrain") or "none",
            seed=cfg.get("seed"),
        )

    # one Session per thread: requests.Session is not thread-safe, and keep-alive saves a handshake per step
    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def _headers(self, extra: dict | None) -> dict:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        if extra:
            h.update({k: str(v) for k, v in extra.items()})
        return h

    def wait_ready(self) -> None:
        """Block until /health and /v1/models answer, or raise TeacherUnavailable naming the URL."""
        deadline = time.monotonic() + self.health_timeout
        last = "no answer"
        delay = 0.2
        while True:
            try:
                r = self._session().get(f"{self.root_url}/health", timeout=10, headers=self._headers(None))
                if r.status_code == 200:
                    m = self._session().get(
                        f"{self.base_url}/models", timeout=10, headers=self._headers(None)
                    )
                    if m.status_code == 200:
                        names = [d.get("id") for d in m.json().get("data", [])]
                        log.info(
                            "teacher ready at %s (models: %s)", self.base_url, ", ".join(map(str, names))
                        )
                        return
                    last = f"/v1/models answered HTTP {m.status_code}"
                else:
                    last = f"/health answered HTTP {r.status_code}"
            except (requests.RequestException, ValueError) as exc:
                last = f"{type(exc).__name__}"
            if time.monotonic() >= deadline:
                raise TeacherUnavailable(
                    f"Teacher server at {self.root_url} not ready after {self.health_timeout:g}s ({last}); "
                    f"{SGLANG_HINT}"
                )
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 5.0)

    def request_body(
        self, messages: list[dict], tools: list[dict] | None, headers: dict | None = None
    ) -> dict:
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if tools:
            body["tools"] = tools
            if (
                self.tool_choice != "auto"
            ):  # `auto` is the servers' default: left out, bodies stay as they were
                body["tool_choice"] = self.tool_choice
            if self.constrain != "none":
                body["response_format"] = tool_call_response_format(
                    tools, required_args_only=self.constrain == "tool_call_required"
                )
        if self.seed is not None:
            body["seed"] = request_seed(self.seed, headers, len(messages))
        body.update(self.extra_body)
        return body

    def chat(
        self, messages: list[dict], tools: list[dict] | None = None, *, headers: dict | None = None
    ) -> Completion:
        """One chat completion; raises TeacherError once the retry budget is spent."""
        body = self.request_body(messages, tools, headers)
        data = serialize(body)
        hdrs = self._headers(headers)
        url = f"{self.base_url}/chat/completions"
        last = ""
        with self._sem:
            t0 = time.monotonic()
            for attempt in range(self.retries + 1):
                if attempt:
                    with self.stats_lock:
                        self.stats["retries"] += 1
                    time.sleep(backoff_delay(attempt - 1, self.backoff_base, self.backoff_max))
                try:
                    r = self._session().post(url, data=data, headers=hdrs, timeout=self.request_timeout)
                except requests.RequestException as exc:
                    last = f"{type(exc).__name__}: {exc}"
                    log.warning(
                        "teacher request failed (%s), attempt %d/%d",
                        last[:200],
                        attempt + 1,
                        self.retries + 1,
                    )
                    continue
                if r.status_code == 429 or r.status_code >= 500:
                    last = f"HTTP {r.status_code}: {r.text[:200]}"
                    log.warning("teacher answered %s, attempt %d/%d", last, attempt + 1, self.retries + 1)
                    continue
                if r.status_code != 200:
                    if is_context_overflow(r.status_code, r.text):
                        raise ContextOverflow(f"HTTP {r.status_code}: {r.text[:300]}")
                    raise TeacherError(f"Teacher at {url} answered HTTP {r.status_code}: {r.text[:500]}")
                # a reply that is not a completion is the model's step failing, not the server: no retry
                try:
                    payload = r.json()
                except ValueError as exc:
                    raise BadReply(f"reply is not JSON ({exc})", _safe(r.text)) from None
                names = {t["function"]["name"] for t in tools or [] if isinstance(t.get("function"), dict)}
                try:
                    reply = normalize(payload, names)
                except MalformedResponse as exc:
                    raise BadReply(str(exc), _safe(payload)) from None
                return self._completion(payload, reply, time.monotonic() - t0, attempt + 1, data)
        raise TeacherError(f"Teacher at {url} failed {self.retries + 1} times; last error: {last}")

    def _completion(
        self, payload: dict, reply: Reply, latency: float, attempts: int, request: bytes
    ) -> Completion:
        if reported_usage(payload) is None:
            usage = estimate_usage(request, reply.message)
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
        return Completion(
            reply.message, reply.finish_reason, usage, latency, attempts, payload, reply.notes,
            reply.truncated_calls,
        )  # fmt: skip


def _safe(raw, cap: int = 4000) -> str:
    """A reply body as ASCII-escaped text (lone surrogates and all), capped: always writable to a transcript."""
    text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=True)
    return text.encode("ascii", "backslashreplace").decode("ascii")[:cap]
