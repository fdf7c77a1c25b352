"""The recording proxy (sftree/proxy.py) in front of a real `teacher-sim` over HTTP; no OpenCode needed."""

from __future__ import annotations

import json

import pytest
import requests

from sftree.agents.proxy import RecordingProxy, StreamAssembler, classify, compacted
from sftree.teacher.sim.server import start_teacher_sim

TOOLS = [
    {"type": "function", "function": {"name": n, "description": n, "parameters": {"type": "object"}}}
    for n in ("bash", "read", "grep")
]
MESSAGES = [
    {"role": "system", "content": "You are opencode, an interactive CLI tool."},
    {"role": "user", "content": "Improve the score."},
]


@pytest.fixture(scope="module")
def proxied():
    url, stop = start_teacher_sim(
        port=0, seed=1, script=[{"match": {"edge": "e9"}, "fault": "http_503", "count": 1}]
    )
    proxy = RecordingProxy(url, retries=2, backoff_max=0.05).start()
    yield proxy, stop.server.state
    proxy.stop()
    stop()


def post(proxy, channel, body, **headers):
    return requests.post(
        f"{proxy.base_url(channel)}/chat/completions", json=body, headers=headers, timeout=30
    )


def test_stream_and_plain_give_the_same_record(proxied):
    proxy, _ = proxied
    ch = proxy.channel("e1", {"X-Sftree-Edge": "e1"})
    body = {"model": "teacher-sim", "messages": MESSAGES, "tools": TOOLS}
    plain = post(proxy, "e1", body).json()["choices"][0]["message"]
    resp = post(proxy, "e1", {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert resp.text.rstrip().endswith("data: [DONE]")  # relayed verbatim to the client
    recs = ch.take()
    assert [r["kind"] for r in recs] == ["agent", "agent"]
    a, b = recs
    # The policy answers the same request the same way: the assembled stream equals the plain answer.
    assert b["response"]["tool_calls"] == plain["tool_calls"] == a["response"]["tool_calls"]
    assert b["response"]["content"] == plain["content"]
    assert b["finish_reason"] == a["finish_reason"] == "tool_calls"
    assert b["request"] == {"model": "teacher-sim", "messages": MESSAGES, "tools": TOOLS}
    # Same prompt and answer sizes; the second request finds its prefix cached (teacher-sim's estimate).
    assert b["usage"]["prompt_tokens"] == a["usage"]["prompt_tokens"] > 0
    assert b["usage"]["completion_tokens"] == a["usage"]["completion_tokens"] > 0
    assert b["usage"]["cached_tokens"] > a["usage"]["cached_tokens"]
    assert ch.take() == []


def test_headers_reach_the_teacher_and_errors_are_retried(proxied):
    proxy, state = proxied
    ch = proxy.channel("e9", {"X-Sftree-Edge": "e9", "X-Sftree-Depth": "2"})
    ch.turn = 2
    resp = post(proxy, "e9", {"model": "m", "messages": MESSAGES, "tools": TOOLS, "stream": True})
    assert resp.status_code == 200  # the scripted 503 (aimed at edge e9 by header) was retried
    (rec,) = ch.take()
    assert rec["turn"] == 2 and rec["response"]["tool_calls"]


def test_stopped_channel_answers_503_and_records_nothing(proxied):
    proxy, _ = proxied
    ch = proxy.channel("e2")
    ch.stopped = True
    resp = post(proxy, "e2", {"model": "m", "messages": MESSAGES, "tools": TOOLS, "stream": True})
    assert resp.status_code == 503 and ch.take() == []


def test_assembler_joins_split_tool_call_arguments():
    asm = StreamAssembler()
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "content": "Let me "}}]},
        {"choices": [{"delta": {"content": "look.", "reasoning_content": "think"}}]},
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "c7", "function": {"name": "bash", "arguments": '{"comm'}}
                        ]
                    }
                }
            ]
        },
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'and": "ls"}'}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3}},
    ]
    data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    raw = data.encode()
    for i in range(0, len(raw), 7):  # split anywhere, even inside a line
        asm.feed(raw[i : i + 7])
    asm.close()
    assert asm.message() == {
        "role": "assistant",
        "content": "Let me look.",
        "reasoning_content": "think",
        "tool_calls": [
            {"id": "c7", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
        ],
    }
    assert asm.finish_reason == "tool_calls" and asm.usage["prompt_tokens"] == 12


def test_classify_title_compaction_and_agent():
    title = {
        "messages": [
            {"role": "system", "content": "You are a title generator. You output ONLY a thread title."}
        ]
    }
    compaction = {
        "messages": [
            {
                "role": "system",
                "content": "... Your goal is to produce a structured summary matching the format",
            }
        ]
    }
    agent = {"messages": MESSAGES, "tools": TOOLS}
    assert [classify(title), classify(compaction), classify(agent)] == ["title", "compaction", "agent"]
    checkpoint = {
        "messages": [{"role": "user", "content": "<conversation-checkpoint>\n<summary>x</summary>"}]
    }
    assert compacted(checkpoint) and not compacted(agent)
