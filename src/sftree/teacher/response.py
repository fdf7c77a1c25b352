"""Normalise one chat-completion reply of a real server into the one message shape the agent and export use.

Every reply of the Teacher (SGLang, llama-server, teacher-sim, recorded fixtures) goes through `normalize`.
What it does on purpose, each noted in `Reply.notes` (recorded in the step record):

- `reasoning_content` (SGLang `--reasoning-parser`, llama-server) or `reasoning` (other servers): kept as
  `reasoning_content`: it is part of what the model said and training signal.
- legacy `function_call` (no `tool_calls`): becomes one tool call (`legacy_function_call`).
- tool calls written as text in `content` (a server without a tool-call parser): Hermes
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (`text_tool_calls:hermes`), or content that
  is nothing but such a JSON object / list of them naming a known tool (`text_tool_calls:json`), become real
  tool calls; the text around Hermes blocks stays the content.
- `finish_reason: length` with a tool call cut off (arguments that are not JSON, or an unclosed `<tool_call>`):
  `truncated_tool_call`; the agent answers such calls with an error instead of running them.

A reply that cannot be read as a message raises `MalformedResponse` with the reason (the agent records one
failed step): no `choices`, a message that is not an object, a lone surrogate in a text field (it cannot be
written as UTF-8), usage counts that are not numbers, `tool_calls` that is not a list of objects.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from sftree.jsontypes import ForeignJSON, WireObject

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_SURROGATE = re.compile("[\ud800-\udfff]")
# What SGLang, vLLM, llama-server and OpenAI say when the prompt outgrows the context (HTTP 400 bodies).
_OVERFLOW = re.compile(
    r"context length|context_length|maximum context|context window|exceed_context_size|"
    r"exceeds the available context|too many tokens|longer than the model",
    re.IGNORECASE,
)


class MalformedResponse(ValueError):
    """The reply is not a readable chat completion; the message is the reason."""


@dataclass
class Reply:
    message: WireObject  # role, content, tool_calls (list, maybe empty), reasoning_content (if any)
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    notes: list[str] = field(default_factory=list)
    truncated_calls: bool = False  # finish_reason length cut a tool call: do not run the calls


def is_context_overflow(status: int, text: str) -> bool:
    """An HTTP 400 (or 413) whose body says the request is longer than the model's context."""
    return status in (400, 413) and bool(_OVERFLOW.search(text or ""))


def _count(usage: ForeignJSON, key: str, where: str) -> int:
    v = usage.get(key)
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or v != v:
        raise MalformedResponse(f"{where}.{key} is not a non-negative number: {str(v)[:60]!r}")
    return int(v)


def _check_text(value: object, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise MalformedResponse(f"{where} is a {type(value).__name__}, not a string")
    m = _SURROGATE.search(value)
    if m:
        raise MalformedResponse(f"{where} holds a lone surrogate U+{ord(m.group()):04X} (not valid Unicode)")
    return value


def _call(i: int, name: object, arguments: object, call_id: object = None, reply_id: str = "") -> WireObject:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not (isinstance(call_id, str) and call_id):
        # ids must be unique across the session (the export checks it): derive one from the reply and the call
        key = f"{reply_id}\x00{i}\x00{name}\x00{arguments}".encode("utf-8", "backslashreplace")
        call_id = f"call_{hashlib.sha256(key).hexdigest()[:16]}"
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": str(name), "arguments": arguments},
    }


def _structured_calls(raw: object, where: str, reply_id: str) -> list[WireObject]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise MalformedResponse(f"{where} is a {type(raw).__name__}, not a list")
    calls: list[WireObject] = []
    for i, c in enumerate(raw):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise MalformedResponse(f"{where}[{i}] is not a tool call object with function.name")
        args = fn.get("arguments")
        if isinstance(args, str):
            _check_text(args, f"{where}[{i}].function.arguments")
        calls.append(_call(i, fn["name"], args if args is not None else "{}", c.get("id"), reply_id))
    return calls


