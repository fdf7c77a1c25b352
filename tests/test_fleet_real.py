"""The demo's trees through each router (smg, the default, with each session's routing key; sglang-router) with two
real llama-server workers (SmolLM2-135M on the CPU): one worker
gets SIGTERM while it answers (as a cluster preempts a job; behind the router it stops answering health checks
and hangs in its cleanup while the router's connection is open), is SIGKILLed if it has not exited 30 s later and
started again on its port (a requeued job); then the other gets SIGKILL while it answers. Every tree finishes,
nothing is lost or redone, no request waited long on the dead worker, and it shows in the log and the report.

The trees are the demo's (both example tasks, one root each) with the budget of examples/real.yaml, so the CPU
model gets through them in a few minutes. Each router's run writes its report (trees finished, the longest wait of a
request on a dead worker, prompt tokens served from the workers' caches) to `fleet-report-<router>.json` in
$SFTREE_FLEET_REPORT_DIR when that is set (docs/serving.md has the figures). Skipped only when
scripts/install_llm_server.sh or the router's install script has not run (.ci/run runs them all).
"""

from __future__ import annotations

import json
import os
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
    start_workflow,
    steps_done,
    wait_for,
    worker_down_seen,
)

from sftree.teacher.fleet import ROUTERS, router_missing, start_fleet
from sftree.teacher.llm_server import LaunchSpec

MODEL_MISSING = LaunchSpec.from_config({}).missing()
pytestmark = [
    pytest.mark.llm,
    pytest.mark.router,
    pytest.mark.slow,
    pytest.mark.skipif(MODEL_MISSING is not None, reason=str(MODEL_MISSING)),
]
ROUTER_PARAMS = [
    pytest.param(r, marks=pytest.mark.skipif(router_missing(r) is not None, reason=str(router_missing(r))))
    for r in ROUTERS
]

TEACHER = {
    "tool_choice": "required", "constrain": "tool_call_required", "seed": 0, "temperature": 0.7,
    "max_tokens": 48, "context_tokens": 8192, "stall_timeout": 30, "first_chunk_timeout": 300,
    "request_timeout": 600, "fleet_poll": 1, "retries": 8, "backoff_max": 2, "health_timeout": 120,
}  # fmt: skip
AGENT = {"max_steps_per_turn": 3, "nudges": 1, "output_cap": 2000, "turn_timeout": 900}
SEARCH = {"root_children": 1, "max_children": 1, "max_depth": 1, "max_valid_edges": 1, "max_failed_expansions": 1,
          "target_good_leaves": 1, "parallel_width": 1, "hard_token_limit": 6000}  # fmt: skip
# one attempt abandoned on a dead worker: the router's detection (~6 s) + the watcher's poll and grace (6 s),
# or the stall limit (30 s); far below first_chunk_timeout (300 s), which a hung worker would cost without them
WAIT_BOUND = 60
LOST_BOUND = 120


@pytest.mark.parametrize("router", ROUTER_PARAMS)
def test_demo_trees_through_the_router_survive_sigterm_and_sigkill_of_real_workers(
    tmp_path, example_snapshots_dir, router
):
    t0 = time.monotonic()
    with start_fleet(2, tmp_path / "fleet", kind="llama-server", router=router) as fleet:
        demo_config(tmp_path, example_snapshots_dir, fleet.base_url, TEACHER, agent=AGENT, search=SEARCH,
                    select_roots={"num_roots": 1})  # fmt: skip
        results = tmp_path / "results"
        proc = start_workflow(tmp_path, tmp_path / "snakemake.log")
        try:
            wait_for(lambda: steps_done(results) >= 2, 600, "2 steps", proc)
            term = hit_while_answering(fleet.workers, signal.SIGTERM, 300, proc)
            t_term = time.monotonic()
            fleet.wait_router(lambda v: v.get(term.url) is False, 60, "the SIGTERMed worker down")
            try:
                term.proc.wait(timeout=30)
                killed_hung = False
            except Exception:  # noqa: BLE001 - still hung in its cleanup: the cluster's kill after its grace
                term.signal(signal.SIGKILL)
                term.proc.wait(timeout=30)
                killed_hung = True
            fleet.restart(term)
            other = [w for w in fleet.workers if w is not term]
            kill = hit_while_answering(other, signal.SIGKILL, 600, proc)
            assert proc.wait(timeout=1800) == 0, (tmp_path / "snakemake.log").read_text()[-4000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print(f"SIGTERMed worker {term.index} exited {'after SIGKILL' if killed_hung else 'by itself'} "
          f"{time.monotonic() - t_term:.0f}s before the end")  # fmt: skip

    trees = check_nothing_lost_or_redone(results)
    assert len(trees) == 2
    incidents = incidents_of(trees)
    kinds = {i["kind"] for i in incidents}
    # smg ends the stream of a worker that died under it with an SSE error event ("Stream ended by the worker
    # before completion"), where sglang-router cuts the connection: the client resends either way
    allowed = {"worker_down", "stall", "cut", "http", "connection"} | (
        {"stream_error"} if router == "smg" else set()
    )
    assert incidents and kinds <= allowed, incidents
    slow = [i for i in incidents if i["waited_s"] > WAIT_BOUND]
    assert not slow, slow
    lost = lost_per_request(trees)
    assert max(lost.values()) <= LOST_BOUND, lost
    assert worker_down_seen(trees, term.url) and worker_down_seen(trees, kill.url)
    assert logs_name(trees, rf"teacher fleet: worker {term.url} is down at the router")
    page = (results / "report.html").read_text()
    assert "attempt(s) sent again" in page and term.url in page
    for _, t in trees:  # streamed through the router; the workers' prefix caches report cached tokens
        assert t.teacher["requests"] > 0 and t.teacher["router"] and t.teacher["stream"]
        assert 0 < t.teacher["cached_tokens"] < t.teacher["prompt_tokens"]
    for i in incidents:
        print("incident", i["kind"], i["label"], i["waited_s"], i["detail"][:80])
    report = {
        "router": router,
        "trees_finished": len(trees),
        "longest_stall_s": round(max(i["waited_s"] for i in incidents), 1),
        "prompt_tokens": sum(t.teacher["prompt_tokens"] for _, t in trees),
        "cached_prompt_tokens": sum(t.teacher["cached_tokens"] for _, t in trees),
        "requests": sum(t.teacher["requests"] for _, t in trees),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    report["cached_share"] = round(report["cached_prompt_tokens"] / report["prompt_tokens"], 3)
    print("fleet report", json.dumps(report))
    if os.environ.get("SFTREE_FLEET_REPORT_DIR"):
        out = os.path.join(os.environ["SFTREE_FLEET_REPORT_DIR"], f"fleet-report-{router}.json")
        with open(out, "w") as fh:
            json.dump(report, fh, indent=2)
