"""The host's request parameters: every field of a request to the Teacher but its messages and tools, built in one
place from the settings (`teacher:`), for both backends (DESIGN.md "Trained records", docs/security.md).

The native client sends `RequestParams.body(messages, tools, headers)`. OpenCode's requests pass the recording proxy
(agents/proxy.py), which sends `upstream_body(sent, params, headers)`: of what OpenCode sent, only the fields of
`OPENCODE_FIELDS` go on (a closed list: the session's messages, its tools, and whether to stream, which is how
OpenCode reads the answer); every other field is the host's, from `RequestParams.fields`. So no file OpenCode
loads (an agent's `temperature`, `top_p` or `options: {regex: ...}`, a plugin's `chat.params`) reaches the Teacher:
what samples each reply is the settings' alone, and the step record keeps it (`request.params`, records/steplog.py).

A field OpenCode sent with a value other than the one the host sent is a difference (`differences`), recorded with
the step as a chain break is (`params_diff`): honest OpenCode sends the host's values (its opencode.json carries
`teacher.temperature` and `max_tokens`), so a difference says that something OpenCode loaded tried to choose.
`model` is the exception: OpenCode names the Student's model id by design (docs/opencode.md), the request goes
on for `teacher.model`, and the record keeps the Student's id in `request.model` (the Teacher's name reaches no
record), never in `params`.

Pure: no I/O; `request_seed` and `tool_call_response_format` are the formulas of a request's seed and constraint
(the client's and the proxy's alike).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from sftree.jsontypes import JSONObject, JSONValue, Tools, WireObject
from sftree.settings import TeacherSettings
from sftree.teacher.logprobs import request_fields

# What of OpenCode's request goes on to the Teacher (everything else is the host's or dropped).
OPENCODE_FIELDS = ("messages", "tools", "stream")
# A field the host leaves out means the server's default: what an equal value of OpenCode's is not a difference of.
SERVER_DEFAULTS: dict[str, JSONValue] = {"tool_choice": "auto"}
SHOWN = 600  # characters of each side of a difference kept in the record (as agents/chain.py keeps a break's)


@dataclass(frozen=True)
class RequestParams:
    """The host's fields of every request to the Teacher, from `teacher:` (`from_settings`)."""

    model: str
    max_tokens: int
    temperature: float | None
    top_p: float | None
    seed: int | None  # the base of each request's seed (`request_seed`); None: no seed is sent
    tool_choice: str  # `auto` is the servers' default: left out
    constrain: str  # the native client's (config.py refuses it with the OpenCode backend)
    stream: bool  # the native client's choice; through the proxy, OpenCode's (it reads the answer)
    logprobs: int  # `teacher.logprobs`: the top-K of the sampled tokens' logprobs asked for; 0: none
    extra_body: Mapping[str, JSONValue]  # sent last: it keeps the last word

    @classmethod
    def from_settings(cls, t: TeacherSettings) -> RequestParams:
        return cls(
            model=t.model,
            max_tokens=t.max_tokens,
            temperature=t.temperature,
            top_p=t.top_p,
            seed=t.seed,
            tool_choice=t.tool_choice or "auto",
            constrain=t.constrain or "none",
            stream=bool(t.stream),
            logprobs=int(t.logprobs or 0),
            extra_body=dict(t.extra_body or {}),
        )

    def fields(
        self,
        tools: list[JSONValue] | None,
        headers: Mapping[str, object] | None,
        n_messages: int,
        *,
        stream: bool | None = None,
    ) -> JSONObject:
        """Every field of one request but `messages` and `tools`: `stream` (None: the settings' choice), the
        request's seed from its `X-Sftree-*` headers and length, `tool_choice` and the constraint where tools
        are offered, `extra_body` last."""
        out: JSONObject = {"model": self.model, "max_tokens": self.max_tokens}
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.top_p is not None:
            out["top_p"] = self.top_p
        if tools:
            if self.tool_choice != "auto":
                out["tool_choice"] = self.tool_choice
            if self.constrain != "none":
                calls = [t for t in tools if isinstance(t, dict)]
                out["response_format"] = tool_call_response_format(
                    calls, required_args_only=self.constrain == "tool_call_required"
                )
        if self.seed is not None:
            out["seed"] = request_seed(self.seed, headers, n_messages)
        out.update(request_fields(self.logprobs))  # `logprobs`, `top_logprobs` (teacher/logprobs.py)
        if self.stream if stream is None else stream:  # the reply as SSE chunks, usage in the last one
            out["stream"] = True
            out["stream_options"] = {"include_usage": True}
        out.update(self.extra_body)
        return out

    def body(
        self, messages: list[JSONValue], tools: list[JSONValue] | None, headers: Mapping[str, object] | None
    ) -> JSONObject:
        """The native client's whole request."""
        out: JSONObject = {"messages": messages}
        if tools:
            out["tools"] = tools
        out.update(self.fields(tools, headers, len(messages)))
        return out


