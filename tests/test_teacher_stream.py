"""Streamed replies, stalled and dying servers, and the fleet watcher, against teacher-sim and small stubs.

`teacher.stream: true`: the completion folded from the chunks equals the non-streamed reply (message, tool calls
and their arguments, finish_reason, usage, notes); a server that stalls (no chunk within the limit), cuts the
stream or reports an error mid-stream is retried; a live stream that is slow is not; behind sglang-router the
watcher abandons the requests with no chunk since a worker went down. The real router and real workers:
tests/test_fleet_*.py.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from sftree.agents.nativetools import TOOL_SCHEMAS
from sftree.httpserver import QuietThreadingHTTPServer, local_url, read_body, serve_in_background
from sftree.records.steplog import usage_from
from sftree.teacher import client as clientmod
from sftree.teacher.client import (
    BadReply,
    ContextOverflow,
    TeacherClient,
    TeacherError,
)
from sftree.teacher.http import InFlight
from sftree.teacher.router_watch import RouterWatcher
from sftree.teacher.sim.server import start_teacher_sim
from sftree.teacher.stream import StreamAssembler

MSGS = [
    {"role": "system", "content": "You are a careful engineer. " * 20},
    {"role": "user", "content": "Go."},
]
SHAPES = [
    "",
    "reasoning",
    "hermes_text",
    "json_text",
    "function_call",
    "length_mid_call",
    "extra_tool_errors",
]
BROKEN = ["tool_calls_string", "lone_surrogate", "bad_usage"]


def client(url, **kw):
    kw = {"retries": 2, "backoff_base": 0.01, "backoff_max": 0.02, "health_timeout": 5, **kw}
    return TeacherClient.from_config({"base_url": url, "model": "default", **kw})


@pytest.fixture
def sims():
    """Start teacher-sim servers on demand (stopped at the end)."""
    stops = []

    def start(**opts):
        url, stop = start_teacher_sim(port=0, **opts)
        stops.append(stop)
        return url, stop.server.state

    yield start
    for stop in stops:
        stop()


def outcome(c: TeacherClient, history: list[dict]):
    try:
        comp = c.chat(history, TOOL_SCHEMAS, headers={"X-Sftree-Edge": "e1", "X-Sftree-Turn": "1"})
    except BadReply as exc:
        return ("bad_reply", str(exc))
    return (comp.message, comp.finish_reason, usage_from(comp.usage), comp.notes, comp.truncated_calls)


@pytest.mark.parametrize("shape", SHAPES + BROKEN + ["omit_usage"])
def test_streamed_reply_is_the_non_streamed_reply(sims, shape):
    """Two servers with the same seed, one asked to stream, one not: every reply of a session of 4 steps is the
    same after normalisation (message with tool calls and arguments, finish_reason, usage, notes)."""
    opts = {"omit_usage": True} if shape == "omit_usage" else {"fault_rate": {shape: 1.0}} if shape else {}
    (u1, _), (u2, _) = sims(**opts), sims(**opts)
    streamed, plain = client(u1, stream=True), client(u2, stream=False)
    assert streamed.request_body(MSGS, TOOL_SCHEMAS)["stream"] is True
    assert "stream" not in plain.request_body(MSGS, TOOL_SCHEMAS)
    history = list(MSGS)
    for _ in range(4):
        a, b = outcome(streamed, history), outcome(plain, history)
        assert a == b
        if a[0] == "bad_reply":
            assert shape in BROKEN
            return
        history = [*history, a[0], *({"role": "tool", "tool_call_id": tc["id"], "content": "ok"}
                                     for tc in a[0].get("tool_calls", []))]  # fmt: skip
    assert shape not in BROKEN
    assert streamed.stats["failed_attempts"] == 0 and streamed.stats["requests"] == 4


def test_assembler_keeps_missing_call_ids_missing_for_the_client():
    asm = StreamAssembler()
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "read",
             "arguments": '{"filePath": "a"}'}}]}, "finish_reason": "tool_calls"}]}  # fmt: skip
    asm.feed(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
    assert asm.done and asm.chunks == 1
    assert "id" not in asm.completion(fill_ids=False)["choices"][0]["message"]["tool_calls"][0]
    assert (
        asm.completion()["choices"][0]["message"]["tool_calls"][0]["id"] == "call_0"
    )  # the proxy's, as before


def test_a_stream_that_stalls_mid_reply_is_sent_again(sims):
    url, state = sims(script=[{"match": {"edge": "e1"}, "fault": "stall", "count": 1, "hang_s": 30}])
    c = client(url, stall_timeout=0.5)
    t0 = time.monotonic()
    comp = c.chat(MSGS, TOOL_SCHEMAS, headers={"X-Sftree-Edge": "e1", "X-Sftree-Turn": "2"})
    assert time.monotonic() - t0 < 10 and comp.attempts == 2 and comp.message["tool_calls"]
    assert c.stats["stalls"] == 1 and c.stats["retries"] == 1 and state.requests == 2
    (inc,) = c.stats["incidents"]
    assert inc["kind"] == "stall" and inc["label"] == "e1 turn 2" and inc["attempt"] == 1
    assert 0.4 < inc["waited_s"] < 10 and "no chunk for 0.5s after 2 chunks" in inc["detail"]


def test_no_first_chunk_in_time_is_a_stall(sims):
    url, _ = sims(script=[{"match": {}, "fault": "hang", "count": 1, "hang_s": 30}])
    c = client(url, first_chunk_timeout=0.5)
    comp = c.chat(MSGS, TOOL_SCHEMAS)
    assert comp.attempts == 2 and c.stats["stalls"] == 1
    assert c.stats["incidents"][0]["detail"] == "no reply within 0.5s"


def test_a_cut_stream_or_connection_is_sent_again(sims):
    url, _ = sims(script=[{"match": {}, "fault": "cut", "count": 1}])
    c = client(url, stall_timeout=30)
    assert c.chat(MSGS, TOOL_SCHEMAS).attempts == 2
    assert c.stats["cut_streams"] == 1 and c.stats["incidents"][0]["waited_s"] < 5
    url2, _ = sims(script=[{"match": {}, "fault": "cut", "count": 1}])
    plain = client(url2, stream=False)
    assert plain.chat(MSGS, TOOL_SCHEMAS).attempts == 2  # killed before answering: a connection error
    assert plain.stats["incidents"][0]["kind"] == "connection"


def test_a_slow_live_stream_is_not_a_stall(sims):
    url, _ = sims(chunk_ms=150)
    c = client(url, stall_timeout=0.6)
    t0 = time.monotonic()
    comp = c.chat(MSGS, TOOL_SCHEMAS)
    assert comp.attempts == 1 and time.monotonic() - t0 > 0.6 and c.stats["failed_attempts"] == 0


def test_request_timeout_bounds_a_trickling_stream(sims):
    url, _ = sims(chunk_ms=200)
    c = client(url, stall_timeout=10, request_timeout=0.5, retries=1)
    with pytest.raises(TeacherError, match="failed 2 times; last error: stall: reply not complete within"):
        c.chat(MSGS, TOOL_SCHEMAS)
    assert c.stats["stalls"] == 2


def test_a_worker_down_at_the_router_abandons_the_requests_waiting_on_it(sims, monkeypatch):
    """A request with no chunk since the router reported a worker down is abandoned FLEET_GRACE s later and sent
    again at once (no backoff); one whose chunks keep coming is left alone."""
    monkeypatch.setattr(clientmod, "FLEET_GRACE", 0.3)
    url, _ = sims(script=[{"match": {"edge": "e1"}, "fault": "hang", "count": 1, "hang_s": 30}])
    c = client(url, first_chunk_timeout=60, backoff_base=5, backoff_max=5)
    out = {}
    th = threading.Thread(
        target=lambda: out.update(comp=c.chat(MSGS, TOOL_SCHEMAS, headers={"X-Sftree-Edge": "e1"}))
    )
    th.start()
    time.sleep(0.5)
    live = InFlight(
        time.monotonic() - 10, time.monotonic() + 60, "e7 turn 1"
    )  # a chunk will come after the event
    c._inflight.add(live)
    t0 = time.monotonic()
    c._worker_changed("http://w1", False, {"http://w1": False, "http://w2": True})
    th.join(10)
    assert not th.is_alive() and time.monotonic() - t0 < 4  # no 5 s backoff after a worker went down
    assert out["comp"].attempts == 2 and live.aborted is None
    (inc,) = c.stats["incidents"]
    assert inc["kind"] == "worker_down" and "worker http://w1 went down" in inc["detail"]
    assert c.stats["worker_down_aborts"] == 1
    assert c.stats["worker_events"][0]["worker"] == "http://w1" and not c.stats["worker_events"][0]["healthy"]
    rep = c.report()
    assert rep["stream"] and rep["worker_down_aborts"] == 1 and rep["incidents"] == c.stats["incidents"]


def test_fleet_watcher_reports_each_change():
    seen = []
    w = RouterWatcher(lambda: None, 1, lambda url, ok, view: seen.append((url, ok)), {"a": True, "b": True})
    w.check({"a": False, "b": True})  # a down
    w.check({"a": False, "b": True})  # nothing new
    w.check({"a": True, "b": True, "c": False})  # a back; c joins unhealthy: nothing routed to it
    w.check({"a": True, "c": True})  # b left the router; c healthy
    assert seen == [("a", False), ("a", True), ("b", False), ("c", True)]


class Stub(BaseHTTPRequestHandler):
    """A scripted server: `routes` maps a path to (status, content type, body or a list of SSE data values)."""

    protocol_version = "HTTP/1.1"
    routes: dict = {}
    calls: list = []

    def log_message(self, *a):
        pass

    def _answer(self):
        path = self.path.split("?")[0]
        self.calls.append(path)
        answers = self.routes[path]
        status, ctype, body = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(body, list):
            body = "".join(f"data: {x if isinstance(x, str) else json.dumps(x)}\n\n" for x in body)
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._answer()

    def do_POST(self):
        read_body(self)
        self._answer()


@pytest.fixture
def stub():
    def start(routes):
        handler = type("S", (Stub,), {"routes": routes, "calls": []})
        srv = QuietThreadingHTTPServer(("127.0.0.1", 0), handler)
        servers.append(serve_in_background(srv, "stub"))
        return local_url(srv), handler

    servers = []
    yield start
    for s in servers:
        s.stop()


JSON, SSE = "application/json", "text/event-stream"
DONE_CHUNKS = [
    {
        "id": "x",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}],
    },
    {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}},
    "[DONE]",
]


def test_behind_a_router_ready_waits_for_a_healthy_worker_and_copes_with_model_unknown(stub):
    """sglang-router: /health `OK` (text), /v1/models lists `unknown`, /workers none healthy at first."""
    workers = lambda ok: {"workers": [{"url": "http://w1", "is_healthy": ok}], "total": 1}  # noqa: E731
    url, h = stub({
        "/health": [(200, "text/plain", "OK")],
        "/v1/models": [(200, JSON, {"object": "list", "data": [{"id": "unknown", "object": "model"}]})],
        "/workers": [(200, JSON, workers(False)), (200, JSON, workers(True))],
        "/v1/chat/completions": [(200, SSE, DONE_CHUNKS)],
    })  # fmt: skip
    c = client(url, fleet_poll=30)
    c.wait_ready()
    try:
        assert h.calls.count("/workers") == 2 and c.fleet is not None and c.report()["router"]
        comp = c.chat(MSGS)
        assert comp.message["content"] == "hi" and comp.usage.prompt_tokens == 5
    finally:
        c.close()
    assert c.fleet is None


def test_a_plain_server_has_no_fleet_watcher(sims):
    url, _ = sims()
    c = client(url)
    c.wait_ready()
    assert c.fleet is None and not c.report()["router"]


def test_an_error_in_the_stream_is_retried_and_an_overflow_ends_the_turn(stub):
    err = [{"error": {"message": "worker gone", "code": 502}}]
    url, h = stub({"/v1/chat/completions": [(200, SSE, err), (200, SSE, DONE_CHUNKS)]})
    c = client(url)
    assert c.chat(MSGS).attempts == 2 and c.stats["incidents"][0]["kind"] == "stream_error"
    big = [
        {
            "error": {
                "message": "The input (9000 tokens) is longer than the model's context length (8192 tokens)."
            }
        }
    ]
    url2, _ = stub({"/v1/chat/completions": [(200, SSE, big)]})
    with pytest.raises(ContextOverflow):
        client(url2).chat(MSGS)


def test_a_server_that_ignores_stream_answers_json(stub):
    plain = {"id": "y", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
             "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}  # fmt: skip
    url, _ = stub({"/v1/chat/completions": [(200, JSON, plain)]})
    comp = client(url).chat(MSGS)
    assert comp.message["content"] == "ok" and comp.finish_reason == "stop"


def test_a_stream_without_an_end_is_cut_and_one_of_garbage_is_a_bad_reply(stub):
    url, _ = stub({"/v1/chat/completions": [(200, SSE, DONE_CHUNKS[:1]), (200, SSE, DONE_CHUNKS)]})
    c = client(url)
    assert c.chat(MSGS).attempts == 2 and c.stats["cut_streams"] == 1
    url2, _ = stub({"/v1/chat/completions": [(200, SSE, "not json at all\n\n")]})
    with pytest.raises(TeacherError):  # no data line at all: the stream never started, retried, then given up
        client(url2, retries=1).chat(MSGS)


def test_a_tree_whose_requests_stall_and_are_cut_finishes_with_each_step_once(tmp_path):
    """A whole `sftree explore` against teacher-sim: e2's first request stalls mid-reply, e3's is cut; both are
    sent again, the tree finishes, every turn's steps are recorded once (1..n), and tree.json `teacher`, the
    explore log and the report's Teacher line say what happened."""
    import yaml
    from helpers.explore import explore, load_final, make_root, write_config

    from sftree.records import steplog
    from sftree.report.html import teacher_section

    root = make_root(tmp_path)
    script = [{"match": {"edge": "e2"}, "fault": "stall", "count": 1, "hang_s": 20},
              {"match": {"edge": "e3"}, "fault": "cut", "count": 1}]  # fmt: skip
    search = {
        "root_children": 3,
        "max_children": 1,
        "max_depth": 1,
        "parallel_width": 3,
        "max_valid_edges": 3,
    }
    cfg = write_config(tmp_path, search, script=script)
    data = yaml.safe_load(cfg.read_text())
    data["teacher"].update(stall_timeout=0.5, retries=3)
    cfg.write_text(yaml.safe_dump(data))
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 0
    tree = load_final(out)
    t = tree.teacher
    assert t["stalls"] == 1 and t["cut_streams"] == 1 and t["failed_attempts"] == 2 and t["retries"] == 2
    assert {(i["kind"], i["label"].split()[0]) for i in t["incidents"]} == {("stall", "e2"), ("cut", "e3")}
    answered = 0
    for e in tree.edges:
        steps = steplog.read_steps(out / "edges" / e.id / "steps.jsonl")
        for turn in e.turns:
            assert [s["step"] for s in steps if s["turn"] == turn.turn] == list(range(1, turn.steps + 1))
        answered += sum(1 for s in steps if s["response"] is not None)
    assert t["requests"] == answered  # each answered step is one request, the abandoned attempts are not
    log = (out / "explore.log").read_text()
    assert (
        "teacher request e2 turn 1: stall: no chunk for 0.5s" in log
        and "teacher request e3 turn 1: cut:" in log
    )
    line = teacher_section(t)
    assert "2 attempt(s) sent again: 1 stalled, 1 cut, 0 abandoned when a worker went down" in line


# A stream that answers nothing: every chunk carries `"choices": []` (some servers send usage that way), then
# [DONE]. No choice came, so there is no message: not an empty assistant message to train.
EMPTY_CHOICES = [
    {"id": "z", "choices": []},
    {"id": "z", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 0}},
    "[DONE]",
]


def test_a_stream_with_no_choice_is_a_malformed_reply_for_the_client(stub):
    """The client's reader: a bad reply (a failed step, the next step sends it again), never a message."""
    url, _ = stub({"/v1/chat/completions": [(200, SSE, EMPTY_CHOICES)]})
    with pytest.raises(BadReply, match="choices"):
        client(url).chat(MSGS)


def test_a_stream_with_no_choice_is_a_malformed_reply_for_the_proxy():
    """The OpenCode proxy's reader (the same assembler): the step is recorded failed, `response: null`."""
    from sftree.agents.proxy import reply_fields

    asm = StreamAssembler()
    for chunk in EMPTY_CHOICES:
        asm.feed(f"data: {chunk if isinstance(chunk, str) else json.dumps(chunk)}\n\n".encode())
    fields = reply_fields({"messages": MSGS}, asm.completion(), asm.message())
    assert fields["response"] is None and "malformed reply" in str(fields.get("error")), fields
