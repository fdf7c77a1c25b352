"""A reused knowledge checkout is moved to the fork's commit by its tree diff, or not at all when its index is
already there; either way the next branch sees exactly that commit's files (docs/runtime.md, "Knowledge cost
per edge"). Writes made behind the watch's back (through a hard link from the code tree, after the last
commit) must never reach another branch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from runtime_helpers import make_root, spy_git_calls

from sftree.runtime import coral, safefs
from sftree.runtime import workspace as wsmod
from sftree.runtime.workspace import TreeStore

REC = {"commit_hash": "c1", "score": 1.0, "status": "improved", "timestamp": "2026-01-01T00:00:01"}


@pytest.fixture
def store(tmp_path):
    root = make_root(tmp_path, attempts=[REC])
    st, state = TreeStore.create(tmp_path / "tree", root, {"name": "circle_packing"})
    yield st, state
    st.close()


def _files(d):
    return {str(p.relative_to(d)): (p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(d.rglob("*"))}  # fmt: skip


@pytest.fixture
def calls(monkeypatch):
    return spy_git_calls(monkeypatch)


def _tree(st, commit):
    return wsmod.git(["rev-parse", f"{commit}^{{tree}}"], git_dir=st.knowledge_git).stdout.strip()


def test_fork_moves_a_parked_checkout_by_its_tree_diff(store, calls):
    st, root = store
    fresh = st.fork(root, "e0")  # nothing parked: a full checkout
    expect_root = _files(fresh.knowledge_dir)
    fresh.close()

    calls.clear()
    a = st.fork(root, "e1")  # the parked index is at this very commit: nothing to move
    assert "read-tree" not in calls and "diff-tree" not in calls
    assert _files(a.knowledge_dir) == expect_root
    k = a.knowledge_dir
    (k / "notes" / "a.md").write_text("from a")
    (k / "notes" / "deep" / "er").mkdir(parents=True)
    (k / "notes" / "deep" / "er" / "f.md").write_text("deep")
    (k / "attempts" / "c2.json").write_text(json.dumps({**REC, "commit_hash": "c2", "score": 9.0}))
    (k / "attempts" / "c1.json").unlink()
    calls.clear()
    child = a.state(None)
    # the reported paths (the new folder's files included) committed without git's index: blobs and trees
    # written from the files and the last commit's tree (gittrees.py)
    assert not {"add", "update-index", "write-tree"} & set(calls)
    a.close()

    calls.clear()
    b = st.fork(root, "e2")  # the folder is at the child, its index still at the root: nothing to move
    assert "diff-tree" not in calls and "read-tree" not in calls and "clean" not in calls
    assert _files(b.knowledge_dir) == expect_root
    assert coral.view_for(b.knowledge_dir / "attempts").best("maximize") == 1.0
    assert b.state(None).knowledge_commit == root.knowledge_commit  # nothing left to commit
    b.close()

    calls.clear()
    c = st.fork(child, "e3")  # and forward to the child
    assert "diff-tree" in calls and "read-tree" not in calls
    kc = c.knowledge_dir
    expect_child = _files(kc)
    assert (kc / "notes" / "deep" / "er" / "f.md").read_text() == "deep"
    assert not (kc / "attempts" / "c1.json").exists()
    assert coral.view_for(kc / "attempts").best("maximize") == 9.0
    assert c.state(None).knowledge_commit == child.knowledge_commit
    c.close()
    # the same files as a full checkout of the child's commit in a store with nothing parked
    other = TreeStore(st.tree_dir, {})
    full = other.fork(child, "e4")
    assert _files(full.knowledge_dir) == expect_child
    full.close()


@pytest.mark.parametrize("next_fork", ["same commit", "moved"])
def test_writes_through_a_hard_link_after_the_last_commit_do_not_reach_the_next_branch(store, next_fork):
    """The agent links a knowledge file into its code tree (no event in .opencode for writes through it) and
    writes through the link after the edge's last knowledge commit: the next fork, whether its index was
    already at the target commit or moved there, has the commit's content."""
    st, root = store
    st.fork(root, "e0").close()  # a parked checkout for the forks below
    a = st.fork(root, "e1")
    k = a.knowledge_dir
    (k / "notes" / "a.md").write_text("from a")
    os.link(k / "notes" / "student.md", a.root / "alias.md")
    os.link(k / "attempts" / "c1.json", a.root / "alias.json")
    child = a.state(None)
    (a.root / "alias.md").write_text("LEAKED from e1\n")  # same inode as notes/student.md
    (a.root / "alias.json").write_text(json.dumps({**REC, "score": 1000.0}))
    a.close()
    target = child if next_fork == "same commit" else root
    b = st.fork(target, "e2")
    kb = b.knowledge_dir
    assert (kb / "notes" / "student.md").read_text().startswith("# Student note")
    assert json.loads((kb / "attempts" / "c1.json").read_text())["score"] == 1.0
    assert coral.view_for(kb / "attempts").best("maximize") == 1.0
    assert (kb / "notes" / "a.md").exists() == (next_fork == "same commit")
    after = b.state(None)
    assert after.knowledge_commit == target.knowledge_commit
    assert _tree(st, after.knowledge_commit) == _tree(st, target.knowledge_commit)
    b.close()


