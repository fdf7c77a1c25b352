"""The recording proxy against a hostile Teacher (issues #31 item 3, #32 items 4 and 5).

The agent can read its own channel's key (it is in OpenCode's config in its sandbox) and reach the proxy's port,
so each test talks HTTP to a real RecordingProxy as the agent's `curl` would: other paths and methods with the
Teacher's API key, a wrong key with a 40 MiB body, six 40 MiB bodies at once on its own channel, a body sent a
byte at a time. The memory tests run the proxy in a process of its own (proxy_server.py) and read its peak RSS.
"""

from __future__ import annotations

import http.client
import json
import logging
import select
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from sftree.agents.proxy import ProxyLimits, RecordingProxy
from sftree.httpserver import QuietThreadingHTTPServer, local_url, read_body, send_json, serve_in_background
from sftree.teacher.sim.server import start_teacher_sim

MiB = 1 << 20
TOOLS = [
    {
        "type": "function",
        "function": {"name": "bash", "description": "bash", "parameters": {"type": "object"}},
    }
]
SMALL = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
COMPLETION = {
    "id": "x",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}


class Recorder:
    """A stand-in Teacher server that records every request that reaches it (method, path) and answers each
    with a completion (and `/v1/models` with the Teacher's real name); `hold` keeps requests waiting."""

    SECRET = "secret-teacher-name"

    def __init__(self):
        self.seen: list[tuple[str, str]] = []
        self.hold = threading.Event()
        self.hold.set()
        rec = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _any(self):
                rec.seen.append((self.command, self.path))
                read_body(self)
                rec.hold.wait(30)
                if self.path.endswith("/models"):
                    return send_json(self, 200, {"object": "list", "data": [{"id": rec.SECRET}]})
                send_json(self, 200, COMPLETION)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = _any

        self.server = QuietThreadingHTTPServer(("127.0.0.1", 0), H)
        self.serving = serve_in_background(self.server, "hostile-upstream")
        self.url = local_url(self.server)

    def close(self):
        self.serving.stop()


@pytest.fixture
def recorder():
    r = Recorder()
    yield r
    r.hold.set()
    r.close()


def settled(proxy: RecordingProxy) -> bool:
    """Whether every request's place is given back (that happens just after its answer is written)."""
    deadline = time.monotonic() + 5
    while proxy.inflight and time.monotonic() < deadline:
        time.sleep(0.01)
    return proxy.inflight == 0 and proxy.inflight_bytes == 0


