"""Step records on disk with each message stored once (docs/architecture.md, "Step records").

A step record holds the exact request of one model call, and a session's request repeats every earlier message:
written as is, an edge's transcript grows with (steps x context). On disk the records therefore keep their shape
but not their bulk:

- `edges/<edge>/messages.jsonl`: every distinct JSON value (a message, a response, the tools list) once,
  `{"id": <sha256 prefix of its JSON text>, "value": ...}`;
- `edges/<edge>/steps.jsonl`: one line per model call, marked `"enc": 1`, whose `request.messages` is
  `{"base": <index of an earlier line or null>, "keep": n, "add": [ids]}` (the first n messages of that line's
  request, then these), `request.tools` and `response` are `{"$ref": id}`.

A backend builds each record as a `StepRecord` (below: the keys in the order they are written) and hands it to its
`StepRecorder`. `read_steps` rebuilds the records exactly (same values, same key order), so export is unchanged; a line
without `enc` (older transcripts, hand-written fixtures) is returned as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Literal, NotRequired, Protocol, TypedDict

from sftree.errors import InputError
from sftree.fileio import disk_full_named, iter_jsonl
from sftree.jsontypes import JSONObject, JSONValue

ENCODING = 1
STEPS_NAME, STORE_NAME = "steps.jsonl", "messages.jsonl"
# Earlier lines tried as the base of a request (an interleaved title or compaction call shares little).
_LOOKBACK = 8


# What a step record's model call was (agents/proxy.py `classify`; the native agent's are agent or nudge).
StepKind = Literal["agent", "nudge", "title", "compaction", "summary"]


class ChatRequest(TypedDict):
    """A step record's request: exactly what was sent (foreign for OpenCode's, so its parts stay JSON)."""

    model: JSONValue
    messages: JSONValue  # a list of messages (a request from the sandbox may send anything)
    tools: JSONValue
    # Every other field sent (sampling, stream, extra_body: teacher/params.py), `model` aside; absent in records
    # written before it was kept, and in a request that never went on (refused, tampered, the probe)
    params: NotRequired[JSONObject]


class ToolResult(TypedDict):
    """One tool call's result in a step record (`tool_results`)."""

    tool_call_id: JSONValue
    name: JSONValue
    content: str
    error: bool
    knowledge: bool


class UsageRecord(TypedDict):
    """A step record's `usage`, as the server reported it (or `estimated` from the text)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    estimated: NotRequired[bool]


class TokenCounts(Protocol):
    """A reply's token counts (sftree.teacher.client.Usage)."""

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def estimated(self) -> bool: ...


def usage_from(usage: TokenCounts) -> UsageRecord:
    """A step record's usage from the client's counts: `estimated` only when it was."""
    out: UsageRecord = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
    }
    if usage.estimated:
        out["estimated"] = True
    return out


class TokenLogprobs(TypedDict):
    """A reply's sampled tokens with their log-probabilities and the top-K (`teacher.logprobs: K`), one entry per
    sampled token in every list (teacher/logprobs.py reads them from the server's reply). `ids`/`top_ids` when the
    server gave token ids, else `tokens`/`top_tokens` (the token text): never both, never invented."""

    k: int  # the top-K asked for
    ids: NotRequired[list[int]]
    tokens: NotRequired[list[str]]
    logprobs: list[float]
    top_ids: NotRequired[list[list[int]]]
    top_tokens: NotRequired[list[list[str]]]
    top_logprobs: list[list[float]]


class StepRecord(TypedDict):
    """One model call (docs/architecture.md, "Step records"); keys in the order they are written."""

    edge: NotRequired[str]  # stamped by the StepRecorder
    turn: int
    step: NotRequired[int]  # the OpenCode backend numbers the proxy's records per turn
    kind: StepKind
    request: ChatRequest
    response: JSONObject | None
    tool_results: list[ToolResult]
    usage: UsageRecord | None
    latency_s: float
    finish_reason: str | None
    session_id: NotRequired[JSONValue]  # OpenCode's x-session-id header (the proxy's records)
    notes: NotRequired[list[str]]
    logprobs: NotRequired[TokenLogprobs]  # the sampled tokens, where asked for and the server gave them
    logprobs_dropped: NotRequired[str]  # asked for, none kept: why (absent, misaligned:..., malformed:...)
    compacted: NotRequired[bool]
    error: NotRequired[str]
    raw_response: NotRequired[str]
    tampered: NotRequired[dict[str, str]]
    # Fields OpenCode sent with a value other than the host's, which went on instead: {field: {expected, got}}
    params_diff: NotRequired[dict[str, dict[str, str]]]


def edge_steps(edge_id: str) -> str:
    """An edge's step records, relative to its tree folder (tree.json edge `transcript`)."""
    return f"edges/{edge_id}/{STEPS_NAME}"