def test_a_fork_after_a_failed_commit_does_not_trust_the_index(store, monkeypatch):
    """A knowledge commit that failed part way leaves the index unknown: the next fork moves the checkout
    with read-tree (the whole index), not by a tree diff from a commit the index may not hold."""
    st, root = store
    st.fork(root, "e0").close()
    a = st.fork(root, "e1")
    (a.knowledge_dir / "notes" / "a.md").write_text("from a")
    real = wsmod.git

    def failing(args, **kw):
        if "commit-tree" in args:
            raise wsmod.GitError("simulated failure")
        return real(args, **kw)

    monkeypatch.setattr(wsmod, "git", failing)
    with pytest.raises(wsmod.GitError):
        a.commit_knowledge("fails after staging")
    monkeypatch.setattr(wsmod, "git", real)
    a.close()
    assert st._parked[-1][2] is None
    b = st.fork(root, "e2")
    assert not (b.knowledge_dir / "notes" / "a.md").exists()
    assert b.state(None).knowledge_commit == root.knowledge_commit
    b.close()


def test_untracked_paths_go_without_a_full_clean_when_the_watch_saw_them(store, calls):
    """Paths never staged (excluded names written during the edge; files, links and FIFOs written after its
    last commit) are removed by name at the next fork, with no `git clean` of the folder; a new folder after
    the last commit sends it the full way. The next branch sees exactly its commit's files either way."""
    st, root = store
    fresh = st.fork(root, "e0")
    expect_root = _files(fresh.knowledge_dir)
    fresh.close()
    st.fork(root, "e1").close()  # the first reuse cleans in full (the fresh checkout's watch was new)

    a = st.fork(root, "e2")
    k = a.knowledge_dir
    (k / "plugin").mkdir()
    (k / "plugin" / "x.js").write_text("excluded at the root, never committed")
    (k / "package.json").write_text("{}")
    (k / "notes" / "kept.md").write_text("committed")
    child = a.state(None)
    (k / "notes" / "late.md").write_text("after the last commit")
    os.mkfifo(k / "notes" / "fifo")
    (k / "attempts" / "late.json").symlink_to("/etc/passwd")
    a.close()
    calls.clear()
    b = st.fork(child, "e3")  # the folder is at this commit (its index moves by the diff)
    assert "clean" not in calls and "read-tree" not in calls
    kb = b.knowledge_dir
    assert (kb / "notes" / "kept.md").exists()
    for gone in ("plugin", "package.json", "notes/late.md", "notes/fifo", "attempts/late.json"):
        assert not os.path.lexists(kb / gone), gone
    (kb / "notes" / "newdir").mkdir()
    (kb / "notes" / "newdir" / "f.md").write_text("x")
    b.state(None)  # committed: tracked, nothing left over
    (kb / "skills" / "late").mkdir()
    (kb / "skills" / "late" / "g.md").write_text("a new folder after the last commit: nothing in it tracked")
    b.close()
    calls.clear()
    c = st.fork(root, "e4")  # moved back to the root: the dropped files and the new folder go by name
    assert "clean" not in calls and "diff-tree" in calls
    kc = c.knowledge_dir
    assert _files(kc) == expect_root
    c.state(None)
    shutil.rmtree(kc / "notes")  # a folder holding tracked files, replaced after the last commit
    (kc / "notes").mkdir()
    (kc / "notes" / "other.md").write_text("x")
    c.close()
    calls.clear()
    d = st.fork(root, "e5")
    assert "clean" in calls  # that one git sorts out
    assert _files(d.knowledge_dir) == expect_root
    d.close()


def _loose(st):
    out = wsmod.git(["count-objects", "-v"], git_dir=st.knowledge_git).stdout
    return dict(line.split(": ", 1) for line in out.splitlines())


def test_the_loose_trees_of_index_free_commits_are_packed_past_the_threshold(store):
    """Index-free commits leave their trees loose and uncompressed; at the tree's end the store packs them once
    they pass LOOSE_PACK_KIB, and every commit stays readable."""
    st, root = store
    state = root
    commits = []
    for i in range(3):
        ws = st.fork(state, f"e{i}")
        (ws.knowledge_dir / "attempts" / f"n{i}.json").write_text(json.dumps({**REC, "commit_hash": f"n{i}"}))
        state = ws.state(None)
        commits.append(state.knowledge_commit)
        ws.close()
    before = _loose(st)
    assert int(before["count"]) > 0
    assert st.pack_loose() is False  # a few KiB: under the threshold, left as it is
    assert _loose(st)["count"] == before["count"]
    assert st.pack_loose(min_kib=0) is True
    after = _loose(st)
    assert after["count"] == "0" and int(after["in-pack"]) >= int(before["in-pack"]) + int(before["count"])
    for c in commits:
        names = wsmod.git(
            ["ls-tree", "--name-only", f"{c}:attempts"], git_dir=st.knowledge_git
        ).stdout.split()
        assert "c1.json" in names
    wsmod.git(["fsck", "--strict", "--no-progress"], git_dir=st.knowledge_git)