def upstream_body(
    sent: JSONObject, params: RequestParams, headers: Mapping[str, object] | None
) -> JSONObject:
    """What goes on to the Teacher for a request OpenCode sent: its `OPENCODE_FIELDS`, the host's fields."""
    messages = sent.get("messages")
    msgs = messages if isinstance(messages, list) else []
    tools = sent.get("tools")
    offered = tools if isinstance(tools, list) else None
    out: JSONObject = {"messages": msgs}
    if offered is not None:
        out["tools"] = offered
    out.update(params.fields(offered, headers, len(msgs), stream=bool(sent.get("stream"))))
    return out


def sent_params(upstream: JSONObject) -> JSONObject:
    """A step record's `request.params`: the fields sent but the messages, the tools and `model`."""
    return {k: v for k, v in upstream.items() if k not in ("messages", "tools", "model")}


def differences(sent: JSONObject, upstream: JSONObject) -> dict[str, dict[str, str]]:
    """The fields OpenCode sent whose value differs from what went on ({field: {expected, got}}, each side as JSON
    text cut at SHOWN characters; `expected` is null's text where the host sent none): empty for honest traffic."""
    out: dict[str, dict[str, str]] = {}
    for key, got in sent.items():
        if key in OPENCODE_FIELDS or key == "model":
            continue
        expected = upstream.get(key, SERVER_DEFAULTS.get(key))
        if key == "tool_choice" and not upstream.get("tools"):
            expected = upstream.get(key, got)  # without tools it chooses nothing
        if _canonical(got) != _canonical(expected):
            out[key] = {"expected": _shown(expected), "got": _shown(got)}
    return out


def _canonical(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _shown(value: object) -> str:
    text = _canonical(value)
    return text if len(text) <= SHOWN else text[:SHOWN] + f"... ({len(text)} characters)"


def required_only(params: WireObject) -> WireObject:
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


def tool_call_schema(tools: Tools, *, required_args_only: bool = False) -> WireObject:
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


def tool_call_response_format(tools: Tools, *, required_args_only: bool = False) -> WireObject:
    """`response_format` for `teacher.constrain: tool_call[_required]`: llama-server compiles it to a grammar that
    is active from the first token (not lazy like its tool-call grammar); the reply's content is then one JSON
    call, which `teacher.response.normalize` turns into a tool call (`text_tool_calls:json`)."""
    schema = tool_call_schema(tools, required_args_only=required_args_only)
    return {"type": "json_schema", "json_schema": {"name": "tool_call", "strict": True, "schema": schema}}


SEED_HEADERS = ("X-Sftree-Tree", "X-Sftree-Edge", "X-Sftree-Attempt", "X-Sftree-Turn")


def request_seed(base: int, headers: Mapping[str, object] | None, n_messages: int) -> int:
    """The sampling seed of one request under `teacher.seed`: a pure function of the base seed, the tree, edge,
    attempt and turn (the request's `X-Sftree-*` headers) and the session's length. A tree rerun the same way
    samples the same replies (llama-server on the CPU is deterministic for a fixed seed, prompt and prefix-cache
    state, docs/real_teacher.md), while sibling edges, whose first requests are byte-identical, still draw
    different ones (one seed for all would make them copies)."""
    key = [str(base)] + [str((headers or {}).get(h, "")) for h in SEED_HEADERS] + [str(n_messages)]
    return zlib.crc32("\x1f".join(key).encode("utf-8")) & 0x7FFFFFFF
