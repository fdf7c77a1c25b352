"""The recording proxy (sftree/agents/proxy.py) in front of a real `teacher-sim` over HTTP; no OpenCode needed."""

from __future__ import annotations

import dataclasses
import json
import socket

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
    # OpenCode's model id, messages and tools, and the fields that went on: the host's (teacher/params.py)
    host = {"max_tokens": 4096, "temperature": 0.7}
    assert a["request"] == {"model": "teacher-sim", "messages": MESSAGES, "tools": TOOLS, "params": host}
    streamed = {**host, "stream": True, "stream_options": {"include_usage": True}}
    assert b["request"] == {"model": "teacher-sim", "messages": MESSAGES, "tools": TOOLS, "params": streamed}
    assert "params_diff" not in a and "params_diff" not in b
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
    # The next turn's set-up does not open it (its server is stopped then); only the backend's run does.
    assert proxy.channel("e2", {"X-Sftree-Edge": "e2"}) is ch and ch.stopped
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


# ---- reply shapes of real servers: OpenCode gets them as sent, the record reads them as the native client does
SHAPES = ["reasoning", "bad_usage", "tool_calls_string", "length_mid_call", "hermes_text", "json_text",
          "function_call", "lone_surrogate"]  # fmt: skip


@pytest.fixture(scope="module")
def shaped():
    url, stop = start_teacher_sim(
        port=0, seed=1, script=[{"match": {"edge": f"s-{k}"}, "fault": k} for k in SHAPES]
    )
    proxy = RecordingProxy(url, retries=0).start()
    yield proxy, url
    proxy.stop()
    stop()