def value_id(value: Any) -> str:
    """Content address of a JSON value: equal text (key order included), equal id."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


class StepWriter:
    """Appends encoded step records; thread-safe. Messages are written (and flushed) before the line using them."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A redone edge starts its transcript afresh.
        self._steps = open(self.path, "w", encoding="utf-8")
        self._store = open(self.path.parent / STORE_NAME, "w", encoding="utf-8")
        self._seen: set[str] = set()
        self._lines: list[list[str] | None] = []  # message ids of each written line's request
        self._lock = threading.Lock()

    def _ref(self, value: Any) -> str:
        vid = value_id(value)
        if vid not in self._seen:
            self._seen.add(vid)
            self._store.write(json.dumps({"id": vid, "value": value}, ensure_ascii=False) + "\n")
        return vid

    def _encode(self, record: dict[str, Any]) -> tuple[dict[str, Any], list[str] | None]:
        out = dict(record)
        ids = None
        req = record.get("request")
        if isinstance(req, dict):
            req = dict(req)
            if isinstance(req.get("messages"), list):
                ids = [self._ref(m) for m in req["messages"]]
                base, keep = None, 0
                for i in range(len(self._lines) - 1, max(-1, len(self._lines) - 1 - _LOOKBACK), -1):
                    prev = self._lines[i]
                    n = len(os.path.commonprefix([prev, ids])) if prev is not None else 0
                    if n > keep:
                        base, keep = i, n
                req["messages"] = {"base": base, "keep": keep, "add": ids[keep:]}
            if "tools" in req:
                req["tools"] = {"$ref": self._ref(req["tools"])}
            out["request"] = req
        if record.get("response") is not None:
            out["response"] = {"$ref": self._ref(record["response"])}
        out["enc"] = ENCODING
        return out, ids

    def write(self, record: dict[str, Any]) -> None:
        # A full disk ends the edge with DiskFull naming the file; the edge stays unfinished and its rerun writes
        # the transcript afresh.
        with self._lock, disk_full_named(self.path):
            enc, ids = self._encode(record)
            self._store.flush()
            self._steps.write(json.dumps(enc, ensure_ascii=False) + "\n")
            self._steps.flush()
            self._lines.append(ids)

    def close(self) -> None:
        with self._lock:
            for fh in (self._store, self._steps):
                if not fh.closed:
                    fh.close()


class StepRecorder:
    """One edge's step records, as every agent backend writes them: `StepWriter` with the edge id stamped on each
    record and the model latency summed (for the edge's timing); thread-safe."""

    def __init__(self, path: Path, edge_id: str):
        self.path = Path(path)
        self.edge_id = edge_id
        self._writer = StepWriter(self.path)
        self._lock = threading.Lock()
        self.latency_s = 0.0
        self.records = 0

    def write(self, record: StepRecord) -> None:
        with self._lock:
            self._writer.write({"edge": self.edge_id, **record})
            self.latency_s += float(record.get("latency_s") or 0.0)
            self.records += 1

    def close(self) -> None:
        with self._lock:
            self._writer.close()


def _load_store(path: Path) -> dict[str, Any]:
    store: dict[str, Any] = {}
    if not path.exists():
        return store
    for n, rec in enumerate(iter_jsonl(path, "message store"), 1):
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), str) or "value" not in rec:
            raise InputError(f"message store {path} line {n}: expected {{id, value}}")
        store[rec["id"]] = rec["value"]
    return store


def read_steps(path: str | Path) -> list[dict[str, Any]]:
    """The step records of one edge with their requests rebuilt; InputError names the file, record and field."""
    path = Path(path)
    store: dict[str, Any] | None = None
    lines: list[list[Any] | None] = []
    out = []
    for n, rec in enumerate(iter_jsonl(path, "step records"), 1):
        if not isinstance(rec, dict):
            raise InputError(f"step records {path} record {n}: not a JSON object")
        if rec.get("enc") is None:
            req = rec.get("request")
            lines.append(
                list(req["messages"])
                if isinstance(req, dict) and isinstance(req.get("messages"), list)
                else None
            )
            out.append(rec)
            continue
        if rec.get("enc") != ENCODING:
            raise InputError(f"step records {path} record {n}: unknown encoding {rec.get('enc')!r}")
        if store is None:
            store = _load_store(path.parent / STORE_NAME)
        rec, msgs = _decode(rec, store, lines, f"step records {path} record {n}")
        lines.append(msgs)
        out.append(rec)
    return out


def _deref(ref: Any, store: dict[str, Any], where: str) -> Any:
    if not isinstance(ref, dict) or not isinstance(ref.get("$ref"), str):
        raise InputError(f'{where}: expected {{"$ref": id}}')
    try:
        return store[ref["$ref"]]
    except KeyError:
        raise InputError(f"{where}: {ref['$ref']} is not in {STORE_NAME}") from None


def _decode(
    rec: dict[str, Any], store: dict[str, Any], lines: list[list[Any] | None], where: str
) -> tuple[dict[str, Any], list[Any] | None]:
    rec = dict(rec)
    del rec["enc"]
    msgs = None
    req = rec.get("request")
    if isinstance(req, dict):
        req = dict(req)
        m = req.get("messages")
        if isinstance(m, dict):
            base, keep, add = m.get("base"), m.get("keep"), m.get("add")
            if not isinstance(keep, int) or keep < 0 or not isinstance(add, list):
                raise InputError(f"{where}: request.messages needs integer `keep` and list `add`")
            prefix: list[Any] = []
            if keep:
                earlier = lines[base] if isinstance(base, int) and 0 <= base < len(lines) else None
                if earlier is None:
                    raise InputError(f"{where}: request.messages.base {base!r} is not an earlier record")
                prefix = earlier[:keep]
                if len(prefix) != keep:
                    raise InputError(
                        f"{where}: request.messages.keep {keep} exceeds record {base}'s messages"
                    )
            msgs = prefix + [_deref({"$ref": i}, store, f"{where} request.messages") for i in add]
            req["messages"] = msgs
        if "tools" in req:
            req["tools"] = _deref(req["tools"], store, f"{where} request.tools")
        rec["request"] = req
    if rec.get("response") is not None:
        rec["response"] = _deref(rec["response"], store, f"{where} response")
    return rec, msgs