def _as_call(obj: object) -> tuple[str, object] | None:
    """(name, arguments) of a text tool call object ({"name", "arguments"|"parameters"}), else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return (obj["name"], args) if isinstance(args, dict | str) else None


def _text_calls(
    content: str, tool_names: set[str] | None, reply_id: str
) -> tuple[list[WireObject], str, str | None]:
    """Tool calls written in the content: (calls, remaining content, form) - form None when there are none."""
    blocks = _HERMES.findall(content)
    if blocks:
        calls: list[WireObject] = []
        for b in blocks:
            try:
                parsed = _as_call(json.loads(b))
            except json.JSONDecodeError:
                parsed = None
            if parsed is None:
                return [], content, None  # not a call we can read: leave the text as it is
            calls.append(_call(len(calls), *parsed, reply_id=reply_id))
        return calls, _HERMES.sub("", content).strip(), "hermes"
    text = content.strip()
    if text.startswith("```") and text.endswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    if not text.startswith(("{", "[")):
        return [], content, None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return [], content, None
    items = obj if isinstance(obj, list) else [obj]
    found = [_as_call(x) for x in items]
    # bare JSON is only a call when it names a tool we offered: a JSON answer stays text
    named = [p for p in found if p is not None and not (tool_names and p[0] not in tool_names)]
    if not items or len(named) != len(found):
        return [], content, None
    return [_call(i, *p, reply_id=reply_id) for i, p in enumerate(named)], "", "json"


def _args_ok(arguments: str) -> bool:
    try:
        json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return False
    return True


def normalize(payload: object, tool_names: set[str] | None = None) -> Reply:
    """The reply of `/v1/chat/completions` as a `Reply`; raises MalformedResponse naming what is wrong."""
    if not isinstance(payload, dict):
        raise MalformedResponse(f"reply is a {type(payload).__name__}, not a JSON object")
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedResponse("reply has no `choices[0]` object")
    choice = choices[0]
    msg = choice.get("message")
    if not isinstance(msg, dict):
        raise MalformedResponse("choices[0].message is not an object")
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise MalformedResponse(f"choices[0].finish_reason is not a string: {str(finish)[:60]!r}")
    usage = payload.get("usage") or {}
    if not isinstance(usage, dict):
        raise MalformedResponse("usage is not an object")
    details = usage.get("prompt_tokens_details") or {}
    if not isinstance(details, dict):
        raise MalformedResponse("usage.prompt_tokens_details is not an object")
    prompt = _count(usage, "prompt_tokens", "usage")
    completion = _count(usage, "completion_tokens", "usage")
    cached = _count(details, "cached_tokens", "usage.prompt_tokens_details")

    notes: list[str] = []
    content = _check_text(msg.get("content"), "message.content")
    reasoning = _check_text(msg.get("reasoning_content"), "message.reasoning_content")
    if reasoning is None and msg.get("reasoning") is not None:
        reasoning = _check_text(msg.get("reasoning"), "message.reasoning")
        notes.append("reasoning_field")
    # the reply's id, else its content: what makes generated call ids differ from step to step
    reply_id = str(payload.get("id") or "") + "\x00" + json.dumps(msg, sort_keys=True, ensure_ascii=True)
    calls = _structured_calls(msg.get("tool_calls"), "message.tool_calls", reply_id)
    if not calls and msg.get("function_call") is not None:
        fc = msg["function_call"]
        if not isinstance(fc, dict) or not isinstance(fc.get("name"), str):
            raise MalformedResponse("message.function_call is not an object with a name")
        calls = [_call(0, fc["name"], fc.get("arguments") or "{}", None, reply_id)]
        notes.append("legacy_function_call")
    if not calls and content:
        found, rest, form = _text_calls(content, tool_names, reply_id)
        if form:
            calls, content = found, rest
            notes.append(f"text_tool_calls:{form}")
    truncated = False
    if finish == "length":
        cut = any(not _args_ok(c["function"]["arguments"]) for c in calls)
        unclosed = bool(content and content.count("<tool_call>") > content.count("</tool_call>"))
        if cut or unclosed:
            truncated = True
            notes.append("truncated_tool_call")
    out: WireObject = {"role": "assistant", "content": content or ""}
    if reasoning:
        out["reasoning_content"] = reasoning
    if calls:
        out["tool_calls"] = calls
    return Reply(out, finish, prompt, completion, cached, notes, truncated)
