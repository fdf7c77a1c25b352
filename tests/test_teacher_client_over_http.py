"""The Teacher client against teacher-sim over HTTP: readiness, retries, usage, prefix cache, streaming."""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests

from sftree.agents.nativetools import TOOL_SCHEMAS
from sftree.errors import InputError, TeacherUnavailable
from sftree.records.steplog import usage_from
from sftree.teacher.client import TeacherClient, TeacherError, Usage, backoff_delay, reported_usage, serialize
from sftree.teacher.sim.policy import decide, nudge_value
from sftree.teacher.sim.server import load_script, start_teacher_sim

MSGS = [{"role": "user", "content": "Improve the score. " * 50}]


@pytest.fixture
def sim(request):
    opts = getattr(request, "param", {})
    url, stop = start_teacher_sim(port=0, **opts)
    yield url, stop.server.state
    stop()


def client(url, **kw):
    kw = {"retries": 2, "backoff_base": 0.01, "backoff_max": 0.02, "health_timeout": 2, **kw}
    return TeacherClient.from_config({"base_url": url, "model": "default", **kw})


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_teacher_names_url_and_sglang():
    url = f"http://127.0.0.1:{free_port()}/v1"
    t0 = time.monotonic()
    with pytest.raises(TeacherUnavailable) as exc:
        client(url, health_timeout=0.5).wait_ready()
    msg = str(exc.value)
    assert url.removesuffix("/v1") in msg and "sglang.launch_server" in msg
    assert time.monotonic() - t0 < 5


def test_ready_then_chat_with_usage_and_prefix_cache(sim):
    url, state = sim
    c = client(url)
    c.wait_ready()
    first = c.chat(MSGS, TOOL_SCHEMAS, headers={"X-Sftree-Edge": "e1"})
    assert first.message["role"] == "assistant" and first.message["tool_calls"]
    assert first.usage.cached_tokens == 0 and first.usage.prompt_tokens > 200
    # the expected prompt tokens: the sim's own count, (tools + messages JSON) // 4
    chars = len(json.dumps(TOOL_SCHEMAS, sort_keys=True)) + len(json.dumps(MSGS[0], sort_keys=True))
    assert first.usage.prompt_tokens == chars // 4
    longer = MSGS + [first.message, {"role": "tool", "tool_call_id": "call_0", "content": "ok"}]
    second = c.chat(longer, TOOL_SCHEMAS)
    assert second.usage.cached_tokens == first.usage.prompt_tokens  # the whole first request is a prefix
    assert (
        c.stats["requests"] == 2
        and c.stats["cached_tokens"] == first.usage.cached_tokens + second.usage.cached_tokens
    )


def test_serialization_is_byte_identical():
    a = {"model": "m", "messages": [{"role": "user", "content": "é"}], "tools": TOOL_SCHEMAS}
    b = json.loads(json.dumps(a))
    assert serialize(a) == serialize(b) and b"\\u00e9" not in serialize(a)


@pytest.mark.parametrize("sim", [{"script": [{"match": {}, "fault": "http_503", "count": 2}]}], indirect=True)
def test_retries_transient_errors(sim):
    url, state = sim
    c = client(url, retries=3)
    comp = c.chat(MSGS, TOOL_SCHEMAS)
    assert comp.attempts == 3 and c.stats["retries"] == 2 and state.requests == 3


@pytest.mark.parametrize("sim", [{"script": [{"match": {}, "fault": "http_500"}]}], indirect=True)
def test_gives_up_after_retry_budget(sim):
    url, state = sim
    with pytest.raises(TeacherError, match="failed 3 times.*HTTP 500"):
        client(url, retries=2).chat(MSGS, TOOL_SCHEMAS)
    assert state.requests == 3


@pytest.mark.parametrize(
    "sim",
    [{"script": [{"match": {"edge": "e9"}, "fault": "hang", "hang_s": 1.5, "count": 1}]}],
    indirect=True,
)
def test_hang_times_out_then_retry_succeeds(sim):
    url, _ = sim
    comp = client(url, request_timeout=0.3).chat(MSGS, TOOL_SCHEMAS, headers={"X-Sftree-Edge": "e9"})
    assert comp.attempts == 2


def test_backoff_is_capped_exponential():
    assert [backoff_delay(i, 0.5, 3) for i in range(5)] == [0.5, 1.0, 2.0, 3, 3]


