"""`coral` in the workspace: eval (a host-made commit, a copy of exactly it graded, the host's record, Coral's
block), wait, the read-only commands answered from the host's records, and the socket's bounds."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time

import pytest
from helpers.runtime import TOY_GRADER, make_task

from sftree.agents.nativetools import ToolContext, execute
from sftree.runtime.diskquota import grade_quota
from sftree.runtime.folderreader import Quota
from sftree.runtime.objects import git_env
from sftree.runtime.sandbox import UIDS, bwrap_works
from sftree.runtime.store import TreeStore
from sftree.search.edge import EdgeContext, open_world, root_context
from sftree.settings import AgentSettings, section_settings
from sftree.world import coral_command as coralmod
from sftree.world.coral_command import parse_grader_output
from sftree.world.task import load_task
from sftree.world.world import World

BLOCK = re.compile(r"CORAL Eval \(#(\d+)\): (\S+)\nCommit:  ([0-9a-f]{12})\nStatus:  (\S+)")


def setup(tmp_path, grader=TOY_GRADER, attempts=(), *, sandbox="none", **task_kw):
    """One edge's world as run_edge opens it (search/edge.py `open_world`), on a toy task and the stand-in world."""
    root = tmp_path / "root"
    (root / "code").mkdir(parents=True)
    (root / "code" / "solution.py").write_text("VALUE = 1.0\n")
    (root / "shared" / "attempts").mkdir(parents=True)
    for a in attempts:
        (root / "shared" / "attempts" / f"{a['commit_hash']}.json").write_text(json.dumps(a))
    (root / "metadata.json").write_text(json.dumps({"agent_id": "agent-1", "eval_count": 41}))
    task = make_task(tmp_path, grader, **task_kw)
    store, state = TreeStore.create(tmp_path / "tree", root, task)
    spec = load_task(task, task["name"])
    rc = root_context(store, state, root)
    world = World(
        spec, agent_id=rc.agent_id, agents=rc.agents, install=None, run_dir="/workspace/results/toy"
    )
    q = section_settings(AgentSettings, {}).quota  # the schema's agent.quota
    ctx = EdgeContext(tmp_path / "tree", store, state, None, None, task, spec.direction, "root", world=world,
                      mode=sandbox, quota=Quota.from_settings(q), tmp_bytes=q.tmp_mib << 20,
                      tmp_inodes=q.tmp_inodes, grade_quota=grade_quota(q), keep_workspaces=False,
                      root_counters=rc.counters(spec.direction), hidden=[tmp_path / "tree"])  # fmt: skip
    uid = UIDS.acquire() if sandbox == "bwrap" else None
    ws, runtime, server, box = open_world(ctx, state, "e1", uid)
    return ws, server, box


def coral(box, *argv):
    env = {**os.environ, **box.env()}
    p = subprocess.run(
        [str(box.coral_dir / "bin" / "coral"), *argv],
        cwd=box.ws.root,
        env=env,
        capture_output=True,
        text=True,
    )
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def toy(tmp_path):
    student = {"commit_hash": "f" * 40, "agent_id": "agent-1", "score": 3.0, "status": "improved",
               "timestamp": "2020-01-01T00:00:00", "title": "the Student's best"}  # fmt: skip
    other = {**student, "commit_hash": "e" * 40, "agent_id": "agent-2", "score": 9.0}
    ws, server, box = setup(tmp_path, attempts=[student, other])
    yield ws, server, box
    server.stop()


def set_value(ws, v):
    (ws.root / "solution.py").write_text(f"VALUE = {v}\n")


def test_eval_commits_grades_and_records(toy):
    ws, server, box = toy
    set_value(ws, 2.5)
    rc, out, err = coral(box, "eval", "-m", "try 2.5")
    number, score, commit12, status = BLOCK.search(out).groups()
    # #42: the parent's global count + 1; regressed against the same agent's best (3.0), not agent-2's 9.0
    assert (rc, number, score, status) == (0, "42", "2.5000000000", "regressed") and err == ""
    assert "Feedback: value is 2.5" in out
    commit = server.runtime.evals[-1].commit
    assert commit.startswith(commit12) and ws.head == commit and ws.graded == [commit]
    rec = json.loads((ws.paths.attempts / f"{commit}.json").read_text())
    assert rec["title"] == "try 2.5" and rec["score"] == 2.5 and rec["agent_id"] == "agent-1"
    assert rec["parent_hash"] == ws.parent.code_commit and rec["status"] == "regressed"
    # the client brought the worktree's own repository to the graded commit
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ws.root, capture_output=True, text=True, env=git_env()
    )
    assert head.stdout.strip() == commit
    # A turn ends at its first eval and the runtime takes no other in it: each eval below opens a turn of its own.
    assert coral(box, "eval", "-m", "same turn")[2].startswith("Error: this turn already ended at its eval")
    set_value(ws, 3)
    server.runtime.open_turn()
    assert BLOCK.search(coral(box, "eval", "-m", "three")[1]).group(4) == "baseline"  # a tie
    set_value(ws, 4)
    server.runtime.open_turn()
    assert BLOCK.search(coral(box, "eval", "-m", "four")[1]).groups()[0::3] == ("44", "improved")
    assert [e.score for e in server.runtime.evals] == [2.5, 3.0, 4.0]
    server.runtime.open_turn()
    rc, out, err = coral(box, "eval", "-m", "again")
    assert (rc, out) == (1, "") and err.startswith("Error: Nothing to commit")  # on stderr, exit 1, as Coral
    assert server.runtime.evals[-1].status == "nothing_to_commit"
    rc, out, _ = coral(box, "wait", commit[:8])
    assert rc == 0 and "CORAL Wait (#42): 2.5000000000" in out
    # the read-only commands: the stand-in CLI, run where the agent runs, over the run directory's records
    rc, out, _ = coral(box, "log")
    assert rc == 0 and "four" in out and "try 2.5" in out
    rc, out, _ = coral(box, "show", commit[:8])
    assert rc == 0 and "try 2.5" in out
    (ws.knowledge_dir / "notes" / "idea.md").write_text("# Bigger VALUE helps\n")
    assert "Bigger VALUE helps" in coral(box, "notes", "--read", "idea")[1]
    assert coral(box, "frobnicate")[0] == 2


