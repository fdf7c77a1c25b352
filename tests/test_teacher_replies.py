"""Real-server reply shapes and failures through the one normalisation (teacher/response.py), over HTTP.

Each shape is produced by teacher-sim's fault modes, so the client parses exactly the bytes a server sends.
"""

from __future__ import annotations

import json

import pytest

from sftree.agents.native import context_check
from sftree.agents.nativetools import TOOL_SCHEMAS
from sftree.errors import InputError
from sftree.teacher.client import BadReply, ContextOverflow, TeacherClient
from sftree.teacher.response import MalformedResponse, is_context_overflow, normalize
from sftree.teacher.sim.server import make_state, parse_rules, reshape, start_teacher_sim

MSGS = [{"role": "user", "content": "Improve the score. " * 20}]
NAMES = {t["function"]["name"] for t in TOOL_SCHEMAS}


def reply_under(fault: str | None, **sim_opts):
    """One chat() against teacher-sim with `fault` on every request: (completion or exception, requests seen)."""
    script = [{"match": {}, "fault": fault}] if fault else []
    url, stop = start_teacher_sim(port=0, script=script, **sim_opts)
    try:
        c = TeacherClient.from_config(
            {"base_url": url, "retries": 3, "backoff_base": 0.01, "backoff_max": 0.02, "health_timeout": 2}
        )
        try:
            out = c.chat(MSGS, TOOL_SCHEMAS, headers={"X-Sftree-Edge": "e1"})
        except (BadReply, ContextOverflow) as exc:
            out = exc
        return out, stop.server.state.requests
    finally:
        stop()


def test_plain_reply_is_a_tool_call_without_notes():
    comp, _ = reply_under(None)
    assert comp.message["tool_calls"] and comp.notes == [] and not comp.truncated_calls


def test_context_overflow_400_is_not_retried():
    exc, requests = reply_under("context_overflow")
    assert isinstance(exc, ContextOverflow) and "context length" in str(exc)
    assert requests == 1  # a retry would only overflow again


def test_sim_context_tokens_limit_answers_400():
    exc, _ = reply_under(None, context_tokens=50)
    assert isinstance(exc, ContextOverflow) and "(50 tokens)" in str(exc)


@pytest.mark.parametrize(
    "fault, reason",
    [
        ("lone_surrogate", "message.content holds a lone surrogate U+D800 (not valid Unicode)"),
        ("bad_usage", "usage.prompt_tokens is not a non-negative number: 'many'"),
        ("tool_calls_string", "message.tool_calls is a str, not a list"),
    ],
)
def test_malformed_reply_is_one_bad_reply_with_reason(fault, reason):
    exc, requests = reply_under(fault)
    assert isinstance(exc, BadReply) and str(exc) == reason
    assert requests == 1
    exc.raw.encode("ascii")  # always writable to a transcript (the surrogate is escaped)
    assert "ud800" in exc.raw if fault == "lone_surrogate" else True


@pytest.mark.parametrize("fault, note", [("hermes_text", "hermes"), ("json_text", "json")])
def test_tool_calls_written_as_text_become_tool_calls(fault, note):
    plain, _ = reply_under(None)
    comp, _ = reply_under(fault)
    assert comp.notes == [f"text_tool_calls:{note}"]
    got = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in comp.message["tool_calls"]
    ]
    want = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in plain.message["tool_calls"]
    ]
    assert got == want and "<tool_call>" not in comp.message["content"]


def test_reasoning_content_is_kept():
    comp, _ = reply_under("reasoning")
    assert comp.message["reasoning_content"].startswith("I should look at the code")
    assert comp.message["tool_calls"]


def test_legacy_function_call_becomes_one_tool_call():
    plain, _ = reply_under(None)
    comp, _ = reply_under("function_call")
    assert comp.notes == ["legacy_function_call"] and len(comp.message["tool_calls"]) == 1
    assert comp.message["tool_calls"][0]["function"] == plain.message["tool_calls"][0]["function"]
    assert comp.message["tool_calls"][0]["id"].startswith("call_")


