"""The store and its workspaces: seeding, forks, isolation, host-made commits, the agent's own repository, the
reused attempt records, cleanup (runtime/store.py, workspace.py, folderreader.py, checkout.py, agentrepo.py)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import replace

import pytest
from helpers.runtime import make_root

from sftree.errors import InputError
from sftree.runtime import checkout, folderreader
from sftree.runtime.agentrepo import INIT_SCRIPT, UPDATE_SCRIPT, read_head
from sftree.runtime.folderreader import FolderReader, Quota, QuotaExceeded
from sftree.runtime.objects import flatten, git, git_env
from sftree.runtime.store import TreeStore
from sftree.runtime.workspace import CORAL_ITEMS, NodeState, code_skip, write_world
from sftree.settings import AgentSettings, schema_defaults

QUOTA = Quota.from_settings(schema_defaults(AgentSettings).quota)  # the schema's agent.quota

INSIDE = "/workspace/results/circle_packing"


@pytest.fixture
def store(tmp_path):
    root = make_root(tmp_path)
    st, state = TreeStore.create(tmp_path / "tree", root, {"name": "circle_packing"})
    yield st, state
    st.close()


def files_of(st, commit, repo="code"):
    db = st.code if repo == "code" else st.knowledge
    return flatten(db, db.commit_tree(commit))


def test_seed_and_fork_layout(store):
    st, root = store
    assert root.session is None and root.counters is None
    ws = st.fork(root, "e1", agent_id="agent-2", inside=INSIDE)
    assert ws.root == st.tree_dir / "work" / "e1" / "run" / "agents" / "agent-2"
    assert (ws.root / "solution.py").is_file()
    assert (ws.knowledge_dir / "notes" / "student.md").read_text().startswith("# Student note")
    assert all((ws.knowledge_dir / item).is_dir() for item in CORAL_ITEMS)
    assert ws.paths.attempts == ws.paths.edge / "attempts"  # outside run/: shown read-only in the sandbox
    write_world(ws, {"AGENTS.md": b"instructions\n"})
    assert (ws.root / ".coral_dir").read_text() == f"{INSIDE}/.coral"
    assert (ws.root / ".coral_agent_id").read_text() == "agent-2"
    assert os.readlink(ws.root / ".opencode" / "notes") == "../../../.coral/public/notes"
    assert (ws.root / ".opencode" / "notes" / "student.md").is_file()  # the link leads to the knowledge
    # What Coral keeps out of a commit, and the knowledge, are not code: nothing to commit after a fork.
    (ws.knowledge_dir / "notes" / "new.md").write_text("y")
    (ws.root / "__pycache__").mkdir()
    (ws.root / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert ws.commit_code("nothing")[0] is None


def test_two_forks_are_isolated_and_commits_recorded(store):
    st, root = store
    a = st.fork(root, "e1", agent_id="agent-1", inside=INSIDE)
    b = st.fork(root, "e2", agent_id="agent-1", inside=INSIDE)
    (a.root / "solution.py").write_text("ROWS = 9\n")
    (a.knowledge_dir / "notes" / "from_a.md").write_text("a")
    assert (b.root / "solution.py").read_text() != "ROWS = 9\n"
    assert not (b.knowledge_dir / "notes" / "from_a.md").exists()
    sha, info = a.commit_code("set rows")
    assert sha and sha != root.code_commit and info.read >= 1
    assert git(st.code_git, ["rev-parse", f"{sha}^"]).strip() == root.code_commit
    a.graded.append(sha)
    child = a.state("sessions/e1.json", counters={"agent_id": "agent-1", "global_evals": 6, "agent_evals": 1})
    assert child.code_commit == sha and child.knowledge_commit != root.knowledge_commit
    assert NodeState.from_dict(child.to_dict()) == child
    assert "+ROWS = 9" in st.diff("code", root.code_commit, child.code_commit)
    kdiff = st.diff("knowledge", root.knowledge_commit, child.knowledge_commit)
    assert "notes/from_a.md" in kdiff and "student.md" not in kdiff
    assert b.state(None) == NodeState(root.code_commit, root.knowledge_commit, None)
    (st.tree_dir / "sessions").mkdir()
    (st.tree_dir / "sessions" / "e1.json").write_text('[{"role": "user", "content": "hi"}]')
    c = st.fork(child, "e3", agent_id="agent-1", inside=INSIDE)
    assert c.session == [{"role": "user", "content": "hi"}]
    assert (c.root / "solution.py").read_text() == "ROWS = 9\n"
    assert (c.knowledge_dir / "notes" / "from_a.md").read_text() == "a"
    assert git(st.code_git, ["fsck", "--strict", "--no-dangling"], check=True) is not None


def test_commits_are_deterministic_and_equal_to_gits(tmp_path):
    ids = []
    for i in range(2):
        st, root = TreeStore.create(tmp_path / f"t{i}", make_root(tmp_path / f"r{i}"), {})
        ids.append(root)
        st.close()
    assert ids[0] == ids[1]
    # the same files committed by git itself give the same tree
    repo = tmp_path / "plain"
    env = {**git_env(), "GIT_INDEX_FILE": str(tmp_path / "idx")}
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True, env=env)
    src = tmp_path / "r0" / "root-circle_packing" / "code"
    subprocess.run(["git", f"--git-dir={repo}", f"--work-tree={src}", "add", "-A"], check=True, env=env)
    tree = subprocess.run(
        ["git", f"--git-dir={repo}", "write-tree"], check=True, env=env, capture_output=True, text=True
    ).stdout.strip()
    commit = subprocess.run(
        ["git", f"--git-dir={repo}", "commit-tree", tree, "-m", "sftree: root snapshot code"],
        check=True, env=env, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    assert commit == ids[0].code_commit


def test_create_is_idempotent_and_open_resumes(store, tmp_path):
    st, root = store
    again, root2 = TreeStore.create(st.tree_dir, make_root(tmp_path / "other"), {})
    assert root2 == root
    assert TreeStore.open(st.tree_dir, {}).root_state() == root


def test_missing_code_folder_is_an_input_error(tmp_path):
    (tmp_path / "snap").mkdir()
    with pytest.raises(InputError, match="no code/ folder"):
        TreeStore.create(tmp_path / "tree", tmp_path / "snap", {})


def test_cleanup_stale_and_close(store):
    st, root = store
    ws = st.fork(root, "e1", agent_id="agent-1", inside=INSIDE)
    (ws.root / "deep").mkdir()
    st.cleanup_stale(keep={"e1"})
    assert ws.root.exists()
    st.cleanup_stale(keep=set())
    assert not ws.paths.edge.exists()


def test_the_root_is_read_without_following_links_or_blocking(tmp_path):
    """The Student's files are as untrusted as the Teacher's: a link is stored as a link, a FIFO is skipped
    without being opened for long, `.git` folders are left out."""
    root = make_root(tmp_path)
    code = root / "code"
    os.symlink("/etc/passwd", code / "passwd")
    os.mkfifo(code / "pipe")
    (code / "sub" / ".git").mkdir(parents=True)
    (code / "sub" / ".git" / "config").write_text('[filter "x"]\n\tclean = touch /tmp/ran\n')
    (code / "sub" / "f").write_text("hello\n")
    done = []
    t = threading.Thread(target=lambda: done.append(TreeStore.create(tmp_path / "tree", root, {})))
    t.start()
    t.join(30)
    assert done, "the import blocked"
    st, state = done[0]
    files = files_of(st, state.code_commit)
    assert files["passwd"][0] == "120000" and "pipe" not in files and "sub/f" in files
    assert not any(p.startswith("sub/.git") for p in files)
    assert st.code.read(files["passwd"][1])[1] == b"/etc/passwd"
    st.close()


def test_snapshot_takes_what_git_would_and_reads_only_what_changed(tmp_path):
    st, root = TreeStore.create(tmp_path / "tree", make_root(tmp_path), {})
    ws = st.fork(root, "e1", agent_id="agent-1", inside=INSIDE)
    (ws.root / "run.sh").write_text("#!/bin/sh\n")
    (ws.root / "run.sh").chmod(0o755)
    (ws.root / "nested" / "AGENTS.md").parent.mkdir()
    (ws.root / "nested" / "AGENTS.md").write_text("kept: only the top one is Coral's\n")
    (ws.root / "empty").mkdir()
    (ws.root / "bad\udcff").write_text("not UTF-8")  # a name git would keep and the host cannot sort
    sha, info = ws.commit_code("x")
    files = files_of(st, sha)
    assert files["run.sh"][0] == "100755" and "nested/AGENTS.md" in files and "empty" not in files
    assert info.skipped == ["bad\ufffd"]
    time.sleep(folderreader.RACY_NS / 1e9 + 0.05)
    _files, again = ws._code_reader.files(ws.root)  # keys older than the racy window: kept
    _files, third = ws._code_reader.files(ws.root)
    assert third.read == 0 and again.files == third.files
    # Same size, mtime put back: the ctime still tells, so the content is read again.
    p = ws.root / "solution.py"
    st_before = p.stat()
    p.write_text(p.read_text().replace("GROW_PASSES = 0", "GROW_PASSES = 9"))
    os.utime(p, ns=(st_before.st_atime_ns, st_before.st_mtime_ns))
    files2, info2 = ws._code_reader.files(ws.root)
    assert info2.read == 1 and b"GROW_PASSES = 9" in st.code.read(files2["solution.py"][1])[1]
    st.close()


def test_a_write_through_a_hard_link_is_in_the_next_commit_and_no_other_branch(tmp_path):
    """No event stream to miss it: the next snapshot compares every file's stat key, and ctime moves."""
    st, root = TreeStore.create(tmp_path / "tree", make_root(tmp_path), {})
    ws = st.fork(root, "e1", agent_id="agent-1", inside=INSIDE)
    ws.commit_knowledge("first")
    time.sleep(folderreader.RACY_NS / 1e9 + 0.05)
    ws.commit_knowledge("cache warm")
    os.link(ws.knowledge_dir / "notes" / "student.md", ws.root / "hl")
    with open(ws.root / "hl", "a") as fh:
        fh.write("written through a link\n")
    k = ws.commit_knowledge("after")
    text = st.knowledge.read(files_of(st, k, "knowledge")["notes/student.md"][1])[1]
    assert b"written through a link" in text
    other = st.fork(root, "e2", agent_id="agent-1", inside=INSIDE)
    assert "written through" not in (other.knowledge_dir / "notes" / "student.md").read_text()
    st.close()


