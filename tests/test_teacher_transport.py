"""One Teacher transport (teacher/transport.py): the native client and the OpenCode backend's recording proxy both
send through it, so a transient fault - a 503, a connection reset, a stall - is sent again by the same policy
(the same attempts, the same backoff) on either path, against a real local server that misbehaves on cue
(tests/helpers/faulty_teacher.py). docs/failures.md, "The Teacher transport".
"""

from __future__ import annotations

import pytest
import requests
from helpers.faulty_teacher import FaultyTeacher

from sftree.agents.proxy import RecordingProxy
from sftree.teacher.client import TeacherClient, TeacherError
from sftree.teacher.transport import Policy, backoff_delay, teacher_defaults, transient_status

MSGS = [{"role": "user", "content": "Improve the score."}]
# backoff_base above the proxy's old hard-coded 0.5 s: a path that kept its own backoff fails the lower bound
POLICY = {"retries": 2, "backoff_base": 0.8, "backoff_max": 0.8, "outage_timeout": 0, "connect_timeout": 2,
          "request_timeout": 0.6, "first_chunk_timeout": 0.5, "stall_timeout": 0.5}  # fmt: skip
# how long each fault takes the sender to see (a stall: the limit that applies, streamed or not)
FAULT_S = {"503": 0.0, "reset": 0.0, "stall": {True: 0.5, False: 0.6}}
SLACK = 0.6  # a loaded machine's scheduling, on top of the policy's wait


def via_client(url: str, stream: bool, policy: dict) -> tuple[str, object]:
    c = TeacherClient.from_config(
        {"base_url": url, "model": "m", "stream": stream, "health_timeout": 5, **policy}
    )
    try:
        comp = c.chat(MSGS, headers={"X-Sftree-Edge": "e1", "X-Sftree-Turn": "1"})
    except TeacherError as exc:
        return "gave_up", str(exc)
    return "answered", comp.message["content"]


def via_proxy(url: str, stream: bool, policy: dict) -> tuple[str, object]:
    """As OpenCode sends it: through the recording proxy, which sends it on to the Teacher."""
    proxy = RecordingProxy(url, policy=Policy.from_config(policy)).start()
    try:
        ch = proxy.channel("e1", {"X-Sftree-Edge": "e1"})
        body = {"model": "m", "messages": MSGS, "stream": stream}
        r = requests.post(f"{proxy.base_url('e1')}/chat/completions", json=body, timeout=30)
        (rec,) = ch.take()
    finally:
        proxy.stop()
    if r.status_code != 200:
        return "gave_up", (r.status_code, rec["error"])
    assert rec.get("error") is None, rec["error"]
    return "answered", rec["response"]["content"]


PATHS = {"client": via_client, "proxy": via_proxy}


def send_through(path: str, script: list[str], stream: bool, policy: dict = POLICY):
    teacher = FaultyTeacher(script).start()
    try:
        outcome = PATHS[path](teacher.base_url, stream, policy)
    finally:
        teacher.stop()
    return outcome, teacher.arrivals


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
@pytest.mark.parametrize("fault", ["503", "reset", "stall"])
def test_a_transient_fault_is_sent_again_after_the_policys_backoff_on_both_paths(fault, stream):
    """One fault, then an answer: each path answers with the second attempt, sent `backoff_base` s after the
    first failed (its stall limit included), and the two paths wait alike."""
    waits = {}
    for path in PATHS:
        outcome, arrivals = send_through(path, [fault], stream)
        assert outcome == ("answered", "Done."), path
        assert len(arrivals) == 2, path
        fault_s = FAULT_S[fault][stream] if fault == "stall" else FAULT_S[fault]
        waits[path] = arrivals[1] - arrivals[0] - fault_s
        want = backoff_delay(0, POLICY["backoff_base"], POLICY["backoff_max"])
        assert want - 0.05 <= waits[path] < want + SLACK, (path, waits[path])
    assert abs(waits["client"] - waits["proxy"]) < SLACK, waits


@pytest.mark.parametrize("fault", ["503", "reset", "stall"])
def test_both_paths_give_up_after_the_same_attempts(fault):
    """A fault on every attempt: `retries` + 1 attempts on each path, then the client raises and the proxy
    answers OpenCode with the Teacher's last status (a 503 as sent) or 502 when there was none."""
    quick = {**POLICY, "backoff_base": 0.01, "backoff_max": 0.02}
    (client, _), seen_client = send_through("client", [fault] * 9, True, quick)
    (proxy, said), seen_proxy = send_through("proxy", [fault] * 9, True, quick)
    assert client == proxy == "gave_up"
    assert len(seen_client) == len(seen_proxy) == POLICY["retries"] + 1
    status, error = said
    assert status == (503 if fault == "503" else 502)
    assert ("HTTP 503" if fault == "503" else "failed 3 times") in error


def test_the_policy_defaults_are_the_schemas():
    """Nothing given, both paths take the schema's `teacher.*` defaults (no second copy of them in code)."""
    want = Policy.from_config({})
    d = teacher_defaults()
    assert (want.retries, want.backoff_base, want.connect_timeout, want.stall_timeout) == (
        d["retries"], d["backoff_base"], d["connect_timeout"], d["stall_timeout"]
    )  # fmt: skip
    assert TeacherClient.from_config({"base_url": "http://127.0.0.1:1/v1"}).policy == want
    assert TeacherClient.from_config({"retries": 3}).policy == Policy.from_config({"retries": 3})
    proxy = RecordingProxy("http://127.0.0.1:1/v1")
    try:
        assert proxy.transport.policy == want
    finally:
        proxy.server.server_close()


def test_transient_statuses_are_429_and_every_5xx():
    assert all(transient_status(s) for s in (429, 500, 501, 502, 503, 504, 507, 599))
    assert not any(transient_status(s) for s in (200, 400, 401, 404, 413, 428, 600))
