"""Every request the Teacher receives carries the host's parameters and nothing else (issue #49,
teacher/params.py): the native client builds its requests from the settings, and the recording proxy sends on of
OpenCode's request only its messages, tools and `stream`, the rest the host's, recording what OpenCode sent
otherwise. (The real OpenCode, with a hostile agent file in the knowledge: tests/security/test_opencode_loads.py.)"""

from __future__ import annotations

import pytest
import requests
from helpers.scripted import ScriptedTeacher

from sftree.agents.proxy import RecordingProxy
from sftree.settings import TeacherSettings, section_settings
from sftree.teacher.client import TeacherClient, request_seed
from sftree.teacher.params import OPENCODE_FIELDS, RequestParams, differences, upstream_body

MESSAGES = [{"role": "system", "content": "You are OpenCode."}, {"role": "user", "content": "Improve."}]
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
HEADERS = {"X-Sftree-Tree": "t", "X-Sftree-Edge": "e4", "X-Sftree-Attempt": "1", "X-Sftree-Turn": "1"}
# What an agent file's frontmatter (`temperature`, `top_p`, `options: {...}`) makes OpenCode send (issue #49)
HOSTILE = {
    "temperature": 1.77,
    "top_p": 0.123,
    "regex": "FORCED-BY-ANCESTOR.*",
    "logit_bias": {"15": -100},
    "chat_template_kwargs": {"enable_thinking": True},
    "response_format": {"type": "json_object"},
    "n": 3,
}


def host_settings(**over: object) -> TeacherSettings:
    values = {"model": "the-teacher", "temperature": 0.3, "top_p": 0.9, "max_tokens": 123, "seed": 7,
              "tool_choice": "required", "stream": False, "extra_body": {"top_k": 20}, **over}  # fmt: skip
    return section_settings(TeacherSettings, values)


def expected_fields(n_messages: int, *, stream: bool) -> dict:
    """The host's fields written out by hand from `host_settings` (not through RequestParams)."""
    out = {"model": "the-teacher", "max_tokens": 123, "temperature": 0.3, "top_p": 0.9, "tool_choice": "required",
           "seed": request_seed(7, HEADERS, n_messages), "top_k": 20}  # fmt: skip
    if stream:
        out.update(stream=True, stream_options={"include_usage": True})
    return out


@pytest.fixture
def teacher():
    t = ScriptedTeacher({})
    url = t.start()
    yield t, url
    t.stop()


def fields_of(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in ("messages", "tools")}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_native_requests_carry_exactly_the_hosts_parameters(teacher, stream):
    scripted, url = teacher
    client = TeacherClient(host_settings(base_url=url, stream=stream))
    client.chat(MESSAGES, TOOLS, headers=HEADERS)
    (seen,) = scripted.requests
    assert seen["body"]["messages"] == MESSAGES and seen["body"]["tools"] == TOOLS
    assert fields_of(seen["body"]) == expected_fields(len(MESSAGES), stream=stream)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_opencodes_own_fields_never_reach_the_teacher_and_are_recorded(teacher, stream):
    scripted, url = teacher
    params = RequestParams.from_settings(host_settings())
    proxy = RecordingProxy(url, retries=0, params=params).start()
    try:
        ch = proxy.channel("e4", {k: v for k, v in HEADERS.items() if k != "X-Sftree-Turn"})
        sent = {"model": "gpt-5", "messages": MESSAGES, "tools": TOOLS, "stream": stream, **HOSTILE}
        resp = requests.post(f"{proxy.base_url('e4')}/chat/completions", json=sent, timeout=30)
        assert resp.status_code == 200, resp.text
        (seen,) = scripted.requests
        # the Teacher saw OpenCode's messages and tools and the host's fields: nothing of the agent file
        assert seen["body"]["messages"] == MESSAGES and seen["body"]["tools"] == TOOLS
        assert fields_of(seen["body"]) == expected_fields(len(MESSAGES), stream=stream)
        (rec,) = ch.take()
        assert rec["request"]["model"] == "gpt-5"  # the Student's id, as OpenCode named it
        assert rec["request"]["params"] == {
            k: v for k, v in expected_fields(len(MESSAGES), stream=stream).items() if k != "model"
        }
        diff = rec["params_diff"]
        assert sorted(diff) == sorted(HOSTILE)  # each field of OpenCode's own, with both sides
        assert diff["temperature"] == {"expected": "0.3", "got": "1.77"}
        assert diff["regex"] == {"expected": "null", "got": '"FORCED-BY-ANCESTOR.*"'}
        assert ch.params_diffs == dict.fromkeys(HOSTILE, 1)
    finally:
        proxy.stop()


def test_both_backends_send_the_same_fields_for_the_same_session(teacher):
    """One place builds them: the native client's request and the proxy's for an honest OpenCode request match."""
    scripted, url = teacher
    settings = host_settings(base_url=url, stream=True)
    TeacherClient(settings).chat(MESSAGES, TOOLS, headers=HEADERS)
    honest = {"model": "gpt-5", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 123, "temperature": 0.3,
              "tool_choice": "required", "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    params = RequestParams.from_settings(settings)
    proxied = upstream_body(honest, params, HEADERS)
    assert fields_of(scripted.requests[0]["body"]) == fields_of(proxied)
    assert differences({**honest, "top_p": 0.9, "top_k": 20}, proxied) == {}  # honest traffic: no difference


def test_only_the_closed_list_of_opencodes_fields_goes_on():
    params = RequestParams.from_settings(
        host_settings(extra_body={}, seed=None, top_p=None, tool_choice="auto")
    )
    odd = {"messages": MESSAGES, "tools": TOOLS, "stream": False, "user": "x", "metadata": {"a": 1},
           "parallel_tool_calls": False, "stop": ["</s>"], "ebnf": "root ::= x", "max_completion_tokens": 9}  # fmt: skip
    sent = upstream_body(odd, params, HEADERS)
    assert set(sent) == {*OPENCODE_FIELDS[:2], "model", "max_tokens", "temperature"}
    # without tools, `tool_choice` chooses nothing; with them, OpenCode's `auto` is the server's default
    assert differences({**odd, "tool_choice": "auto"}, sent).keys() == set(odd) - set(OPENCODE_FIELDS)
