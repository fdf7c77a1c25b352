"""No worker to answer (`teacher.outage_timeout`): answers that nobody is there - sglang-router's HTTP 503
`no_available_workers` (teacher-sim's `no_worker` fault) or a connection refused (a server not listening yet) -
are sent again for `outage_timeout` seconds, not `retries` times, so a request survives an outage far longer
than its retry count would allow, and is given up with a clear error once the outage outlasts the bound.
The real router and real workers: tests/test_fleet_real.py; docs/failures.md, "No worker to answer".
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
import requests

from sftree.agents.nativetools import TOOL_SCHEMAS
from sftree.agents.proxy import RecordingProxy
from sftree.teacher.client import TeacherClient, TeacherError, no_worker_answer, refused
from sftree.teacher.sim.server import NO_WORKER_BODY, start_teacher_sim

MSGS = [{"role": "user", "content": "Improve the score. " * 20}]
HEADERS = {"X-Sftree-Edge": "e1", "X-Sftree-Turn": "1"}


def client(url, **kw):
    kw = {"retries": 1, "backoff_base": 0.01, "backoff_max": 0.05, "health_timeout": 5, **kw}
    return TeacherClient.from_config({"base_url": url, "model": "default", **kw})


@pytest.fixture
def sims():
    stops = []

    def start(**opts):
        url, stop = start_teacher_sim(**{"port": 0, **opts})
        stops.append(stop)
        return url, stop.server.state

    yield start
    for stop in stops:
        stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("stream", [True, False])
def test_no_worker_answers_are_waited_out_past_the_retry_count(sims, caplog, stream):
    """8 answers `no_available_workers` in a row against `retries: 1` (2 attempts): the request is answered by
    the 9th attempt; each waiting attempt is logged with its seconds of the bound and kept as an incident."""
    url, state = sims(script=[{"match": {}, "fault": "no_worker", "count": 8}])
    c = client(url, outage_timeout=60, stream=stream)
    with caplog.at_level(logging.WARNING, logger="sftree.teacher.client"):
        comp = c.chat(MSGS, TOOL_SCHEMAS, headers=HEADERS)
    assert comp.message["tool_calls"] and comp.attempts == 9 and state.requests == 9
    assert c.stats["retries"] == 8 and c.stats["failed_attempts"] == 8
    incidents = c.stats["incidents"]
    assert len(incidents) == 8 and {i["kind"] for i in incidents} == {"http"}
    assert all("no_available_workers" in i["detail"] for i in incidents)
    waiting = [r.getMessage() for r in caplog.records if "waiting for a Teacher worker" in r.getMessage()]
    assert len(waiting) == 8 and waiting[0].startswith(
        "teacher request e1 turn 1: waiting for a Teacher worker: "
    )
    assert all(" s of 60 (HTTP 503: " in m for m in waiting)


def test_with_outage_timeout_0_no_worker_answers_count_against_retries(sims):
    url, state = sims(script=[{"match": {}, "fault": "no_worker", "count": 8}])
    with pytest.raises(TeacherError, match="failed 2 times; last error: HTTP 503: .*no_available_workers"):
        client(url, outage_timeout=0).chat(MSGS, TOOL_SCHEMAS, headers=HEADERS)
    assert state.requests == 2


def test_an_outage_longer_than_outage_timeout_is_given_up_with_a_clear_error(sims):
    url, state = sims(script=[{"match": {}, "fault": "no_worker"}])  # no worker, ever
    c = client(url, outage_timeout=1.0, backoff_max=0.1)
    t0 = time.monotonic()
    with pytest.raises(TeacherError) as exc:
        c.chat(MSGS, TOOL_SCHEMAS, headers=HEADERS)
    took = time.monotonic() - t0
    assert 1.0 <= took < 5, took
    msg = str(exc.value)
    assert f"Teacher at {url}/chat/completions had no worker to answer for 1s" in msg
    assert "(teacher.outage_timeout 1s); last error: HTTP 503" in msg and "no_available_workers" in msg
    assert state.requests > 2  # far more attempts than `retries: 1` allows


def test_an_outage_then_a_failure_counts_the_failure_against_retries(sims):
    """The outage ends with any other answer: the 500 after it is the request's first failure of `retries: 1`,
    the next attempt answers."""
    url, state = sims(script=[{"match": {}, "fault": "no_worker", "count": 3},
                              {"match": {}, "fault": "http_500", "skip": 3, "count": 1}])  # fmt: skip
    comp = client(url, outage_timeout=60).chat(MSGS, TOOL_SCHEMAS, headers=HEADERS)
    assert comp.attempts == 5 and state.requests == 5


@pytest.mark.parametrize("stream", [True, False])
def test_a_server_not_listening_yet_is_waited_for(sims, stream):
    """Connection refused for 1.5 s (the router or server restarting), far more attempts than `retries: 1`:
    the request is answered once a server listens on the port."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    started = threading.Timer(1.5, lambda: sims(port=port))
    started.start()
    try:
        t0 = time.monotonic()
        comp = client(url, outage_timeout=30, backoff_max=0.2, stream=stream).chat(
            MSGS, TOOL_SCHEMAS, headers=HEADERS
        )
        assert time.monotonic() - t0 >= 1.4 and comp.attempts > 2 and comp.message["tool_calls"]
    finally:
        started.join()


