"""Forkable workspaces: store seeding, forks, isolation, commits, diffs, cleanup (issue 3, item 1)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from runtime_helpers import make_root

from sftree.errors import InputError
from sftree.runtime.workspace import NodeState, TreeStore, git


@pytest.fixture
def store(tmp_path):
    root = make_root(tmp_path)
    st, state = TreeStore.create(tmp_path / "tree", root, {"name": "circle_packing"})
    yield st, state
    st.close()


def test_seed_and_fork_layout(store):
    st, root = store
    assert root.session is None
    ws = st.fork(root, "e1")
    assert ws.root == st.tree_dir / "work" / "e1" / "code"
    assert (ws.root / "solution.py").is_file()
    assert (ws.root / ".opencode" / "notes" / "student.md").read_text().startswith("# Student note")
    for sub in ("notes", "skills", "attempts", "roles", "logs"):
        assert (ws.root / ".opencode" / sub).is_dir()
    assert ws.head() == root.code_commit
    # the knowledge folder is not part of the code: nothing to commit right after a fork
    (ws.root / "AGENTS.md").write_text("x")
    (ws.root / ".opencode" / "notes" / "new.md").write_text("y")
    assert ws.commit_code("nothing") is None


def test_two_forks_are_isolated_and_commits_recorded(store):
    st, root = store
    a, b = st.fork(root, "e1"), st.fork(root, "e2")
    (a.root / "solution.py").write_text("ROWS = 9\n")
    (a.knowledge_dir / "notes" / "from_a.md").write_text("a")
    assert (b.root / "solution.py").read_text() != "ROWS = 9\n"
    assert not (b.knowledge_dir / "notes" / "from_a.md").exists()
    sha = a.commit_code("set rows")
    assert sha and sha != root.code_commit
    assert git(["rev-parse", f"{sha}^"], cwd=a.root).stdout.strip() == root.code_commit
    child = a.state("sessions/e1.json")
    assert child.code_commit == sha and child.knowledge_commit != root.knowledge_commit
    code_diff = st.diff("code", root.code_commit, child.code_commit)
    assert "+ROWS = 9" in code_diff
    kdiff = st.diff("knowledge", root.knowledge_commit, child.knowledge_commit)
    assert "notes/from_a.md" in kdiff and "student.md" not in kdiff
    # b still sees the root state; a fork of a's child sees a's changes
    assert b.state(None) == NodeState(root.code_commit, root.knowledge_commit, None)
    (st.tree_dir / "sessions").mkdir()
    (st.tree_dir / "sessions" / "e1.json").write_text('[{"role": "user", "content": "hi"}]')
    c = st.fork(child, "e3")
    assert c.session == [{"role": "user", "content": "hi"}]
    assert (c.root / "solution.py").read_text() == "ROWS = 9\n"
    assert (c.knowledge_dir / "notes" / "from_a.md").read_text() == "a"


def test_commits_are_deterministic(tmp_path):
    root = make_root(tmp_path)
    s1, r1 = TreeStore.create(tmp_path / "t1", root, {})
    s2, r2 = TreeStore.create(tmp_path / "t2", root, {})
    assert r1 == r2
    shas = []
    for st, r in ((s1, r1), (s2, r2)):
        ws = st.fork(r, "e1")
        (ws.root / "solution.py").write_text("ROWS = 3\n")
        shas.append(ws.commit_code("m"))
    assert shas[0] == shas[1]


def test_create_is_idempotent_and_open_resumes(store, tmp_path):
    st, root = store
    again, root2 = TreeStore.create(st.tree_dir, tmp_path / "does-not-matter", {})
    assert root2 == root
    assert TreeStore.open(st.tree_dir, {}).root_state() == root
    with pytest.raises(InputError, match="no tree store"):
        TreeStore.open(tmp_path / "nowhere", {})


def test_missing_code_folder_is_an_input_error(tmp_path):
    (tmp_path / "root").mkdir()
    with pytest.raises(InputError, match="no code/ folder"):
        TreeStore.create(tmp_path / "tree", tmp_path / "root", {})


def test_cleanup_stale_and_close(store):
    st, root = store
    st.fork(root, "e1")
    st.fork(root, "e2")
    st.cleanup_stale(keep={"e2"})
    assert not (st.work_dir / "e1").exists() and (st.work_dir / "e2" / "code").is_dir()
    # a killed run's leftover folder is replaced by a fresh fork under the same id
    ws = st.fork(root, "e2")
    assert ws.head() == root.code_commit
    st.close()
    assert list(st.work_dir.iterdir()) == []
    listing = subprocess.run(
        ["git", "--git-dir", str(st.code_git), "worktree", "list"], capture_output=True, text=True
    ).stdout
    assert "work/e" not in listing


def test_opencode_housekeeping_is_not_knowledge(store):
    st, root = store
    ws = st.fork(root, "e1")
    (ws.knowledge_dir / "package.json").write_text("{}")
    (ws.knowledge_dir / "node_modules" / "x").mkdir(parents=True)
    (ws.knowledge_dir / "node_modules" / "x" / "index.js").write_text("1")
    assert ws.commit_knowledge("no change") == root.knowledge_commit
    (ws.knowledge_dir / "skills" / "s").mkdir(parents=True)
    (ws.knowledge_dir / "skills" / "s" / "SKILL.md").write_text("# skill")
    assert ws.commit_knowledge("skill") != root.knowledge_commit


def _files(d):
    return {str(p.relative_to(d)): (p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(d.rglob("*"))}  # fmt: skip


def test_reused_knowledge_checkout_is_exactly_the_target(store):
    """A closed edge's knowledge checkout is moved into the next fork and brought to that fork's commit: the
    files are those of a fresh checkout, whatever the last agent left there (edits after its last commit, new,
    ignored, deleted files, links)."""
    st, root = store
    fresh = st.fork(root, "e0")  # nothing parked yet: a full checkout
    expect = _files(fresh.knowledge_dir)
    fresh.close()
    assert len(st._parked) == 1
    a = st.fork(root, "e1")
    assert not st._parked and _files(a.knowledge_dir) == expect  # the parked one, reused
    k = a.knowledge_dir
    (k / "notes" / "a.md").write_text("from a")
    child = a.state(None)
    (k / "notes" / "student.md").write_text("edited after the last commit")  # same path in both commits
    (k / "notes" / "a.md").unlink()
    (k / "plugin").mkdir()
    (k / "plugin" / "x.js").write_text("ignored, never committed")
    (k / "link").symlink_to("/etc")
    a.close()
    b = st.fork(root, "e2")
    assert _files(b.knowledge_dir) == expect
    assert b.state(None) == NodeState(root.code_commit, root.knowledge_commit, None)
    b.close()
    c = st.fork(child, "e3")  # and to a child's commit: its new file is there
    assert (c.knowledge_dir / "notes" / "a.md").read_text() == "from a"
    assert (c.knowledge_dir / "notes" / "student.md").read_text().startswith("# Student note")
    # a knowledge folder the agent replaced by a link is not kept
    c_k = c.knowledge_dir
    shutil.rmtree(c_k)
    c_k.symlink_to(st.tree_dir)
    c.close()
    assert not st._parked