def test_quota_bounds_what_the_host_reads(tmp_path):
    st, root = TreeStore.create(tmp_path / "tree", make_root(tmp_path), {})
    ws = st.fork(root, "e1", agent_id="agent-1", inside=INSIDE)
    with open(ws.root / "sparse.bin", "wb") as fh:
        fh.truncate(200 << 20)  # 200 MiB, nothing on disk
    reader = FolderReader(st.code, replace(QUOTA, file_bytes=64 << 20), code_skip)
    with pytest.raises(QuotaExceeded, match="sparse.bin is larger than 64 MiB"):
        reader.snapshot(ws.root)
    (ws.root / "sparse.bin").unlink()
    d = ws.root
    for _ in range(70):
        d = d / "d"
    d.mkdir(parents=True)
    with pytest.raises(QuotaExceeded, match="deeper than 64"):
        reader.snapshot(ws.root)
    with pytest.raises(QuotaExceeded, match="more than 10 files"):
        FolderReader(st.code, replace(QUOTA, files=10), code_skip).snapshot(ws.root)
    st.close()


def _agent_git(ws, script: str, stream, exclude: str = "") -> subprocess.CompletedProcess:
    """`script` in the worktree reading the import stream (`repo_update`'s file) as its stdin."""
    env = {**git_env(), "SFTREE_EXCLUDE": exclude}
    with stream:
        return subprocess.run(
            ["/bin/sh", "-c", script], cwd=ws.root, stdin=stream, env=env, capture_output=True
        )


