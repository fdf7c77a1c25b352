"""Resume after `kill -9` of a running `sftree explore`, and reproducibility with parallel_width 1."""

import hashlib
import json
import os
import signal
import subprocess
import time

from helpers.explore import explore, explore_cmd, load_final, make_root, write_config

from sftree.httpserver import local_url, serve_in_background
from sftree.search.tree import LiveTree, edge_doc
from sftree.teacher.sim.server import make_server

# Wall-clock fields; knowledge commits hold Coral attempt records, which carry a timestamp.
VOLATILE = {"created_at", "updated_at", "started_at", "finished_at", "wall_s", "knowledge_commit", "timestamp",
            "shared_state_hash"}  # fmt: skip


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def start_logged_sim(log: list, **opts):
    """teacher-sim in this process, with a handler subclass that notes each request's X-Sftree headers."""
    server = make_server("127.0.0.1", 0, **opts)
    base = server.RequestHandlerClass

    class Logged(base):
        def do_POST(self):
            log.append(
                (time.monotonic(), self.headers.get("X-Sftree-Edge"), self.headers.get("X-Sftree-Turn"))
            )
            super().do_POST()

    server.RequestHandlerClass = Logged
    return local_url(server), serve_in_background(server, "teacher-sim", poll_s=0.05)


def test_kill_9_then_resume(tmp_path):
    requests: list = []
    url, server = start_logged_sim(requests, seed=3, latency_ms_per_token=0.4)
    try:
        root = make_root(tmp_path)
        search = {"root_children": 2, "max_children": 2, "max_depth": 2, "parallel_width": 2}
        cfg = write_config(tmp_path, search, base_url=url)
        out = tmp_path / "trees" / root.name
        live = LiveTree(out)
        cmd = explore_cmd(root, out, cfg)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        before = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if live.exists():
                snap = live.load().to_dict()  # the snapshot with the appended log replayed
                if len(snap["edges"]) >= 2 and snap["in_flight"]:
                    os.kill(proc.pid, signal.SIGKILL)
                    killed_at = time.monotonic()
                    before = snap
                    break
            time.sleep(0.05)
        proc.wait(timeout=30)
        assert before is not None, "explore finished before it could be killed mid-tree"
        assert not (out / "tree.json").exists()
        # The finished edges reached disk as appended log lines, not as rewrites of the snapshot.
        assert len(json.loads(live.snapshot_path.read_text())["edges"]) < len(before["edges"])
        assert len(live.log_path.read_text().splitlines()) >= 3
        done_before = {e["id"]: e for e in before["edges"]}
        running_before = {d["edge"] for d in before["in_flight"]}

        def digest(e):  # an edge's step records and its message store
            return [
                hashlib.sha256((out / "edges" / e / f).read_bytes()).hexdigest()
                for f in ("steps.jsonl", "messages.jsonl")
            ]

        transcripts = {e: digest(e) for e in done_before}
        time.sleep(0.3)  # let requests of the killed process that were already on the wire land

        assert explore(root, out, cfg) == 0
        tree = load_final(out)
        assert tree.status == "finished" and tree.stop_reason == "frontier_empty"
        assert len([e for e in tree.edges if e.child]) == 6  # the full tree: 2 + 4
        final = {e.id: e for e in tree.edges}
        for eid, e in done_before.items():  # finished edges kept as they were
            assert _strip(e) == _strip(edge_doc(final[eid]))
            assert digest(eid) == transcripts[eid]
        assert not running_before & set(final)  # half-done edges discarded, their ids not reused
        assert not any(
            (out / "edges" / e).exists() or (out / "sessions" / f"{e}.json").exists() for e in running_before
        )
        after = {edge for t, edge, _ in requests if t > killed_at + 0.3}
        assert after and not after & (set(done_before) | running_before)
        assert list((out / "work").iterdir()) == []
        assert not live.snapshot_path.exists() and not live.log_path.exists()
    finally:
        server.stop()


def test_width1_fixed_seed_is_reproducible_and_edge_budget(tmp_path):
    search = {"root_children": 3, "max_depth": 2, "max_valid_edges": 2, "parallel_width": 1, "seed": 5}
    trees = []
    for run in ("a", "b"):
        d = tmp_path / run
        root = make_root(d)
        cfg = write_config(d, search, seed=5)
        out = d / "trees" / root.name
        assert explore(root, out, cfg) == 0
        trees.append(json.loads((out / "tree.json").read_text()))
        load_final(out)
    a, b = (_strip(t) for t in trees)
    assert a == b
    assert trees[0]["stop_reason"] == "edge_budget" and trees[0]["counters"]["valid_edges"] == 3
    assert all(n["state"]["code_commit"] for n in trees[0]["nodes"])


def test_a_resume_keeps_every_session_file_of_a_finished_edge_and_none_of_another(tmp_path):
    """sessions/<edge>.json and the backend's own files beside it (OpenCode's store and its record) go together."""
    from sftree.search.explore import drop_unfinished

    sessions = tmp_path / "sessions"
    sessions.mkdir()
    names = [
        "e1.json",
        "e1.opencode.json",
        "e1.opencode.db",
        "e12.json",
        "e12.opencode.db",
        "e2.opencode.json",
    ]
    for name in names:
        (sessions / name).write_text("x")
    (tmp_path / "edges" / "e1").mkdir(parents=True)
    (tmp_path / "edges" / "e12").mkdir()
    drop_unfinished(tmp_path, {"e1"})
    assert sorted(p.name for p in sessions.iterdir()) == ["e1.json", "e1.opencode.db", "e1.opencode.json"]
    assert [p.name for p in (tmp_path / "edges").iterdir()] == ["e1"]