def test_a_refused_connection_past_outage_timeout_names_the_url():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(TeacherError, match=r"had no worker to answer for \ds .*last error: connection: "):
        client(url, outage_timeout=0.5, backoff_max=0.1).chat(MSGS, TOOL_SCHEMAS, headers=HEADERS)


def test_what_counts_as_no_worker():
    import json

    assert no_worker_answer(503, json.dumps(NO_WORKER_BODY))
    assert not no_worker_answer(503, '{"error": {"message": "queue full"}}')  # a live server, overloaded
    assert not no_worker_answer(500, json.dumps(NO_WORKER_BODY))
    try:
        requests.get(f"http://127.0.0.1:{free_port()}/", timeout=2)
    except requests.ConnectionError as exc:
        assert refused(exc)
    assert not refused(requests.ConnectionError("Connection aborted: RemoteDisconnected"))


def test_the_recording_proxy_waits_out_no_worker_answers_too(sims):
    """The OpenCode backend's proxy: 5 answers `no_available_workers` against `retries: 1` are waited out; an
    outage past its `outage_timeout` is passed on to OpenCode as the router's 503."""
    body = {"model": "m", "messages": MSGS, "tools": TOOL_SCHEMAS}
    for count, bound, status in ((5, 30, 200), (None, 0.3, 503)):
        url, state = sims(script=[{"match": {}, "fault": "no_worker", "count": count}])
        proxy = RecordingProxy(url, retries=1, backoff_max=0.05, outage_timeout=bound).start()
        try:
            proxy.channel("e1", {"X-Sftree-Edge": "e1"})
            resp = requests.post(f"{proxy.base_url('e1')}/chat/completions", json=body, timeout=30)
        finally:
            proxy.stop()
        assert resp.status_code == status and state.requests > 2
        if status == 503:
            assert "no_available_workers" in resp.text
        else:
            assert state.requests == 6


def test_config_takes_outage_timeout(tmp_path):
    import yaml

    from sftree.config import REPO_ROOT, load_config
    from sftree.errors import InputError

    teacher = load_config(REPO_ROOT / "config.yaml")["teacher"]
    assert (
        teacher["outage_timeout"] == 600 and TeacherClient.from_config(teacher).policy.outage_timeout == 600
    )
    assert TeacherClient.from_config({}).policy.outage_timeout == 600  # the schema's default, also without it
    cfg = yaml.safe_load((REPO_ROOT / "examples/demo.yaml").read_text())
    cfg["teacher"]["outage_timeout"] = -1
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    with pytest.raises(InputError, match="outage_timeout"):
        load_config(p)
