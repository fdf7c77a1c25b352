"""The demo's trees through SGLang's real router (sglang-router 0.3.2) in front of three teacher-sim worker
processes: one worker hangs mid-run while it answers (SIGSTOP: it holds its connections and stops answering
health checks, as a SIGTERMed llama-server behind the router does), is later SIGKILLed, and another is SIGKILLed
while it answers. Every tree finishes with nothing lost or redone, no request waits long on a dead worker, and
the failure shows in the explore log, tree.json and the report. The same with real llama-server workers:
tests/test_fleet_real.py.

Skipped only when scripts/install_router.sh has not run (.ci/run runs it).
"""

from __future__ import annotations

import signal
import time

import pytest
from helpers.fleet import (
    check_nothing_lost_or_redone,
    demo_config,
    hit_while_answering,
    incidents_of,
    logs_name,
    lost_per_request,
    records,
    start_workflow,
    steps_done,
    wait_for,
    worker_down_seen,
)

from sftree.teacher.fleet import router_missing, start_fleet

MISSING = router_missing("sglang-router")
pytestmark = [
    pytest.mark.router,
    pytest.mark.slow,
    pytest.mark.skipif(MISSING is not None, reason=str(MISSING)),
]

# the client's limits in this test; a request's wait on a dead worker is bounded by the router's detection
# (2 failed checks of 2 s, every 2 s), the watcher's poll (1 s) and its grace (5 s), or these timeouts
TEACHER = {"stall_timeout": 10, "first_chunk_timeout": 30, "fleet_poll": 1, "retries": 8, "backoff_max": 2,
           "health_timeout": 60}  # fmt: skip
WAIT_BOUND = 30  # seconds one attempt may have waited before it was abandoned
LOST_BOUND = 60  # seconds one request may have lost in all


def test_demo_trees_survive_a_hung_and_a_killed_worker_behind_the_router(tmp_path, example_snapshots_dir):
    sim = {
        "latency_ms_per_token": 12,
        "chunk_ms": 20,
    }  # replies take a while and stream: there is time to hit one
    with start_fleet(3, tmp_path / "fleet", kind="teacher-sim", sim=sim, router="sglang-router") as fleet:
        demo_config(tmp_path, example_snapshots_dir, fleet.base_url, TEACHER)
        results = tmp_path / "results"
        proc = start_workflow(tmp_path, tmp_path / "snakemake.log")
        try:
            wait_for(lambda: steps_done(results) >= 15, 300, "15 steps", proc)
            w0 = hit_while_answering(fleet.workers, signal.SIGSTOP, 120, proc)  # hung, connections open
            fleet.wait_router(lambda v: v.get(w0.url) is False, 60, "the hung worker down")
            n = steps_done(results)
            wait_for(lambda: steps_done(results) >= n + 15, 300, "15 steps after the hang", proc)
            w0.signal(signal.SIGKILL)  # the cluster's kill after its grace period
            n = steps_done(results)
            wait_for(lambda: steps_done(results) >= n + 10, 300, "10 more steps", proc)
            rest = [w for w in fleet.workers if w is not w0]
            w1 = hit_while_answering(rest, signal.SIGKILL, 120, proc)  # dies mid-reply
            assert proc.wait(timeout=900) == 0, (tmp_path / "snakemake.log").read_text()[-4000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    trees = check_nothing_lost_or_redone(results)
    assert len(trees) == 4  # the demo: 2 roots of each example task
    incidents = incidents_of(trees)
    assert incidents, "no request was hit"
    assert {i["kind"] for i in incidents} <= {"worker_down", "stall", "cut", "http", "connection"}
    assert any(i["kind"] == "worker_down" for i in incidents), (
        incidents
    )  # the hang was seen through the router
    slow = [i for i in incidents if i["waited_s"] > WAIT_BOUND]
    assert not slow, slow
    lost = lost_per_request(trees)
    assert max(lost.values()) <= LOST_BOUND, lost
    assert worker_down_seen(trees, w0.url) and worker_down_seen(trees, w1.url)
    assert logs_name(trees, rf"teacher fleet: worker {w0.url} is down at the router")
    assert logs_name(trees, r"teacher request e\d+( turn \d)?: (worker_down|stall|cut|http)")
    page = (results / "report.html").read_text()
    assert "abandoned when a worker went down" in page and w0.url in page
    assert records(results)  # the data came out
    total = sum(t.teacher["requests"] for _, t in trees)
    assert total == sum(1 for _ in _answered(trees))  # every answered step is one request, counted once


def _answered(trees):
    from sftree.records import steplog

    for d, t in trees:
        for e in t.edges:
            for s in steplog.read_steps(d / "edges" / e.id / "steps.jsonl"):
                if s["response"] is not None:
                    yield s


def test_a_router_answer_names_the_fleet_in_the_log(tmp_path):
    """wait_ready behind the router: one line with the workers and their health, and the model list `unknown`."""
    import logging

    from sftree.teacher.client import TeacherClient

    with start_fleet(2, tmp_path / "fleet", kind="teacher-sim", router="sglang-router") as fleet:
        c = TeacherClient.from_config({"base_url": fleet.base_url, "health_timeout": 30, "fleet_poll": 0.5})
        logger = logging.getLogger("sftree.teacher.client")
        seen = []
        handler = logging.Handler()
        handler.emit = lambda r: seen.append(r.getMessage())
        logger.addHandler(handler)
        old = logger.level
        logger.setLevel(logging.INFO)
        try:
            c.wait_ready()
            assert c.fleet is not None
            (line,) = [m for m in seen if m.startswith("teacher ready")]
            assert (
                "router (smg or sglang-router), 2 of 2 workers healthy" in line and "models: unknown" in line
            )
            fleet.workers[1].signal(signal.SIGKILL)
            deadline = time.monotonic() + 30
            while not c.stats["worker_events"] and time.monotonic() < deadline:
                time.sleep(0.2)
            (ev,) = c.stats["worker_events"]
            assert ev["worker"] == fleet.workers[1].url and not ev["healthy"] and ev["healthy_workers"] == 1
        finally:
            logger.removeHandler(handler)
            logger.setLevel(old)
            c.close()