def test_the_agents_repository_holds_the_hosts_commits_with_their_ids(tmp_path):
    st, root = TreeStore.create(tmp_path / "tree", make_root(tmp_path), {})
    ws = st.fork(root, "e1", agent_id="agent-1", inside=INSIDE)
    (ws.root / 'odd "name"\n.txt').write_text("quoted\n")
    c1, _ = ws.commit_code("one")
    (ws.root / "solution.py").write_text("VALUE = 2\n")
    (ws.root / 'odd "name"\n.txt').unlink()
    c2, _ = ws.commit_code("two\n\nwith a body")
    # A fork at c2 gives the worktree a repository of the whole chain, made by git itself.
    ws2 = st.fork(NodeState(c2, root.knowledge_commit), "e2", agent_id="agent-1", inside=INSIDE)
    write_world(ws2, {"AGENTS.md": b"x"})
    res = _agent_git(
        ws2,
        INIT_SCRIPT,
        ws2.repo_update(c2, None),
        exclude="AGENTS.md\n.opencode/\n.coral_dir\n.coral_agent_id\n",
    )
    assert res.returncode == 0, res.stderr
    log = subprocess.run(
        ["git", "log", "--format=%H"], cwd=ws2.root, capture_output=True, text=True, env=git_env()
    )
    assert log.stdout.split() == [c2, c1, root.code_commit]
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ws2.root, capture_output=True, text=True)
    assert status.stdout == ""
    assert read_head(ws2.root) == c2
    # A commit made after the fork reaches it by an update stream from what it holds.
    (ws2.root / "solution.py").write_text("VALUE = 3\n")
    c3, _ = ws2.commit_code("three")
    res = _agent_git(ws2, UPDATE_SCRIPT, ws2.repo_update(c3, c2))
    assert res.returncode == 0, res.stderr
    assert read_head(ws2.root) == c3 == ws2.parent_for_commit()
    # After a `coral checkout` of an older commit (git inside), the next commit follows it.
    subprocess.run(["git", "reset", "-q", "--hard", c1], cwd=ws2.root, check=True, env=git_env())
    assert ws2.parent_for_commit() == c1
    (ws2.root / "x.txt").write_text("x\n")
    c4, _ = ws2.commit_code("four")
    assert st.code.commit(c4)[1] == [c1]
    # A head the host does not know is not taken.
    (ws2.root / ".git" / "HEAD").write_text("0" * 40 + "\n")
    assert ws2.parent_for_commit() == c4
    st.close()