def request(port: int, method: str, target: str, body: bytes | None = None) -> int:
    """The status of one request sent with exactly this request target (no client-side normalisation)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", "x")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body or b"")))
        conn.endheaders(body or b"")
        return conn.getresponse().status
    finally:
        conn.close()


# ---- #31 item 3: only POST <channel>/v1/chat/completions reaches the Teacher ---------------------------------
HOSTILE = [
    ("POST", "{c}/v1/../../flush_cache"),
    ("POST", "{c}/v1/../../release_memory_occupation"),
    ("GET", "{c}/v1/../../get_server_info"),
    ("POST", "{c}/v1/%2e%2e/%2e%2e/flush_cache"),
    ("POST", "{c}/v1/%2E%2E%2F%2E%2E%2Fflush_cache"),
    ("POST", "{c}/v1/%252e%252e/%252e%252e/flush_cache"),
    ("POST", "{c}/v1/chat/completions/../../../flush_cache"),
    ("POST", "{c}/v1/chat/completions/..%2F..%2F..%2Fflush_cache"),
    ("POST", "{c}/v1/chat/completions?x=/../../flush_cache"),
    ("POST", "{c}/v1/chat/completions#/../../flush_cache"),
    ("POST", "{c}/v1/chat/completions/"),
    ("POST", "{c}/v1//chat/completions"),
    ("POST", "{c}/v1/./chat/completions"),
    ("POST", "{c}//v1/chat/completions"),
    ("POST", "{c}/v1/chat\\..\\..\\flush_cache"),
    ("POST", "{c}/v1/completions"),
    ("POST", "{c}/v1/embeddings"),
    ("POST", "{c}/../../flush_cache"),
    ("POST", "{c}/v1/../../v1/chat/completions"),
    ("POST", "http://127.0.0.1{c}/v1/chat/completions"),
    ("GET", "{c}/v1/chat/completions"),
    ("GET", "{c}/v1/models/../../get_server_info"),
    ("GET", "{c}/v1/../health"),
    ("GET", "{c}/v1/../metrics"),
    ("GET", "{c}/v1/models?x=1"),
    ("PUT", "{c}/v1/chat/completions"),
    ("DELETE", "{c}/v1/chat/completions"),
    ("PATCH", "{c}/v1/chat/completions"),
    ("OPTIONS", "{c}/v1/chat/completions"),
    ("HEAD", "{c}/v1/models"),
    ("BREW", "{c}/v1/chat/completions"),
]


def test_only_post_chat_completions_reaches_the_teacher(recorder, caplog):
    proxy = RecordingProxy(recorder.url, retries=0).start()
    try:
        ch = proxy.channel("e1", {"X-Sftree-Edge": "e1"})
        c = f"/c/e1~{ch.key}"
        body = json.dumps(SMALL).encode()
        with caplog.at_level(logging.WARNING, logger="sftree.agents.proxy"):
            for i, (method, path) in enumerate(HOSTILE, 1):
                status = request(proxy.port, method, path.format(c=c), body)
                assert status == 403, (method, path, status)
                assert recorder.seen == [], (method, path, recorder.seen)  # nothing reached the Teacher
                assert sum(proxy.refused.values()) == i, (method, path)  # each counted
        # counted on the channel, but the absolute-form target, which names no channel
        assert ch.refused == {"path": len(HOSTILE) - 1} and proxy.refused["key"] == 1
        assert ch.take() == []
        warned = [r for r in caplog.records if "edge e1" in r.getMessage()]
        assert len(warned) == 1, [r.getMessage() for r in caplog.records]  # one warning per channel
        # The one route: forwarded to the Teacher's chat completions, nowhere else.
        assert request(proxy.port, "POST", f"{c}/v1/chat/completions", body) == 200
        assert recorder.seen == [("POST", "/v1/chat/completions")] and len(ch.take()) == 1
    finally:
        proxy.stop()


def test_models_through_a_channel_names_the_student_only(recorder):
    """OpenCode asks for the Student's id; the Teacher's real name must reach no prompt and no record."""
    proxy = RecordingProxy(recorder.url, retries=0, model=Recorder.SECRET, student_model="gpt-5").start()
    try:
        ch = proxy.channel("e1")
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        conn.request("GET", f"/c/e1~{ch.key}/v1/models")
        resp = conn.getresponse()
        text = resp.read().decode()
        conn.close()
        assert resp.status == 200, text
        assert [m["id"] for m in json.loads(text)["data"]] == ["gpt-5"]
        assert Recorder.SECRET not in text and recorder.seen == []
    finally:
        proxy.stop()


# ---- #32 items 4 and 5: a wrong key, big bodies, many at once, a slow drip ------------------------------------
def big_body(size: int) -> bytes:
    head = json.dumps({"model": "gpt-5", "messages": [{"role": "user", "content": ""}], "tools": TOOLS})
    head, tail = head.split('"content": ""', 1)
    pad = size - len(head) - len(tail) - len('"content": ""')
    return (head + '"content": "' + "x" * pad + '"' + tail).encode()


def send_big(port: int, target: str, body: bytes, piece: int = MiB) -> dict:
    """POST `body` in pieces, watching for an answer between pieces: (status, bytes sent when it came)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    view = memoryview(body)
    head = f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    sent, early = 0, None
    try:
        s.sendall(head.encode())
        while sent < len(body):
            if select.select([s], [], [], 0)[0]:
                early = sent  # the proxy answered before the body was all sent
                break
            s.sendall(view[sent : sent + piece])
            sent += len(view[sent : sent + piece])
    except OSError:
        early = sent  # it closed the connection on us: the rest of the body was never read
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    s.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else None
    return {"status": status, "early": early}


class ProxyProcess:
    def __init__(self, upstream: str, **cfg):
        self.p = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("proxy_server.py")), json.dumps({"upstream": upstream, **cfg})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        info = json.loads(self.p.stdout.readline())
        self.port = info["port"]
        self.channel = info["url"].split(str(self.port), 1)[1]  # /c/e1~<key>/v1

    def ask(self, cmd: str) -> dict:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


