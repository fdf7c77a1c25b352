"""Session affinity behind smg (teacher/affinity.py): each Teacher session's requests carry `x-smg-routing-key`,
made from the tree and edge the search names in its headers, and the real smg keeps them on one worker; the same
requests without the key are spread by the policy. Two teacher-sim workers behind smg 1.13.0 (round_robin, so the
pinning is the key's doing). Skipped only when scripts/install_smg.sh has not run (.ci/run runs it)."""

from __future__ import annotations

import pytest
import requests

from sftree.teacher.affinity import ROUTING_KEY_HEADER, routing_headers
from sftree.teacher.client import TeacherClient
from sftree.teacher.fleet import router_missing, start_fleet

MISSING = router_missing("smg")


def test_the_key_names_one_session():
    a = routing_headers({"X-Sftree-Tree": "t1", "X-Sftree-Edge": "e1", "X-Sftree-Turn": "1"})
    assert a == routing_headers(
        {"x-sftree-tree": "t1", "x-sftree-edge": "e1", "X-Sftree-Turn": "2"}
    )  # every turn
    assert a != routing_headers({"X-Sftree-Tree": "t1", "X-Sftree-Edge": "e2"})  # another edge
    assert a != routing_headers({"X-Sftree-Tree": "t2", "X-Sftree-Edge": "e1"})  # another tree
    assert routing_headers({"X-Sftree-Tree": "t1"}) == {} and len(a[ROUTING_KEY_HEADER]) == 32
    client = TeacherClient.from_config({"base_url": "http://127.0.0.1:9/v1"})
    assert (
        client._headers({"X-Sftree-Tree": "t1", "X-Sftree-Edge": "e1"})[ROUTING_KEY_HEADER]
        == a[ROUTING_KEY_HEADER]
    )
    assert ROUTING_KEY_HEADER not in client._headers(None)


def _served(fleet) -> list[int]:
    return [requests.get(f"{w.url}/sim/stats", timeout=5).json()["requests"] for w in fleet.workers]


@pytest.mark.router
@pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
def test_smg_keeps_a_session_on_one_worker(tmp_path):
    with start_fleet(2, tmp_path / "fleet", kind="teacher-sim", policy="round_robin", router="smg") as fleet:
        client = TeacherClient.from_config(
            {"base_url": fleet.base_url, "model": "teacher-sim", "retries": 1, "fleet_poll": 0}
        )
        messages = [{"role": "user", "content": "Improve the solution."}]
        for edge in ("e1", "e2", "e3"):
            before = _served(fleet)
            for turn in range(6):
                client.chat(
                    messages, headers={"X-Sftree-Tree": "t", "X-Sftree-Edge": edge, "X-Sftree-Turn": turn}
                )
            got = [b - a for a, b in zip(before, _served(fleet), strict=True)]
            assert sorted(got) == [0, 6], (edge, got)  # one worker served the whole session
        before = _served(fleet)
        for _ in range(6):  # no session named: the policy (round_robin) spreads them
            client.chat(messages)
        got = [b - a for a, b in zip(before, _served(fleet), strict=True)]
        assert min(got) > 0, got