def test_a_fork_reuses_parked_attempt_records_moved_by_the_difference(tmp_path, monkeypatch):
    attempts = [
        {"commit_hash": f"{i:040x}", "score": i, "status": "improved", "agent_id": "agent-1"}
        for i in range(50)
    ]
    st, root = TreeStore.create(tmp_path / "tree", make_root(tmp_path, attempts=attempts), {})
    a = st.fork(root, "e1", agent_id="agent-1", inside=INSIDE)
    a.write_attempt("a" * 40, b'{"score": 1}\n')
    child = a.state(None)
    a.close()
    moved = []
    real = checkout.apply_difference
    monkeypatch.setattr(
        checkout, "apply_difference", lambda *x, **k: moved.append(real(*x, **k)) or moved[-1]
    )
    b = st.fork(root, "e2", agent_id="agent-1", inside=INSIDE)  # the root: one record fewer than e1 left
    assert moved == [1]
    want = files_of(st, root.knowledge_commit, "knowledge")
    have = {p.name: p.read_bytes() for p in b.paths.attempts.iterdir()}
    assert have == {
        p[len("attempts/") :]: st.knowledge.read(v[1])[1]
        for p, v in want.items()
        if p.startswith("attempts/")
    }
    b.close()
    c = st.fork(child, "e3", agent_id="agent-1", inside=INSIDE)
    assert (c.paths.attempts / ("a" * 40 + ".json")).read_bytes() == b'{"score": 1}\n'
    st.close()
