"""The chat messages of a step as training reads them: normalised (only the fields training needs, tool-call
arguments as JSON objects), tool results paired with their calls, and whether a reply may ever be trained
(`exclusion`, one of `records.sft.EXCLUSION_REASONS`). Pure functions over the step records
(`records/steplog.py`); dataset/export.py builds records from them."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from sftree.records.sft import Message

# a step as records/steplog.py's `read_steps` gives it: what the proxy recorded, so every field is checked here
Step = dict[str, Any]

# Normalisation notes (teacher/response.py) that leave what the model said unchanged: a field's name only.
HARMLESS_NOTES = frozenset({"reasoning_field"})


def _text(content: Any) -> str:
    """Message content as a string: null -> "", a list of content parts -> their text joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content, ensure_ascii=False)


def parse_arguments(arguments: Any) -> tuple[dict[str, Any], bool]:
    """Tool-call arguments as a JSON object; (object, malformed?). Empty -> {}; non-object -> {"_raw": ...}."""
    if isinstance(arguments, dict):
        return arguments, False
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}, False
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return {"_raw": raw}, True
    if isinstance(value, dict):
        return value, False
    return {"_raw": raw}, True


def normalize_message(msg: Message) -> tuple[Message, int]:
    """One OpenAI chat message with only the fields training needs; returns (message, malformed argument count)."""
    if not isinstance(msg, dict) or "role" not in msg:
        raise ValueError(f"not a chat message: {str(msg)[:80]}")
    out: dict[str, Any] = {"role": msg["role"], "content": _text(msg.get("content"))}
    malformed = 0
    if msg["role"] == "assistant":
        reasoning = msg.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            out["reasoning_content"] = reasoning
        calls = []
        for tc in msg.get("tool_calls") or []:
            fn = tc.get("function") or {}
            args, bad = parse_arguments(fn.get("arguments"))
            malformed += bad
            calls.append(
                {
                    "id": tc.get("id"),
                    "type": "function",
                    "function": {"name": fn.get("name"), "arguments": args},
                }
            )
        if calls:
            out["tool_calls"] = calls
    elif msg["role"] == "tool":
        out["tool_call_id"] = msg.get("tool_call_id")
        if msg.get("name"):
            out["name"] = msg["name"]
    elif msg.get("name"):
        out["name"] = msg["name"]
    return out, malformed


def tool_message(result: dict[str, Any]) -> Message:
    msg = {
        "role": "tool",
        "tool_call_id": result.get("tool_call_id"),
        "content": _text(result.get("content")),
    }
    if result.get("name"):
        msg["name"] = result["name"]
    return msg


def pairing_problems(messages: list[Message]) -> list[str]:
    """Every assistant tool_call id answered by exactly one later tool message, and no tool message unasked."""
    asked: dict[str, int] = {}
    answered: Counter[str | None] = Counter()  # (a tool message may have no id)
    problems = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            for tc in m.get("tool_calls", []):
                if tc["id"] in asked:
                    problems.append(f"tool call id {tc['id']} used twice")
                asked[tc["id"]] = i
        elif m["role"] == "tool":
            tid = m.get("tool_call_id")
            if tid not in asked:
                problems.append(f"tool message {tid} answers no earlier tool call")
            answered[tid] += 1
    for tid in asked:
        if answered[tid] != 1:
            problems.append(f"tool call {tid} answered {answered[tid]} times")
    return problems


def exclusion(step: Step) -> str | None:
    """Why this step's reply must never be a trained completion, or None when it is well-formed.

    In this order (the first that holds is the reason counted):

    - `truncated`: `finish_reason` is `length` (the reply was cut at `max_tokens`: its last tokens, a closing tag
      or the end-of-turn token, were never generated), or a `truncated_tool_call` note;
    - `text_tool_call`: a `text_tool_calls:*` note (the model wrote its call as text in `content`; trained, the
      chat template would render it as a real call the model never made in that form);
    - `malformed_arguments`: a tool call whose `arguments` are not a JSON object as the model sent them (kept as
      `{"_raw": ...}`, which the template would render as a real call); empty arguments count as `{}`;
    - `normalised`: any other normalisation note (`legacy_function_call`, `lone_surrogate_replaced`, notes added
      later) except `reasoning_field`, which only renames a field.
    """
    notes = [n for n in step.get("notes") or [] if isinstance(n, str)]
    if step.get("finish_reason") == "length" or "truncated_tool_call" in notes:
        return "truncated"
    if any(n.startswith("text_tool_calls") for n in notes):
        return "text_tool_call"
    resp = step.get("response")
    calls = resp.get("tool_calls") if isinstance(resp, dict) else None
    for tc in calls if isinstance(calls, list) else []:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or parse_arguments(fn.get("arguments"))[1]:
            return "malformed_arguments"
    if any(n not in HARMLESS_NOTES for n in notes):
        return "normalised"
    return None


def message_key(msg: Message) -> str:
    """An assistant message as later requests repeat it (content, tool-call ids, names and arguments; reasoning
    aside, which some agents do not resend): how an ill-formed reply is recognised in a record's history. A call
    whose arguments did not parse is keyed by its id and name alone: OpenCode resends it as its own `invalid` call
    (`{"tool": <name>, "error": ...}` under the same id), which is keyed the same way."""
    try:
        norm, _ = normalize_message(dict(msg, role="assistant"))
    except (ValueError, AttributeError):
        return ""
    calls = []
    for tc in norm.get("tool_calls", []):
        name, args = tc["function"]["name"], tc["function"]["arguments"]
        if name == "invalid" and isinstance(args, dict) and {"tool", "error"} <= set(args):
            name, args = str(args["tool"]), UNPARSED
        elif isinstance(args, dict) and set(args) == {"_raw"}:
            args = UNPARSED
        calls.append([tc["id"], name, args])
    return json.dumps([norm["content"], calls], sort_keys=True, ensure_ascii=False)


UNPARSED = "<arguments that did not parse>"


def name_tool_messages(messages: list[Message]) -> None:
    """Give each `role: tool` message without a `name` the name of the tool call it answers (in place)."""
    names: dict[str, str] = {}
    for m in messages:
        if m["role"] == "assistant":
            for tc in m.get("tool_calls", []):
                if tc["function"].get("name"):
                    names[tc["id"]] = tc["function"]["name"]
        elif m["role"] == "tool" and not m.get("name") and m.get("tool_call_id") in names:
            m["name"] = names[m["tool_call_id"]]