def shaped_reply(proxy, url, shape: str, stream: bool):
    """(bytes OpenCode received, the record, the same reply as the native client reads it)."""
    from sftree.teacher.response import MalformedResponse, normalize

    edge = f"s-{shape}"
    ch = proxy.channel(edge, {"X-Sftree-Edge": edge})
    ch.stopped = ch.cut_call = False  # a new run, as the backend opens one (a cut call stopped the last)
    body = {"model": "teacher-sim", "messages": MESSAGES, "tools": TOOLS, "stream": stream}
    got = post(proxy, edge, body).content
    (rec,) = ch.take()
    direct = requests.post(
        f"{url}/chat/completions", json={**body, "stream": False}, headers={"X-Sftree-Edge": edge}, timeout=30
    )
    try:
        native = normalize(json.loads(direct.text), {"bash", "read", "grep"})
    except MalformedResponse as exc:
        native = exc
    return got, rec, native


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_reply_shapes_are_recorded_as_the_native_client_reads_them(shaped, stream):
    proxy, url = shaped
    for shape in SHAPES[:-1]:  # lone_surrogate: the next test
        got, rec, native = shaped_reply(proxy, url, shape, stream)
        if isinstance(native, Exception):  # unreadable: one failed step, as `native` records it
            assert rec["response"] is None and rec["usage"] is None, (shape, rec)
            assert rec["error"] == f"malformed reply: {native}" and rec["raw_response"], (shape, rec)
            continue
        assert "error" not in rec and rec.get("notes", []) == native.notes, (shape, rec)
        assert rec["finish_reason"] == native.finish_reason
        usage = rec["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
            native.prompt_tokens,
            native.completion_tokens,
        )
    # What each shape means, by hand.
    got, rec, _ = shaped_reply(proxy, url, "bad_usage", stream)
    assert rec["error"] == "malformed reply: usage.prompt_tokens is not a non-negative number: 'many'"
    assert b'"prompt_tokens": "many"' in got  # OpenCode gets the reply as the server sent it
    got, rec, _ = shaped_reply(proxy, url, "tool_calls_string", stream)
    assert rec["error"] == "malformed reply: message.tool_calls is a str, not a list"
    got, rec, _ = shaped_reply(proxy, url, "reasoning", stream)
    assert rec["response"]["reasoning_content"].startswith("I should look at the code")
    got, rec, _ = shaped_reply(proxy, url, "length_mid_call", stream)
    assert rec["notes"] == ["truncated_tool_call"] and rec["finish_reason"] == "length"
    (call,) = rec["response"]["tool_calls"]  # as OpenCode got it: arguments cut, so OpenCode fails the call
    with pytest.raises(ValueError):
        json.loads(call["function"]["arguments"])
    for shape, note in (("hermes_text", "text_tool_calls:hermes"), ("json_text", "text_tool_calls:json"),
                        ("function_call", "legacy_function_call")):  # fmt: skip
        got, rec, _ = shaped_reply(proxy, url, shape, stream)
        # The transcript is OpenCode's session: text it did not run as a call stays text.
        assert rec["notes"] == [note] and "tool_calls" not in rec["response"], (shape, rec)
    got, rec, _ = shaped_reply(proxy, url, "hermes_text", stream)
    assert "<tool_call>" in rec["response"]["content"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_a_lone_surrogate_is_replaced_in_what_opencode_receives(shaped, stream):
    """The one change made to a reply: OpenCode would resend the surrogate in every later request."""
    proxy, url = shaped
    got, rec, native = shaped_reply(proxy, url, "lone_surrogate", stream)
    assert "lone surrogate U+D800" in str(native)  # the native client refuses this reply
    assert b"\\ud800" not in got.lower() and "\ufffd".encode() in got
    assert rec["notes"] == ["lone_surrogate_replaced"] and rec["response"]["content"].endswith("\ufffd")
    json.dumps(rec, ensure_ascii=False).encode("utf-8")  # the record is writable as UTF-8


def test_missing_usage_is_estimated_as_the_native_client_does():
    url, stop = start_teacher_sim(port=0, seed=1, omit_usage=True)
    proxy = RecordingProxy(url, retries=0).start()
    try:
        for stream in (True, False):
            ch = proxy.channel("e1")
            body = {"model": "teacher-sim", "messages": MESSAGES, "tools": TOOLS, "stream": stream}
            post(proxy, "e1", body)
            (rec,) = ch.take()
            # 4 characters per token, over the request as sent and the compact reply message
            prompt = len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()) // 4
            reply = len(
                json.dumps(rec["response"], ensure_ascii=False, sort_keys=True, separators=(",", ":"))
            )
            assert rec["usage"] == {
                "prompt_tokens": prompt,
                "completion_tokens": max(1, reply // 4),
                "cached_tokens": 0,
                "estimated": True,
            }
    finally:
        proxy.stop()
        stop()


def test_a_channel_takes_requests_only_with_its_own_key(proxied):
    """Every sandbox reaches the proxy's port: an edge's Teacher must not post into another edge's transcript."""
    proxy, state = proxied
    mine, other = proxy.channel("k1"), proxy.channel("k2")
    body = {"model": "teacher-sim", "messages": MESSAGES, "tools": TOOLS}
    url = proxy.base_url("k2")
    assert url.startswith(f"http://127.0.0.1:{proxy.port}/c/k2~") and other.key in url and mine.key not in url
    seen = state.requests
    for path in ("/c/k2/v1", f"/c/k2~{mine.key}/v1", "/c/nobody/v1", "/v1"):
        resp = requests.post(f"http://127.0.0.1:{proxy.port}{path}/chat/completions", json=body, timeout=30)
        assert resp.status_code == 403, path
        # a GET too: it would reach the Teacher's other endpoints (slots, metrics) with the proxy's API key
        got = requests.get(f"http://127.0.0.1:{proxy.port}{path}/models", timeout=30)
        assert got.status_code == 403, path
    assert other.take() == [] and mine.take() == [] and state.requests == seen  # nothing reached the Teacher
    assert requests.get(f"{url}/models", timeout=30).status_code == 200
    # a body announced past MAX_BODY is refused unread (the proxy would otherwise wait for and hold it)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as conn:
        conn.sendall(f"POST {url.split(str(proxy.port), 1)[1]}/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     f"Content-Length: {10**12}\r\n\r\n{{}}".encode())  # fmt: skip
        assert conn.recv(4096).split(b"\r\n", 1)[0].split(b" ")[1] == b"413"
    assert state.requests == seen and other.take() == []
    assert requests.post(f"{url}/chat/completions", json=body, timeout=30).status_code == 200
    assert len(other.take()) == 1


def test_the_steps_and_bytes_of_a_turn_are_capped_at_the_proxy():
    """The agent can post to its own channel itself (its key is in OpenCode's config): every request counts
    against the turn's step limit (agent model calls; OpenCode's own calls have a small allowance of their own)
    and its byte cap. Past either, the request is refused unforwarded and the channel says why, so the backend
    ends the turn; the next turn starts from zero."""
    from sftree.agents.proxy import ProxyLimits

    url, stop = start_teacher_sim(port=0, seed=1)
    state = stop.server.state
    proxy = RecordingProxy(
        url, retries=0, limits=ProxyLimits(steps_per_turn=3, bytes_per_turn=1 << 20)
    ).start()
    try:
        ch = proxy.channel("e1", {"X-Sftree-Edge": "e1"})
        body = {"model": "teacher-sim", "messages": MESSAGES, "tools": TOOLS}
        title = {
            "model": "teacher-sim",
            "messages": [{"role": "system", "content": "You are a title generator."}],
        }
        assert [post(proxy, "e1", body).status_code for _ in range(3)] == [200, 200, 200]
        assert post(proxy, "e1", title).status_code == 200  # not an agent step
        assert ch.over_limit is None
        seen = state.requests
        resp = post(proxy, "e1", body)
        assert resp.status_code == 503 and state.requests == seen  # the 4th agent step reached nothing
        assert ch.over_limit.startswith("step_limit") and len(ch.take()) == 4
        assert post(proxy, "e1", title).status_code == 503  # the turn is over: nothing more goes on
        ch.turn = 2  # the backend's next turn
        assert ch.over_limit is None and post(proxy, "e1", body).status_code == 200
        big = {**body, "messages": MESSAGES + [{"role": "user", "content": "x" * (1 << 20)}]}
        assert post(proxy, "e1", big).status_code == 503 and ch.over_limit.startswith("byte_limit")
        assert len(ch.take()) == 1 and state.requests == seen + 1
    finally:
        proxy.stop()
        stop()


def test_the_proxy_applies_teacher_tool_choice_to_agent_requests():
    """`teacher.tool_choice: required` with the OpenCode backend: set on each agent request that offers tools (what
    OpenCode itself sent is replaced), never on a title request, never recorded; `extra_body` keeps the last word."""
    from http.server import BaseHTTPRequestHandler

    from sftree.httpserver import (
        QuietThreadingHTTPServer,
        local_url,
        read_body,
        send_json,
        serve_in_background,
    )

    seen = []

    class Upstream(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            seen.append(json.loads(read_body(self)))
            send_json(self, 200, {"choices": [{"message": {"role": "assistant", "content": "ok"},
                                               "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 1}})  # fmt: skip

    up = QuietThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    serving = serve_in_background(up, "upstream")
    base = local_url(up)
    proxy = RecordingProxy(base, retries=0, tool_choice="required").start()
    auto = RecordingProxy(base, retries=0, tool_choice="auto", extra_body={"top_k": 5}).start()
    try:
        ch = proxy.channel("t1")
        body = {"model": "m", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto"}
        assert post(proxy, "t1", body).status_code == 200
        title = [{"role": "system", "content": "You are a title generator. Write a title."}, MESSAGES[1]]
        assert post(proxy, "t1", {"model": "m", "messages": title}).status_code == 200
        auto.channel("t2")
        assert post(auto, "t2", {"model": "m", "messages": MESSAGES, "tools": TOOLS}).status_code == 200
        assert seen[0]["tool_choice"] == "required"
        assert "tool_choice" not in seen[1] and "tool_choice" not in seen[2] and seen[2]["top_k"] == 5
        # the record keeps what was sent (the Student's prompt and tools are the same either way)
        assert [r["request"]["params"].get("tool_choice") for r in ch.take()] == ["required", None]
    finally:
        proxy.stop()
        auto.stop()
        serving.stop()


def test_a_reply_cut_inside_a_tool_call_stops_the_channel_as_it_is_recorded():
    """agents/turn_end.py `cut_call`: the proxy stops the channel when it records a reply cut at max_tokens inside a
    call, so OpenCode's next request (its `invalid` call carrying the cut arguments) never reaches the Teacher."""
    url, stop = start_teacher_sim(
        port=0, seed=1, script=[{"match": {"edge": "cut"}, "fault": "length_mid_call"}]
    )
    proxy = RecordingProxy(url, retries=0).start()
    try:
        ch = proxy.channel("cut", {"X-Sftree-Edge": "cut"})
        resp = post(proxy, "cut", {"model": "m", "messages": MESSAGES, "tools": TOOLS, "stream": True})
        assert resp.status_code == 200 and resp.text.rstrip().endswith("[DONE]")
        assert ch.cut_call and ch.stopped
        assert post(proxy, "cut", {"model": "m", "messages": MESSAGES, "tools": TOOLS}).status_code == 503
        (rec,) = ch.take()
        assert rec["finish_reason"] == "length" and rec["response"]["tool_calls"]
    finally:
        proxy.stop()
        stop()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_teacher_logprobs_are_asked_for_on_the_way_out_and_kept_in_the_step(stream):
    """`teacher.logprobs: K` with the OpenCode backend: the proxy adds `logprobs`/`top_logprobs` to OpenCode's
    request (teacher/params.py), keeps the reply's sampled tokens in the step record as the native client keeps
    them (aligned with the reply's usage), and relays the reply to OpenCode as the server sent it."""
    from sftree.settings import TeacherSettings, schema_defaults
    from sftree.teacher.params import RequestParams

    url, stop = start_teacher_sim(port=0, seed=3)
    params = RequestParams.from_settings(schema_defaults(TeacherSettings))
    proxy = RecordingProxy(url, retries=1, params=dataclasses.replace(params, logprobs=5)).start()
    try:
        ch = proxy.channel("e1", {"X-Sftree-Edge": "e1"})
        body = {"model": "m", "messages": MESSAGES, "tools": TOOLS}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        resp = post(proxy, "e1", body)
        assert resp.status_code == 200
        (rec,) = ch.take()
    finally:
        proxy.stop()
        stop()
    assert rec["request"]["params"]["logprobs"] is True and rec["request"]["params"]["top_logprobs"] == 5
    assert "params_diff" not in rec  # OpenCode asked for none: the host's fields, not a difference
    lp = rec["logprobs"]
    n = rec["usage"]["completion_tokens"]
    assert lp["k"] == 5 and len(lp["ids"]) == len(lp["logprobs"]) == len(lp["top_ids"]) == n > 0
    assert all(len(t) == 5 for t in lp["top_ids"]) and "logprobs_dropped" not in rec
    # OpenCode receives the server's reply, logprobs and all, unchanged
    if stream:
        pieces = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
        sent = [
            t["id"]
            for p in pieces
            for c in p.get("choices") or []
            for t in (c.get("logprobs") or {}).get("content") or []
        ]
    else:
        sent = [t["id"] for t in resp.json()["choices"][0]["logprobs"]["content"]]
    assert sent == lp["ids"]


def test_without_teacher_logprobs_the_proxy_asks_for_none_and_keeps_none():
    url, stop = start_teacher_sim(port=0, seed=3)
    proxy = RecordingProxy(url, retries=1).start()
    try:
        ch = proxy.channel("e1", {"X-Sftree-Edge": "e1"})
        assert post(proxy, "e1", {"model": "m", "messages": MESSAGES, "tools": TOOLS}).status_code == 200
        (rec,) = ch.take()
    finally:
        proxy.stop()
        stop()
    assert (
        "logprobs" not in rec["request"]["params"] and "logprobs" not in rec and "logprobs_dropped" not in rec
    )