def test_a_file_the_next_commit_holds_as_a_folder_keeps_that_folders_files(store):
    """A reused checkout moved to a commit where a file became a folder: the move drops the file's entry and
    writes the folder's files; removing the dropped path must not take those files with it."""
    st, root = store
    st.fork(root, "e0").close()
    a = st.fork(root, "e1")
    k = a.knowledge_dir
    (k / "notes" / "student.md").unlink()
    (k / "notes" / "student.md").mkdir()
    (k / "notes" / "student.md" / "x.md").write_text("now a folder")
    child = a.state(None)
    st.fork(root, "e2").close()
    st.fork(root, "e3").close()  # a clean checkout at the root, its watch set up: moved by the tree diff
    c = st.fork(child, "e4")
    assert (c.knowledge_dir / "notes" / "student.md" / "x.md").read_text() == "now a folder"
    assert c.state(None).knowledge_commit == child.knowledge_commit
    c.close()
    a.close()


def test_a_submodule_leaving_the_tree_sends_the_move_to_read_tree(store, calls):
    """A nested repository the agent committed (a gitlink entry) is left to `read-tree`, whether it comes or
    goes; the next branch sees exactly its commit's files."""
    st, root = store
    fresh = st.fork(root, "e0")
    expect_root = _files(fresh.knowledge_dir)
    fresh.close()
    a = st.fork(root, "e1")
    sub = a.knowledge_dir / "notes" / "sub"
    sub.mkdir()
    ident = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(sub)], check=True)
    (sub / "f.md").write_text("x")
    subprocess.run(["git", "-C", str(sub), *ident, "add", "f.md"], check=True)
    subprocess.run(["git", "-C", str(sub), *ident, "commit", "-qm", "m"], check=True)
    child = a.state(None)
    tree = wsmod.git(["ls-tree", "-r", child.knowledge_commit, "notes"], git_dir=st.knowledge_git).stdout
    assert "160000" in tree  # committed as a gitlink
    a.close()
    calls.clear()
    b = st.fork(root, "e2")  # the parked checkout's index is at the child: the gitlink goes
    assert "diff-tree" in calls and "read-tree" in calls
    assert _files(b.knowledge_dir) == expect_root
    b.close()


def test_a_file_growing_past_the_blob_limit_while_read_is_left_to_git(tmp_path, monkeypatch):
    """The size seen before reading does not bound the read: a file still growing is read only up to the limit,
    then left to git's way."""
    repo = tmp_path / "k.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "small").write_bytes(b"12345678")
    (tmp_path / "d" / "big").write_bytes(b"x" * 20)
    monkeypatch.setattr(wsmod, "MAX_BLOB", 10)
    with safefs.open_dir(tmp_path, "d") as dfd:
        oid = subprocess.run(
            ["git", "hash-object", str(tmp_path / "d" / "small")], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert wsmod._blob_of(repo, dfd, "small") == ("100644", oid)
        real = os.fstat

        def small_size(fd):  # the size as it was before the file grew
            r = real(fd)
            return os.stat_result((r.st_mode, r.st_ino, r.st_dev, r.st_nlink, r.st_uid, r.st_gid, 5, 0, 0, 0))

        monkeypatch.setattr(wsmod.os, "fstat", small_size)
        with pytest.raises(wsmod._NotPlain):
            wsmod._blob_of(repo, dfd, "big")


def test_a_name_that_is_no_utf8_is_moved_restored_and_dropped_like_any_other(store):
    """A committed file whose name is no UTF-8: edited after the last commit, the next fork at that commit
    restores it; a fork moved back to the root drops it; a fork moved forward writes it."""
    st, root = store
    st.fork(root, "e0").close()
    st.fork(root, "e1").close()  # a reused checkout, its watch set up
    a = st.fork(root, "e2")
    bad = os.path.join(os.fsencode(a.knowledge_dir / "notes"), b"\xff.md")
    with open(bad, "w") as fh:
        fh.write("committed")
    child = a.state(None)
    with open(bad, "w") as fh:
        fh.write("after the last commit")
    a.close()
    b = st.fork(child, "e3")
    with open(os.path.join(os.fsencode(b.knowledge_dir / "notes"), b"\xff.md")) as fh:
        assert fh.read() == "committed"
    assert b.state(None).knowledge_commit == child.knowledge_commit
    b.close()
    c = st.fork(root, "e4")
    assert b"\xff.md" not in os.listdir(os.fsencode(c.knowledge_dir / "notes"))
    assert c.state(None).knowledge_commit == root.knowledge_commit
    c.close()
    d = st.fork(child, "e5")
    with open(os.path.join(os.fsencode(d.knowledge_dir / "notes"), b"\xff.md")) as fh:
        assert fh.read() == "committed"
    d.close()