def test_length_mid_tool_call_is_marked_truncated():
    comp, _ = reply_under("length_mid_call")
    assert comp.finish_reason == "length" and comp.truncated_calls and comp.notes == ["truncated_tool_call"]


def test_length_inside_the_text_is_a_cut_reply_without_calls():
    comp, _ = reply_under("length_text")
    assert comp.finish_reason == "length" and not comp.truncated_calls and comp.notes == []
    assert "tool_calls" not in comp.message and comp.message["content"]


def test_reshape_length_text_by_hand():
    payload = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "abcdef",
                    "tool_calls": [{"id": "c", "function": {}}],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    choice = reshape(payload, {"length_text"})["choices"][0]
    assert choice == {"message": {"role": "assistant", "content": "abcd"}, "finish_reason": "length"}


def test_script_skip_aims_at_a_later_request():
    state = make_state(script=[{"match": {"edge": "e1"}, "fault": "no_eval", "skip": 2, "count": 1}])
    got = [state.faults_for({"edge": "e1"}, f"h{i}")[0] for i in range(5)]
    assert got == [set(), set(), {"no_eval"}, set(), set()]
    assert state.faults_for({"edge": "e2"}, "x")[0] == set()  # other edges never count toward the skip
    with pytest.raises(InputError, match="skip must be a non-negative integer"):
        parse_rules([{"match": {}, "fault": "no_eval", "skip": -1}])


def _payload(message: dict, finish="stop", usage=None) -> dict:
    return {"choices": [{"message": message, "finish_reason": finish}], "usage": usage or {}}


def test_normalize_edge_cases_by_hand():
    # a JSON answer that names no offered tool stays text
    r = normalize(_payload({"content": '{"name": "circle", "arguments": {}}'}), NAMES)
    assert (
        r.message == {"role": "assistant", "content": '{"name": "circle", "arguments": {}}'} and not r.notes
    )
    # an unclosed Hermes block under finish_reason length: truncated, left as text
    r = normalize(_payload({"content": 'ok <tool_call>{"name": "bash", "argu'}, "length"), NAMES)
    assert r.truncated_calls and "tool_calls" not in r.message
    # the `reasoning` field of other servers is kept as reasoning_content
    r = normalize(_payload({"content": "x", "reasoning": "think"}), NAMES)
    assert r.message["reasoning_content"] == "think" and r.notes == ["reasoning_field"]
    # text around Hermes blocks stays the content; dict arguments are serialized
    r = normalize(_payload({"content": 'Run it.\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}'
                                       "</tool_call>"}), NAMES)  # fmt: skip
    assert r.message["content"] == "Run it."
    assert r.message["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
    # generated call ids differ between replies (a session must not repeat one), and are reproducible
    calls = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    ids = [normalize(dict(_payload({"content": calls}), id=rid), NAMES).message["tool_calls"][0]["id"]
           for rid in ("a", "b", "a")]  # fmt: skip
    assert ids[0] != ids[1] and ids[0] == ids[2]
    for bad, reason in [
        ({}, r"no `choices\[0\]`"),
        (_payload("text"), "message is not an object"),
        (_payload({"content": 3}), "message.content is a int"),
        (_payload({"content": ""}, usage={"completion_tokens": -1}), "completion_tokens is not"),
        (_payload({"content": "", "tool_calls": [{"function": "bash"}]}), r"tool_calls\[0\] is not"),
        (_payload({"content": "", "function_call": "bash"}), "function_call is not an object"),
    ]:
        with pytest.raises(MalformedResponse, match=reason):
            normalize(bad, NAMES)


def test_overflow_detection_and_context_check_by_hand():
    assert is_context_overflow(400, "This model's maximum context length is 8192 tokens")
    assert is_context_overflow(400, '{"error": {"type": "exceed_context_size_error"}}')  # llama-server
    assert not is_context_overflow(400, "messages must be a list")
    assert not is_context_overflow(500, "context length")
    # 120000 used + 4096 reply: 124096 < 131072 fits; at exactly the limit it does not
    assert context_check(120000, 4096, 131072) is None
    assert "teacher.context_tokens 131072" in context_check(126976, 4096, 131072)
    assert context_check(10**9, 4096, None) is None