def test_the_grader_gets_exactly_the_commit(tmp_path):
    """Graded = committed: no workspace leftovers, no caches, and no attribute rule (export-ignore) applied."""
    grader = (
        "import json, os, sys\nfiles = sorted(os.listdir(sys.argv[1]))\n"
        "print(json.dumps({'score': len(files), 'feedback': ' '.join(files)}))\n"
    )
    ws, server, box = setup(tmp_path, grader)
    try:
        (ws.root / "extra.py").write_text("x = 1\n")
        (ws.root / "keep.txt").write_text("k\n")
        (ws.root / ".gitattributes").write_text("keep.txt export-ignore\n")
        (ws.root / "__pycache__").mkdir()
        (ws.root / "__pycache__" / "a.pyc").write_bytes(b"\0")
        rc, out, _ = coral(box, "eval", "-m", "add extra")
        assert server.runtime.evals[-1].feedback == ".gitattributes extra.py keep.txt solution.py", out
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("grader", "status", "needle"),
    [
        ("import sys\nsys.stderr.write('Traceback: boom\\n')\nsys.exit(1)\n", "crashed", "Traceback: boom"),
        ("import time\ntime.sleep(30)\n", "timeout", "timed out after 0.5s"),
        ("print('no json here')\n", "crashed", "unreadable"),
        ("import json\nprint(json.dumps({'score': None, 'feedback': 'invalid packing'}))\n", "crashed", "invalid packing"),
    ],
)  # fmt: skip
def test_failed_grading_gives_no_score(tmp_path, grader, status, needle):
    ws, server, box = setup(tmp_path, grader, timeout=0.5)
    try:
        set_value(ws, 2)
        rc, out, _ = coral(box, "eval", "-m", "x")
        ev = server.runtime.evals[-1]
        assert rc == 0 and ev.score is None and ev.status == status and needle in ev.feedback  # Coral: exit 0
        assert "CORAL Eval (#42): FAILED" in out
        rec = json.loads((ws.paths.attempts / f"{ev.commit}.json").read_text())
        assert rec["score"] is None and rec["status"] == status
    finally:
        server.stop()


def test_minimize_direction(tmp_path):
    student = {
        "commit_hash": "a" * 40,
        "agent_id": "agent-1",
        "score": 3.0,
        "status": "improved",
        "timestamp": "2020",
    }
    ws, server, box = setup(tmp_path, direction="minimize", attempts=[student])
    try:
        set_value(ws, 2)
        assert "Status:  improved" in coral(box, "eval", "-m", "lower")[1]
        set_value(ws, 2.5)
        server.runtime.open_turn()
        assert "Status:  regressed" in coral(box, "eval", "-m", "higher")[1]
    finally:
        server.stop()


def test_parse_grader_output():
    assert parse_grader_output('log\n{"score": 1, "feedback": "ok"}\n\n') == (1.0, "ok")
    assert parse_grader_output('{"score": null}') == (None, "")
    with pytest.raises(ValueError):
        parse_grader_output("")


def test_the_socket_bounds_what_it_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(coralmod, "REQUEST_TIMEOUT", 1.0)
    ws, server, _box = setup(tmp_path)
    try:
        big = socket.socket(socket.AF_UNIX)
        big.connect(str(server.socket_path))
        t0 = time.monotonic()
        try:
            big.sendall(b"x" * (8 << 20))  # no newline: the server stops reading past REQUEST_MAX
        except OSError:
            pass
        reply = big.recv(1 << 16)
        assert b"request too large" in reply and time.monotonic() - t0 < 5
        silent = socket.socket(socket.AF_UNIX)
        silent.connect(str(server.socket_path))  # sends nothing: answered once its time is up
        silent.settimeout(10)
        assert b"request not complete within" in silent.recv(1 << 16)
        ok = threading.Event()  # and the server still serves the next one
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(server.socket_path))
        s.sendall(json.dumps({"argv": ["wait", "abc"]}).encode() + b"\n")
        ok.set()
        assert b"No attempt matches" in s.recv(1 << 16)
    finally:
        server.stop()


@pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot create namespaces here")
def test_eval_from_inside_the_sandbox_and_grader_untouchable(tmp_path):
    ws, server, box = setup(tmp_path, sandbox="bwrap")
    try:
        grader = os.path.join(server.runtime.task_cfg["task_dir"], "grader.py")
        agent = section_settings(AgentSettings, {})
        ctx = ToolContext(box=box, toolbox="", bash_timeout=agent.bash_timeout, output_cap=agent.output_cap)
        cmd = f"echo 'print(1)' > {grader}; sed -i s/1.0/7.0/ solution.py && coral eval -m seven && git log --oneline"
        out = execute("bash", json.dumps({"command": cmd}), ctx)
        assert not out.error and "CORAL Eval (#42): 7.0000000000" in out.content, out.content
        assert "coral eval -m seven" not in out.content  # (the stand-in CLI answers what is not the host's)
        assert "seven" in out.content  # the worktree's own git, updated inside the sandbox
        assert "json" in open(grader).read()  # the grader was not overwritten
    finally:
        server.stop()
        UIDS.release(ws.uid)
