"""The JSON the agents read and write, typed: what others send (OpenAI chat requests and replies, OpenCode's events,
a request body from the sandbox, a session's messages) is a `JSONObject` of `JSONValue`s, read through the narrowing
helpers below, which trust no shape; what sftree owns (step records, their tool results and usage) is a TypedDict
(docs/architecture.md, "Step records")."""

from __future__ import annotations

from typing import Literal, NotRequired, Protocol, TypeAlias, TypedDict

# Any value JSON holds, as `object`: every read checks its shape first (isinstance, or `obj`/`arr` below), and a
# session's messages are the search's type (`dict[str, object]`, search/edge.py) with no copy between the two.
JSONValue: TypeAlias = object
JSONObject: TypeAlias = dict[str, JSONValue]
JSONList: TypeAlias = list[JSONValue]

# What a step record's model call was (agents/proxy.py `classify`; the native agent's are agent or nudge).
StepKind = Literal["agent", "nudge", "title", "compaction", "summary"]


def obj(value: object) -> JSONObject:
    """`value` when it is a JSON object, else an empty one (what `value or {}` reads, for any shape)."""
    return value if isinstance(value, dict) else {}


def arr(value: object) -> JSONList:
    """`value` when it is a JSON array, else an empty one (what `value or []` reads, for any shape)."""
    return value if isinstance(value, list) else []


def count(value: object) -> int:
    """A count as `int(value or 0)` reads it from JSON that holds one (a number, or a numeric string)."""
    return int(value) if isinstance(value, int | float | str) and value else 0


class ChatRequest(TypedDict):
    """A step record's request: exactly what was sent (foreign for OpenCode's, so its parts stay JSON)."""

    model: JSONValue
    messages: JSONValue  # a list of messages (a request from the sandbox may send anything)
    tools: JSONValue


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
    """A step record's usage from the client's counts (the keys and order of `Usage.to_dict`)."""
    out: UsageRecord = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
    }
    if usage.estimated:
        out["estimated"] = True
    return out


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
    compacted: NotRequired[bool]
    error: NotRequired[str]
    raw_response: NotRequired[str]
    tampered: NotRequired[dict[str, str]]