@pytest.fixture
def proxy_process():
    made = []

    def make(upstream, **cfg):
        pp = ProxyProcess(upstream, **cfg)
        made.append(pp)
        return pp

    yield make
    for pp in made:
        pp.close()


def warm(pp: ProxyProcess) -> int:
    """One small request through the proxy (threads, sockets, imports set up), then the peak starts again."""
    assert request(pp.port, "POST", f"{pp.channel}/chat/completions", json.dumps(SMALL).encode()) == 200
    return pp.ask("reset_peak")["VmHWM"]


def test_a_wrong_key_gets_403_before_its_body_is_read(recorder, proxy_process):
    pp = proxy_process(recorder.url)
    base = warm(pp)
    recorder.seen.clear()
    body = big_body(40 * MiB)
    wrong = pp.channel.replace("~", "~0")  # the edge's name with a key that is not its own
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda _: send_big(pp.port, f"{wrong}/chat/completions", body), range(6)))
    state = pp.ask("state")
    growth = (state["VmHWM"] - base) / 1024
    print(f"wrong key, 6 x 40 MiB: proxy peak RSS +{growth:.1f} MiB; answers {got}")
    for g in got:
        # answered (or cut) while most of the body was still on the client's side: it was never read
        assert g["early"] is not None and g["early"] < 40 * MiB, got
        assert g["status"] in (403, None), got
    assert any(g["status"] == 403 for g in got), got
    assert growth < 16, f"the proxy's peak RSS grew by {growth:.1f} MiB"
    assert recorder.seen == [] and state["records"] == 1  # the warm-up's, nothing of these
    assert state["refused"].get("key") == 6, state


def test_big_bodies_on_the_own_channel_are_capped(proxy_process):
    """Six 40 MiB requests at once with the edge's own key: at most what the caps allow is read, held and
    recorded; the rest is refused unread; the turn is over its byte cap and the channel says so."""
    url, stop = start_teacher_sim(port=0, seed=1)
    try:
        # `model`: the body is re-encoded with the Teacher's name, as in a real run
        pp = proxy_process(url, model="teacher-sim", student="gpt-5", limits={"bytes_per_turn": 50 * MiB})
        base = warm(pp)
        state0 = stop.server.state.requests
        body = big_body(40 * MiB)
        with ThreadPoolExecutor(6) as pool:
            got = list(
                pool.map(lambda _: send_big(pp.port, f"{pp.channel}/chat/completions", body), range(6))
            )
        more = send_big(pp.port, f"{pp.channel}/chat/completions", body)
        state = pp.ask("state")
    finally:
        stop()
    growth = (state["VmHWM"] - base) / 1024
    print(f"own channel, 6 x 40 MiB at once then 1: proxy peak RSS +{growth:.1f} MiB; answers {got} {more}")
    ok = [g for g in got if g["status"] == 200]
    assert len(ok) == 1, got  # one 40 MiB body in flight per channel; the next ones are past the turn's cap
    for g in got:
        if g["status"] != 200:
            assert g["early"] is not None and g["early"] < 40 * MiB, got  # refused unread
    assert more["status"] == 503 and more["early"] is not None, more
    assert state["over_limit"] and state["over_limit"].startswith("byte_limit"), state
    assert stop.server.state.requests - state0 == 1  # only the admitted one reached the Teacher
    assert state["records"] == 2 and state["record_bytes"] < 51 * MiB  # the warm-up's and the admitted one
    # Held: the admitted body (read, parsed, sent on, recorded); nothing of the other six.
    assert growth < 4 * 40, f"the proxy's peak RSS grew by {growth:.1f} MiB"


