"""`coral` in the workspace: eval (commit, clean-checkout grading, attempt record, block), log/show/notes."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from runtime_helpers import TOY_GRADER, make_task

from sftree.agents.tools import ToolContext, execute
from sftree.runtime.coral import CoralServer, parse_block, parse_grader_output
from sftree.runtime.sandbox import bwrap_works
from sftree.runtime.workspace import TreeStore


def setup(tmp_path, grader=TOY_GRADER, attempts=(), **task_kw):
    root = tmp_path / "root"
    (root / "code").mkdir(parents=True)
    (root / "code" / "solution.py").write_text("VALUE = 1.0\n")
    (root / "shared" / "attempts").mkdir(parents=True)
    for a in attempts:
        (root / "shared" / "attempts" / f"{a['commit_hash']}.json").write_text(json.dumps(a))
    task = make_task(tmp_path, grader, **task_kw)
    store, state = TreeStore.create(tmp_path / "tree", root, task)
    ws = store.fork(state, "e1")
    server = CoralServer(ws, task, eval_count=41, agent_id="teacher-e1")
    server.start()
    return ws, server


def coral(server, ws, *argv):
    env = {**os.environ, **server.env()}
    p = subprocess.run(
        [str(server.bin_dir / "coral"), *argv],
        cwd=ws.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return p.returncode, p.stdout + p.stderr


@pytest.fixture
def toy(tmp_path):
    ws, server = setup(
        tmp_path,
        attempts=[
            {"commit_hash": "f" * 40, "score": 3.0, "status": "improved", "timestamp": "2020-01-01T00:00:00"}
        ],
    )
    yield ws, server
    server.stop()


def set_value(ws, v):
    (ws.root / "solution.py").write_text(f"VALUE = {v}\n")


def test_eval_commits_grades_and_records(toy):
    ws, server = toy
    set_value(ws, 2.5)
    rc, out = coral(server, ws, "eval", "-m", "try", "2.5")
    block = parse_block(out)
    assert rc == 0 and block["number"] == 42 and block["score"] == 2.5 and block["status"] == "regressed"
    assert "Status: regressed (previous best 3)" in out and "Feedback: value is 2.5" in out
    commit = block["commit"]
    assert commit == ws.head()
    rec = json.loads((ws.knowledge_dir / "attempts" / f"{commit}.json").read_text())
    assert rec["title"] == "try 2.5" and rec["score"] == 2.5 and rec["agent_id"] == "teacher-e1"
    assert rec["parent_hash"] == ws.parent.code_commit and rec["status"] == "regressed"
    assert set(rec) >= {
        "commit_hash",
        "agent_id",
        "title",
        "score",
        "status",
        "parent_hash",
        "timestamp",
        "feedback",
    }
    set_value(ws, 4)
    rc, out = coral(server, ws, "eval", "-m", "four")
    assert parse_block(out)["number"] == 43 and "Status: improved (previous best 3)" in out
    assert [e.score for e in server.runtime.evals] == [2.5, 4.0]
    rc, out = coral(server, ws, "eval", "-m", "again")
    assert (
        rc == 1
        and out.startswith("Nothing to commit")
        and server.runtime.evals[-1].status == "nothing_to_commit"
    )
    assert len(list((ws.knowledge_dir / "attempts").glob("*.json"))) == 3  # the Student's + 2
    rc, out = coral(server, ws, "log")
    assert rc == 0 and "3 attempts" in out and "best 4" in out and "four" in out
    rc, out = coral(server, ws, "show", commit[:8])
    assert rc == 0 and '"title": "try 2.5"' in out and "solution.py" in out
    (ws.knowledge_dir / "notes").mkdir(exist_ok=True)
    (ws.knowledge_dir / "notes" / "idea.md").write_text("# Bigger VALUE helps\n")
    assert "Bigger VALUE helps" in coral(server, ws, "notes")[1]
    assert coral(server, ws, "frobnicate")[0] == 2


def test_grader_sees_a_clean_checkout_not_the_workspace(tmp_path):
    grader = (
        "import json, os, sys\nfiles = sorted(os.listdir(sys.argv[1]))\n"
        "print(json.dumps({'score': len(files), 'feedback': ' '.join(files)}))\n"
    )
    ws, server = setup(tmp_path, grader)
    try:
        (ws.root / "extra.py").write_text("x = 1\n")
        (ws.root / "__pycache__").mkdir()
        (ws.root / "__pycache__" / "a.pyc").write_bytes(b"\0")
        rc, out = coral(server, ws, "eval", "-m", "add extra")
        # .opencode, AGENTS.md and __pycache__ are not part of the code
        assert parse_block(out)["feedback"] == "extra.py solution.py" and "Status: baseline" in out
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("grader", "status", "needle"),
    [
        ("import sys\nsys.stderr.write('Traceback: boom\\n')\nsys.exit(1)\n", "crashed", "Traceback: boom"),
        ("import time\ntime.sleep(30)\n", "timeout", "timed out after 0.5s"),
        ("print('no json here')\n", "crashed", "unreadable"),
        (
            "import json\nprint(json.dumps({'score': None, 'feedback': 'invalid packing'}))\n",
            "crashed",
            "invalid packing",
        ),
    ],
)
def test_failed_grading_gives_no_score(tmp_path, grader, status, needle):
    ws, server = setup(tmp_path, grader, timeout=0.5)
    try:
        set_value(ws, 2)
        rc, out = coral(server, ws, "eval", "-m", "x")
        ev = server.runtime.evals[-1]
        assert rc == 1 and ev.score is None and ev.status == status and needle in ev.feedback
        assert "CORAL Eval (#42): FAILED" in out
        rec = json.loads((ws.knowledge_dir / "attempts" / f"{ev.commit}.json").read_text())
        assert rec["score"] is None and rec["status"] == status
    finally:
        server.stop()


def test_missing_grader_is_crashed(tmp_path):
    ws, server = setup(tmp_path)
    try:
        os.unlink(os.path.join(server.runtime.task_cfg["task_dir"], "grader.py"))
        set_value(ws, 2)
        coral(server, ws, "eval", "-m", "x")
        ev = server.runtime.evals[-1]
        assert ev.status == "crashed" and "grader.py" in ev.feedback
    finally:
        server.stop()


def test_minimize_direction(tmp_path):
    ws, server = setup(
        tmp_path,
        direction="minimize",
        attempts=[{"commit_hash": "a" * 40, "score": 3.0, "timestamp": "2020"}],
    )
    try:
        set_value(ws, 2)
        assert "Status: improved (previous best 3)" in coral(server, ws, "eval", "-m", "lower")[1]
        set_value(ws, 2.5)
        assert "Status: regressed (previous best 2)" in coral(server, ws, "eval", "-m", "higher")[1]
    finally:
        server.stop()


def test_parse_grader_output():
    assert parse_grader_output('log\n{"score": 1, "feedback": "ok"}\n\n') == (1.0, "ok")
    assert parse_grader_output('{"score": null}') == (None, "")
    with pytest.raises(ValueError):
        parse_grader_output("")


@pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot create namespaces here")
def test_eval_from_inside_the_sandbox_and_grader_untouchable(tmp_path):
    ws, server = setup(tmp_path)
    try:
        grader = os.path.join(server.runtime.task_cfg["task_dir"], "grader.py")
        ctx = ToolContext(
            root=ws.root.resolve(),
            sandbox="bwrap",
            coral_env=server.env(),
            coral_dir=server.dir,
            hidden=[tmp_path / "tree" / "store", tmp_path / "task"],
        )
        cmd = f"echo 'print(1)' > {grader}; sed -i s/1.0/7.0/ solution.py && coral eval -m seven"
        out = execute("bash", json.dumps({"command": cmd}), ctx)
        assert not out.error and "CORAL Eval (#42): 7" in out.content, out.content
        assert "json" in open(grader).read()  # the grader was not overwritten
    finally:
        server.stop()