def test_streaming_matches_non_streaming(sim):
    url, _ = sim
    body = {
        "model": "x",
        "messages": MSGS,
        "tools": TOOL_SCHEMAS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = requests.post(
        f"{url}/chat/completions", json=body, headers={"X-Sftree-Edge": "e1"}, stream=True, timeout=10
    )
    chunks = [
        json.loads(line[6:])
        for line in r.iter_lines(decode_unicode=True)
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    content, args, name, finish = "", "", None, None
    for ch in chunks:
        for choice in ch["choices"]:
            d = choice["delta"]
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                name = tc.get("function", {}).get("name") or name
                args += tc.get("function", {}).get("arguments") or ""
            finish = choice["finish_reason"] or finish
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] > 0
    plain = client(url).chat(MSGS, TOOL_SCHEMAS, headers={"X-Sftree-Edge": "e1"}).message
    assert content == plain["content"] and name == plain["tool_calls"][0]["function"]["name"]
    assert (
        json.loads(args) == json.loads(plain["tool_calls"][0]["function"]["arguments"])
        and finish == "tool_calls"
    )


def test_policy_is_deterministic_and_edge_dependent():
    a = [decide(MSGS, seed=1, edge=f"e{i}")["tool_calls"][0]["function"]["arguments"] for i in range(12)]
    b = [decide(MSGS, seed=1, edge=f"e{i}")["tool_calls"][0]["function"]["arguments"] for i in range(12)]
    assert a == b and len(set(a)) > 1  # same request -> same answer; forks differ
    assert "tool_calls" not in decide(MSGS, faults=frozenset({"no_eval"}))
    bad = decide(MSGS, faults=frozenset({"malformed_args"}))["tool_calls"][0]["function"]["arguments"]
    with pytest.raises(ValueError):
        json.loads(bad)
    padded = decide(MSGS, pad_tokens=1000)
    assert 3900 <= len(padded["content"]) <= 4100


def test_nudge_value_keeps_kind():
    import random

    rng = random.Random(0)
    for _ in range(50):
        assert int(nudge_value("4", rng)) >= 1
        v = nudge_value("0.95", rng)
        assert "." in v and 0.95 * 0.79 < float(v) < 0.95 * 1.21


def test_bad_script_is_an_input_error(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("- match: {edge: e1}\n  fault: explode\n")
    with pytest.raises(InputError, match="unknown fault 'explode'"):
        load_script(p)
    p.write_text("- match: {colour: red}\n")
    with pytest.raises(InputError, match="match keys"):
        load_script(p)


@pytest.mark.parametrize("sim", [{"fault_rate": "http_503=0.5", "seed": 4}], indirect=True)
def test_random_faults_are_retried(sim):
    url, state = sim
    c = client(url, retries=8)
    for i in range(6):
        c.chat([{"role": "user", "content": f"task {i}"}], TOOL_SCHEMAS)
    assert c.stats["requests"] == 6 and state.requests == 6 + c.stats["retries"] and c.stats["retries"] > 0


def test_cli_serves_until_stopped():
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "sftree", "teacher-sim", "--port", "0", "--seed", "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        url = line.split("serving on ")[1].split()[0]
        assert requests.get(url.removesuffix("/v1") + "/health", timeout=5).status_code == 200
        assert requests.get(url + "/models", timeout=5).json()["data"][0]["id"] == "teacher-sim"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("sim", [{"omit_usage": True}], indirect=True)
def test_no_usage_is_estimated_from_text_and_warned_once(sim, caplog):
    url, _ = sim
    c = client(url)
    raw = requests.post(f"{url}/chat/completions", json={"messages": MSGS}, timeout=10).json()
    assert "usage" not in raw and raw["choices"][0]["message"]  # the server really reports none
    with caplog.at_level("WARNING", logger="sftree.teacher.client"):
        first = c.chat(MSGS, TOOL_SCHEMAS)
        second = c.chat(MSGS + [first.message, {"role": "user", "content": "again"}], TOOL_SCHEMAS)
    # counted on the request as it is without `stream` (the same estimate streamed or not)
    body = serialize(
        {k: v for k, v in c.request_body(MSGS, TOOL_SCHEMAS).items() if not k.startswith("stream")}
    )
    reply = json.dumps(first.message, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    assert first.usage.estimated and first.usage.prompt_tokens == len(body.decode()) // 4
    assert first.usage.completion_tokens == len(reply) // 4 and first.usage.cached_tokens == 0
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens // 2
    assert usage_from(first.usage)["estimated"] is True
    warnings = [r for r in caplog.records if "reports no token usage" in r.getMessage()]
    assert len(warnings) == 1 and url in warnings[0].getMessage()
    assert c.stats["prompt_tokens"] == first.usage.prompt_tokens + second.usage.prompt_tokens


def test_reported_usage_is_not_estimated(sim):
    url, _ = sim
    comp = client(url).chat(MSGS, TOOL_SCHEMAS)
    assert not comp.usage.estimated and "estimated" not in usage_from(comp.usage)
    # zero is a real report (a cached-only reply), not a missing one
    assert reported_usage({"usage": {"prompt_tokens": 0, "completion_tokens": 0}}) == Usage(0, 0, 0)
    assert reported_usage({"usage": {"completion_tokens": 3}}) is None and reported_usage({}) is None


@pytest.mark.parametrize("sim", [{"omit_usage": True}], indirect=True)
def test_stream_without_usage_chunk(sim):
    url, _ = sim
    r = requests.post(f"{url}/chat/completions", json={"messages": MSGS, "stream": True}, timeout=10)
    chunks = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
    assert chunks and not any("usage" in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"]


def test_proxy_records_an_estimate_when_the_reply_has_no_usage():
    from sftree.agents.proxy import estimated_usage_record, usage_record

    body = {"model": "m", "messages": MSGS}
    msg = {"role": "assistant", "content": "x" * 400}
    assert usage_record(None) is None and usage_record({"completion_tokens": 2}) is None
    rec = estimated_usage_record(body, msg)
    assert rec["estimated"] is True and rec["prompt_tokens"] == len(serialize(body)) // 4
    assert rec["completion_tokens"] == len(json.dumps(msg, separators=(",", ":"))) // 4
    assert estimated_usage_record(body, None) is None  # no reply: nothing to count