def test_big_bodies_at_once_are_refused_past_the_caps_in_flight(recorder, proxy_process):
    """Six 40 MiB requests at once with the edge's own key while the Teacher answers slowly, default caps: one
    body is in flight, the other five get 429 unread."""
    pp = proxy_process(recorder.url, model="teacher-real", student="gpt-5")
    base = warm(pp)
    recorder.seen.clear()
    recorder.hold.clear()  # the Teacher keeps the admitted one waiting
    body = big_body(40 * MiB)
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(send_big, pp.port, f"{pp.channel}/chat/completions", body) for _ in range(6)]
        deadline = time.monotonic() + 60
        while sum(f.done() for f in futures) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = [f.result() for f in futures if f.done()]
        recorder.hold.set()
        got = [f.result() for f in futures]
    state = pp.ask("state")
    growth = (state["VmHWM"] - base) / 1024
    print(f"own channel, 6 x 40 MiB at once, Teacher slow: proxy peak RSS +{growth:.1f} MiB; answers {got}")
    assert len(refused) == 5 and all(g["status"] == 429 for g in refused), got
    assert all(g["early"] is not None and g["early"] < 40 * MiB for g in refused), got  # unread
    assert sorted(g["status"] for g in got) == [200] + [429] * 5, got
    assert len(recorder.seen) == 1 and state["records"] == 2 and state["refused"] == {"busy": 5}, state
    assert growth < 4 * 40, f"the proxy's peak RSS grew by {growth:.1f} MiB"


def test_a_slow_body_is_cut_at_its_deadline(recorder):
    proxy = RecordingProxy(recorder.url, retries=0, limits=ProxyLimits(body_timeout=1.0)).start()
    try:
        ch = proxy.channel("e1")
        s = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
        s.sendall(
            f"POST /c/e1~{ch.key}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n".encode()
        )
        t0 = time.monotonic()
        data = b""
        try:
            for _ in range(40):  # a byte every 0.2 s: never idle for long, never done
                if select.select([s], [], [], 0)[0]:
                    break
                s.sendall(b"{")
                time.sleep(0.2)
            data = s.recv(4096)
        except OSError:
            pass
        took = time.monotonic() - t0
        s.close()
        assert data.startswith(b"HTTP/1.1 408") and took < 3, (data[:40], took)
        assert recorder.seen == [] and ch.take() == [] and proxy.refused["slow"] == 1
        assert settled(proxy) and ch.inflight == 0  # its place is given back
        # the channel goes on
        assert (
            request(proxy.port, "POST", f"/c/e1~{ch.key}/v1/chat/completions", json.dumps(SMALL).encode())
            == 200
        )
    finally:
        proxy.stop()


def reached(recorder: Recorder, n: int) -> bool:
    """Whether `n` requests have reached the Teacher within 10 s."""
    deadline = time.monotonic() + 10
    while len(recorder.seen) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(recorder.seen) == n


@pytest.mark.parametrize("cap", ["per_channel", "total"])
def test_requests_in_flight_are_capped(recorder, cap):
    """Past the cap a request is answered 429 at once, unread, and reaches nothing; a free place is reused."""
    limits = ProxyLimits(per_channel=2) if cap == "per_channel" else ProxyLimits(total=2)
    proxy = RecordingProxy(recorder.url, retries=0, limits=limits).start()
    try:
        a, b = proxy.channel("a"), proxy.channel("b")
        body = json.dumps(SMALL).encode()
        recorder.hold.clear()  # the Teacher keeps the first two waiting
        first = [a, a] if cap == "per_channel" else [a, b]
        with ThreadPoolExecutor(3) as pool:
            held = [pool.submit(request, proxy.port, "POST", f"/c/{c.name}~{c.key}/v1/chat/completions", body)
                    for c in first]  # fmt: skip
            assert reached(recorder, 2)
            t0 = time.monotonic()
            status = request(proxy.port, "POST", f"/c/a~{a.key}/v1/chat/completions", body)
            assert status == 429 and time.monotonic() - t0 < 2 and len(recorder.seen) == 2
            if (
                cap == "per_channel"
            ):  # another channel still has its places: it reaches the (held) Teacher too
                held.append(
                    pool.submit(request, proxy.port, "POST", f"/c/b~{b.key}/v1/chat/completions", body)
                )
                assert reached(recorder, 3)
            recorder.hold.set()  # before the clients' own 30 s timeout, which the held Teacher's would race
            assert [f.result() for f in held] == [200] * len(held)
        assert settled(proxy)
        assert request(proxy.port, "POST", f"/c/a~{a.key}/v1/chat/completions", body) == 200
        assert proxy.refused["busy"] == 1 and a.refused["busy"] == 1 and settled(proxy)
    finally:
        recorder.hold.set()
        proxy.stop()
