"""Recorded real llama-server replies (tests/fixtures/real_responses/*.json) through the Teacher client.

The shapes teacher-sim never produces: prose with a call written as text, `finish_reason: length`, prose in
answer to `tool_choice: required`, a tool call as JSON content under `constrain: tool_call_required` (complete,
and cut at `max_tokens`). Each fixture is served as recorded over HTTP
to `TeacherClient.chat`; the assistant message then goes the native agent's way (`assistant_message`, `execute`).
Re-record with `python3 tests/fixtures/record_real_responses.py`.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from sftree.agents.native import assistant_message
from sftree.agents.nativetools import TOOL_SCHEMAS
from sftree.httpserver import QuietThreadingHTTPServer, local_url, read_body, send_json, serve_in_background
from sftree.teacher.client import TeacherClient

FIXTURES = Path(__file__).parent / "fixtures" / "real_responses"


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


@pytest.fixture
def replay():
    """A server answering every chat request with one recorded reply; yields (set_reply, base_url, bodies)."""
    state = {"reply": None, "bodies": []}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            send_json(
                self, 200, {"data": [{"id": "m"}]} if self.path.endswith("/models") else {"status": "ok"}
            )

        def do_POST(self):
            state["bodies"].append(json.loads(read_body(self)))
            send_json(self, 200, state["reply"])

    srv = QuietThreadingHTTPServer(("127.0.0.1", 0), H)
    serving = serve_in_background(srv, "replay")
    yield (lambda r: state.__setitem__("reply", r)), local_url(srv), state["bodies"]
    serving.stop()


def chat(replay, name: str, tool_choice: str = "auto", constrain: str = "none"):
    set_reply, url, bodies = replay
    doc = load(name)
    set_reply(doc["response"])
    c = TeacherClient.from_config(
        {"base_url": url, "model": "m", "retries": 0, "health_timeout": 2, "tool_choice": tool_choice,
         "constrain": constrain}
    )  # fmt: skip
    comp = c.chat(doc["request"]["messages"], TOOL_SCHEMAS)
    return doc, comp, assistant_message(comp.message), bodies[-1]


def usage_of(doc: dict) -> tuple[int, int, int]:
    u = doc["response"]["usage"]
    return (
        u["prompt_tokens"],
        u["completion_tokens"],
        (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
    )


def test_usage_and_finish_reason_are_the_servers(replay):
    for name in sorted(p.stem for p in FIXTURES.glob("*.json")):
        doc, comp, _, _ = chat(replay, name)
        u = comp.usage
        assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == usage_of(doc), name
        assert comp.finish_reason == doc["response"]["choices"][0]["finish_reason"], name


def test_text_only_reply_has_no_tool_calls_so_the_agent_nudges(replay):
    """`tool_choice: auto`: the 135M model answers in prose, here with a call-like JSON object written as text;
    no tool_calls reach the agent, which is what makes it nudge (tests/test_real_teacher.py: on a live tree)."""
    doc, comp, msg, body = chat(replay, "auto_text")
    raw = doc["response"]["choices"][0]["message"]
    assert "tool_choice" not in body and not raw.get("tool_calls") and '"name"' in raw["content"]
    assert "tool_calls" not in msg and msg["content"] == raw["content"]
    assert comp.finish_reason == "length" and comp.usage.completion_tokens == doc["request"]["max_tokens"]


def test_length_cut_reply_is_kept_with_its_reason(replay):
    doc, comp, msg, _ = chat(replay, "length")
    assert (
        comp.finish_reason == "length" and comp.usage.completion_tokens == doc["request"]["max_tokens"] == 6
    )
    assert msg["content"] == doc["response"]["choices"][0]["message"]["content"] and "tool_calls" not in msg
    # the server's prefix cache: everything but the last prompt token was reused from the request before
    assert comp.usage.cached_tokens == comp.usage.prompt_tokens - 1


def test_required_that_the_model_answers_in_prose(replay):
    """`tool_choice: required` sent, and llama.cpp still answers in prose until max_tokens: its grammar for
    `required` allows free text before the first `<tool_call>` (docs/real_teacher.md). The reply is taken as a
    text-only reply (nudged), not as an error, and its finish_reason is kept."""
    doc, comp, msg, body = chat(replay, "required", tool_choice="required")
    assert body["tool_choice"] == "required" and body["tools"]
    assert comp.finish_reason == "length" and "tool_calls" not in msg and msg["content"].strip()


def test_constrained_reply_is_one_tool_call_with_the_required_arguments(replay):
    """`constrain: tool_call_required`: the server answers the call as JSON *content* (no `tool_calls`), with the
    tool's required arguments only; the client sends the cut schema and reads the content as one tool call."""
    doc, comp, msg, body = chat(replay, "constrained", "required", "tool_call_required")
    raw = doc["response"]["choices"][0]["message"]
    assert not raw.get("tool_calls") and raw["content"].lstrip().startswith("{")
    assert body["response_format"] == doc["request"]["response_format"]  # what the recording was made with
    bash = body["response_format"]["json_schema"]["schema"]["anyOf"][0]["properties"]["arguments"]
    assert sorted(bash["properties"]) == ["command", "description"] and bash["additionalProperties"] is False
    (call,) = msg["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "bash" and args == json.loads(raw["content"])["arguments"]
    assert sorted(args) == ["command", "description"]  # no invented `workdir`: the schema has none
    assert comp.notes == ["text_tool_calls:json"] and comp.finish_reason == "stop" and not msg.get("content")


def test_constrained_reply_cut_at_max_tokens_stays_text(replay):
    """A constrained call cut at `max_tokens` is unfinished JSON: it stays a text reply (the agent nudges), with
    `finish_reason: length`, not a tool call and not an error."""
    doc, comp, msg, _ = chat(replay, "constrained_length", "required", "tool_call_required")
    raw = doc["response"]["choices"][0]["message"]["content"]
    assert comp.finish_reason == "length" and comp.usage.completion_tokens == doc["request"]["max_tokens"]
    assert "tool_calls" not in msg and msg["content"] == raw and raw.startswith('{\n  "name": "bash"')
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)
