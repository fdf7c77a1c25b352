"""Helpers for the fleet tests (tests/test_fleet_*.py): the workflow run in the background against a router,
workers signalled while they answer, and the checks that nothing was lost or redone."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import yaml

from sftree.records import steplog
from sftree.search import tree as treemod
from sftree.teacher.fleet import Worker

REPO = Path(__file__).resolve().parents[2]
BACKGROUND_KINDS = {"stall", "cut", "worker_down", "connection", "http", "stream_error"}


def demo_config(tmp: Path, snapshots: Path, base_url: str, teacher: dict, **sections) -> Path:
    """examples/demo.yaml with the Teacher at `base_url` (no teacher-sim of its own) and `sections` merged in."""
    config = yaml.safe_load((REPO / "examples/demo.yaml").read_text())
    del config["example_run"]
    config["snapshots"] = str(snapshots)
    for task in config["tasks"].values():  # the task folders, absolute (a Coral task or a task_dir)
        for key in ("coral_task", "task_dir"):
            if key in task:
                task[key] = str(REPO / task[key])
    config["teacher"].pop("sim")
    config["agent"]["backend"] = "native"  # the fleet is under test, not the agent: the fast backend
    config["teacher"].update({"base_url": base_url, **teacher})
    for key, values in sections.items():
        config.setdefault(key, {}).update(values)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_workflow(workdir: Path, log: Path) -> subprocess.Popen:
    cmd = ["snakemake", "--cores", "2", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "config.yaml")]  # fmt: skip
    out = open(log, "w")  # noqa: SIM115 - the child's
    try:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    finally:
        out.close()


def steps_done(results: Path) -> int:
    """Step records written so far, over every tree."""
    n = 0
    for f in results.glob("*/trees/*/edges/*/steps.jsonl"):
        try:
            n += f.read_bytes().count(b"\n")
        except OSError:
            pass
    return n


def wait_for(pred, timeout: float, what: str, proc: subprocess.Popen | None = None, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the workflow ended (exit {proc.returncode}) before {what}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not seen within {timeout:g}s")
        time.sleep(poll)


def hit_while_answering(workers: list[Worker], sig: int, timeout: float, proc: subprocess.Popen) -> Worker:
    """Send `sig` to the first of `workers` seen answering a request (cache_aware may leave one idle); that one."""

    def busy():
        return next((w for w in workers if w.answering()), None)

    w = wait_for(busy, timeout, f"one of workers {[w.index for w in workers]} answering", proc, poll=0.05)
    w.signal(sig)
    return w


def check_nothing_lost_or_redone(results: Path) -> list[tuple[Path, treemod.Tree]]:
    """Every tree finished in one run (no resume, so no in-flight edge was discarded and redone), its edges are
    numbered without a gap, and every edge's step records are there once each: per turn, steps 1..n, as many as
    the turn counted, every one answered (no request was given up: no `teacher_error`)."""
    out = []
    for f in sorted(results.glob("*/trees/*/tree.json")):
        tree = treemod.load(f)
        assert tree.status == "finished", f
        log = (f.parent / "explore.log").read_text()
        assert "resuming" not in log, f
        ids = sorted(int(e.id[1:]) for e in tree.edges)  # kept in the order they finished
        assert ids == list(range(1, len(tree.edges) + 1)), (f, ids)
        assert tree.next_edge == len(tree.edges) + 1 and not tree.in_flight, f
        for e in tree.edges:
            assert e.finished_at and e.error is None, (f, e.id, e.error)
            steps = steplog.read_steps(f.parent / "edges" / e.id / "steps.jsonl")
            per_turn = defaultdict(list)
            for s in steps:
                per_turn[s["turn"]].append(s["step"])
                assert s["response"] is not None or not s["error"].startswith("Teacher"), (
                    f,
                    e.id,
                    s["error"],
                )
            for t in e.turns:
                assert t.ended != "teacher_error", (f, e.id, t)
                assert per_turn[t.turn] == list(range(1, t.steps + 1)), (f, e.id, t.turn, per_turn)
            assert set(per_turn) == {t.turn for t in e.turns}, (f, e.id)
        out.append((f.parent, tree))
    return out


def incidents_of(trees) -> list[dict]:
    return [dict(i, tree=str(d)) for d, t in trees for i in (t.teacher or {}).get("incidents", [])]


def lost_per_request(trees) -> dict[tuple[str, int], float]:
    """Seconds each request spent on attempts that failed, summed (its waits on dead or hung workers)."""
    out: dict[tuple[str, int], float] = defaultdict(float)
    for i in incidents_of(trees):
        out[(i["tree"], i["request"])] += i["waited_s"]
    return dict(out)


def worker_down_seen(trees, url: str) -> bool:
    return any(
        ev["worker"] == url and not ev["healthy"]
        for _, t in trees
        for ev in (t.teacher or {}).get("worker_events", [])
    )


def logs_name(trees, pattern: str) -> bool:
    return any(re.search(pattern, (d / "explore.log").read_text()) for d, _ in trees)


def records(results: Path) -> list[dict]:
    f = results / "sft.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []
