"""Incremental knowledge bookkeeping (attempts.py, kwatch.py): the host's view of the attempt records and of
"did the knowledge change" stays right while a hostile agent writes, deletes, renames and links files under
`.opencode/`, and it costs what changed (records read), not what is there."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from runtime_helpers import make_root

from sftree.runtime import attempts as attemptsmod
from sftree.runtime import coral, kwatch
from sftree.runtime.workspace import TreeStore

pytestmark = pytest.mark.skipif(kwatch._LIBC is None, reason="needs inotify (Linux)")


def rec(sha, score, status="regressed", ts="2026-01-01T00:00:00"):
    return {"commit_hash": sha, "score": score, "status": status, "timestamp": ts, "title": f"try {sha}"}


def write(d, name, data):
    (d / name).write_text(json.dumps(data) if not isinstance(data, str) else data)


def reference(ws_root):
    """What a from-scratch scan (the one-off path, no watch) says: the ground truth."""
    full = attemptsmod.AttemptView(ws_root).refresh()  # no watch: a full scan
    return summary(full)


def summary(v):
    return (
        [(i.name, i.commit_hash, i.score, i.status) for i in v.last()],
        v.best("maximize"),
        v.best("minimize"),
        v.best("maximize", exclude="c3"),
        v.since_improvement(),
    )


@pytest.fixture
def ws(tmp_path):
    root = make_root(
        tmp_path,
        attempts=[
            rec("c1", 1.0, "baseline", "2026-01-01T00:00:01"),
            rec("c2", 3.0, "improved", "2026-01-01T00:00:02"),
            rec("c3", 5.0, "improved", "2026-01-01T00:00:03"),
            rec("c4", 2.0, "regressed", "2026-01-01T00:00:04"),
        ],
    )
    st, state = TreeStore.create(tmp_path / "tree", root, {})
    w = st.fork(state, "e1")
    yield st, state, w
    st.close()


def test_queries_match_hand_computed_values(ws):
    _st, _state, w = ws
    v = coral.view_for(w.knowledge_dir / "attempts")
    assert v is w.attempt_view  # the workspace's own, registered view
    assert [i.commit_hash for i in v.last()] == ["c1", "c2", "c3", "c4"]  # Coral's order: by timestamp
    assert [i.commit_hash for i in v.last(2)] == ["c3", "c4"]
    assert v.best("maximize") == 5.0 and v.best("minimize") == 1.0
    assert v.best("maximize", exclude="c3") == 3.0  # the commit being graded is not its own previous best
    assert v.since_improvement() == 1  # c4 regressed after c3 improved
    assert v.find("c2").title == "try c2" and v.find("zz") is None


def test_hostile_edits_between_loads_are_seen_and_links_never_followed(ws, tmp_path):
    _st, _state, w = ws
    att = w.knowledge_dir / "attempts"
    v = coral.view_for(att)
    assert v.full_scans == 1
    reads = v.reads
    secret = tmp_path / "outside.json"
    secret.write_text(json.dumps(rec("leak", 99.0, "improved", "2027")))

    def check():
        got = summary(coral.view_for(att))
        assert got == reference(w.root)
        return got

    write(att, "c5.json", rec("c5", 4.0, "regressed", "2026-01-01T00:00:05"))
    assert check()[4] == 2
    # in place, same size, mtime set back: an event, so it is parsed again
    st0 = (att / "c4.json").stat()
    write(att, "c4.json", rec("c4", 7.0, "improved", "2026-01-01T00:00:04"))
    os.utime(att / "c4.json", ns=(st0.st_atime_ns, st0.st_mtime_ns))
    assert check()[1] == 7.0
    (att / "c3.json").unlink()
    assert check()[3] == 7.0
    os.rename(att / "c2.json", att / "renamed.json")  # the name is not the commit: the field inside is
    assert [i.name for i in coral.view_for(att).last()][:2] == ["c1.json", "renamed.json"]
    check()
    os.symlink(secret, att / "link.json")  # never followed: not a record
    os.mkfifo(att / "fifo.json")  # a read would block: never a record
    (att / "dir.json").mkdir()
    write(att, "bad.json", "{not json")
    write(att, ".hidden.json", rec("h", 50.0))
    got = check()
    assert all(name not in ("link.json", "fifo.json", "dir.json", "bad.json") for name, *_ in got[0])
    assert 99.0 not in (got[1], got[2])
    write(att, "bad.json", rec("fixed", 0.5, "regressed", "2026-01-01T00:00:09"))
    assert check()[2] == 0.5
    assert v.full_scans == 1  # all of that without reading every record again
    assert v.reads - reads < 15

    # a hard link from outside .opencode: writes through it raise no event in attempts/
    shutil.copy(att / "c1.json", tmp_path / "x")
    os.unlink(att / "c1.json")
    os.link(tmp_path / "x", att / "c1.json")
    check()
    (tmp_path / "x").write_text(json.dumps(rec("c1", 42.0, "baseline", "2026-01-01T00:00:01")))
    assert check()[1] == 42.0  # a record with two links is parsed at every refresh

    # the attempts folder replaced by a link to a folder of records: refused, the view is empty
    outside = tmp_path / "fake"
    outside.mkdir()
    write(outside, "f.json", rec("f", 1e9))
    shutil.rmtree(att)
    os.symlink(outside, att)
    assert summary(coral.view_for(att)) == ([], None, None, None, 0)
    os.unlink(att)
    att.mkdir()
    write(att, "n.json", rec("n", 2.0, "baseline"))
    assert check()[0] == [("n.json", "n", 2.0, "baseline")]


def test_link_made_then_removed_is_caught_by_the_commit(ws, tmp_path):
    """Link from outside, write through it, remove the link: nlink is back to 1 and no event came; the next
    knowledge commit (git compares inode and ctime) tells the view which records to read again."""
    _st, _state, w = ws
    att = w.knowledge_dir / "attempts"
    assert coral.view_for(att).best("maximize") == 5.0
    os.link(att / "c3.json", tmp_path / "alias")
    with open(tmp_path / "alias", "r+") as fh:  # same inode: the file in attempts/ changes
        data = json.dumps(rec("c3", 0.1, "improved", "2026-01-01T00:00:03"))
        fh.write(data)
        fh.truncate()
    os.unlink(tmp_path / "alias")
    w.commit_knowledge("turn")
    assert coral.view_for(att).best("maximize") == 3.0
    assert summary(coral.view_for(att)) == reference(w.root)


def test_unchanged_knowledge_costs_no_git_call_and_changes_are_committed(ws, monkeypatch):
    st, state, w = ws
    first = w.commit_knowledge("turn 1")
    assert first == state.knowledge_commit  # nothing changed since the fork
    calls = []
    import sftree.runtime.workspace as wsmod

    real_git = wsmod.git
    monkeypatch.setattr(wsmod, "git", lambda *a, **k: calls.append(a) or real_git(*a, **k))
    assert w.commit_knowledge("again") == first and calls == []
    (w.knowledge_dir / "notes" / "n.md").write_text("insight")
    second = w.commit_knowledge("note")
    assert second != first and calls
    # a folder made by the agent, and a file written in it after the commit that saw the folder
    (w.knowledge_dir / "skills" / "deep").mkdir()
    third = w.commit_knowledge("folder")  # an empty folder: same tree, no new commit
    assert third == second
    (w.knowledge_dir / "skills" / "deep" / "s.md").write_text("skill")
    fourth = w.commit_knowledge("skill")
    assert fourth != third
    assert "skills/deep/s.md" in st.diff("knowledge", third, fourth)
    # .opencode replaced wholesale: seen (the identity check), committed
    shutil.rmtree(w.knowledge_dir)
    w.knowledge_dir.mkdir()
    assert w.commit_knowledge("wiped") != fourth


def test_parked_checkout_keeps_its_view_and_sibling_branches_stay_apart(ws):
    st, state, w = ws
    att = w.knowledge_dir / "attempts"
    coral.view_for(att)
    write(att, "a1.json", rec("a1", 10.0, "improved", "2026-02-01"))
    child = w.state(None)
    view = w.attempt_view
    w.close()
    b = st.fork(state, "e2")  # a sibling: forks the root again, reusing e1's parked checkout
    assert b.attempt_view is view
    vb = coral.view_for(b.knowledge_dir / "attempts")
    assert vb.full_scans == 1  # no second full scan: git's rewrite of the checkout came as events
    assert vb.best("maximize") == 5.0 and vb.find("a1") is None  # e1's record is not on this branch
    assert summary(vb) == reference(b.root)
    c = st.fork(child, "e3")
    vc = coral.view_for(c.knowledge_dir / "attempts")
    assert vc.best("maximize") == 10.0 and summary(vc) == reference(c.root)
    b.close()
    c.close()


def full_tree(st, kdir, tmp_path, git):
    """The tree a from-scratch `git add -A` of the folder gives (the reference for a commit's tree)."""
    env = {"GIT_INDEX_FILE": str(tmp_path / "ref.index")}
    (tmp_path / "ref.index").unlink(missing_ok=True)
    git(["--work-tree", str(kdir), "add", "-A", "--", "."], git_dir=st.knowledge_git, env=env)
    return git(["write-tree"], git_dir=st.knowledge_git, env=env).stdout.strip()


def test_commits_stage_only_reported_paths_and_equal_a_full_add(ws, tmp_path, monkeypatch):
    """After the first commit, a commit stages the paths the watch reported (no scan of the folder); its tree
    equals a from-scratch `add -A` through writes, deletes, renames, folders, temp files, ignored names."""
    from sftree.runtime import workspace as wsmod

    st, _state, w = ws
    k = w.knowledge_dir
    w.commit_knowledge("first")  # a fresh checkout: the paths are not known yet, everything is staged
    full_adds = []
    real_git = wsmod.git

    def spy(args, **kw):
        if "add" in args and "." in args:
            full_adds.append(args)
        return real_git(args, **kw)

    monkeypatch.setattr(wsmod, "git", spy)

    def step(msg):
        head = w.commit_knowledge(msg)
        tree = real_git(["rev-parse", f"{head}^{{tree}}"], git_dir=st.knowledge_git).stdout.strip()
        assert tree == full_tree(st, k, tmp_path, real_git), msg

    (k / "notes" / "a.md").write_text("a")
    write(k / "attempts", "c9.json", rec("c9", 1.0))
    step("write")
    (k / "notes" / "a.md").unlink()
    os.rename(k / "attempts" / "c1.json", k / "attempts" / "c1b.json")
    step("delete and rename")
    (k / "skills" / "deep" / "er").mkdir(parents=True)
    (k / "skills" / "deep" / "er" / "s.md").write_text("s")
    step("nested folders")
    os.rename(k / "skills" / "deep", k / "skills" / "moved")  # a folder moved: watches rebuilt, full add
    step("folder moved")
    shutil.rmtree(k / "skills" / "moved")
    step("folder removed")
    (k / "notes" / ".x.tmp").write_text("t")
    os.rename(k / "notes" / ".x.tmp", k / "notes" / "x.md")  # the temp name matches nothing any more
    (k / "package.json").write_text("{}")  # excluded at the root: never committed
    step("temp file and excluded name")
    (k / "notes" / ".gitignore").write_text("*.log\n")
    step("a nested .gitignore")
    (k / "notes" / "debug.log").write_text("ignored")  # named explicitly, ignored: git exits 1, still fine
    (k / "notes" / "kept.md").write_text("kept")
    step("an ignored path among others")
    os.symlink("/etc", k / "notes" / "etc")  # a link is committed as a link, never followed
    step("a link")
    assert len(full_adds) == 1  # only the moved folder needed a look at everything


def test_names_that_are_no_utf8_are_committed_in_git_order(ws, tmp_path):
    """A file name with bytes that are no UTF-8 is committed by git's way; later commits in that folder still
    equal a from-scratch `add -A` (a text sort would put it before a name starting with U+E000)."""
    from sftree.runtime import workspace as wsmod

    st, _state, w = ws
    k = w.knowledge_dir
    w.commit_knowledge("first")
    (k / "notes" / "\ue000.md").write_text("e")
    with open(os.path.join(os.fsencode(k / "notes"), b"\xff.md"), "w") as fh:
        fh.write("ff")
    for i, msg in enumerate(("the names", "a file beside them", "another")):
        if i:
            (k / "notes" / f"n{i}.md").write_text(msg)
        head = w.commit_knowledge(msg)
        tree = wsmod.git(["rev-parse", f"{head}^{{tree}}"], git_dir=st.knowledge_git).stdout.strip()
        assert tree == full_tree(st, k, tmp_path, wsmod.git), msg


def test_owner_changes_by_the_host_are_no_changes(tmp_path):
    """Inside `owners_only` the host changes attributes alone (hand_to): the watch keeps what was touched
    before, and reports what comes after as usual; `exact` forgets everything (the fork's own writes)."""
    k = tmp_path / "ws" / ".opencode"
    (k / "attempts").mkdir(parents=True)
    for name in ("a.json", "b.json"):
        (k / "attempts" / name).write_text("{}")
    w = kwatch.KnowledgeWatch(tmp_path / "ws")
    if not w.sync():
        pytest.skip("inotify is not available here")
    assert w.exact() and w.touched_now() == set()
    (k / "attempts" / "a.json").write_text('{"x": 1}')
    assert w.touched_now() == {"attempts/a.json"}
    w.take_attempt_changes()
    with w.owners_only():
        os.utime(k / "attempts" / "b.json", (1, 1))  # an attribute event, as a chown raises
        os.chmod(k / "attempts", 0o755)
    assert w.touched_now() == {"attempts/a.json"}
    assert w.take_attempt_changes() == (set(), False)  # b.json is not read again
    (k / "attempts" / "b.json").write_text('{"x": 2}')
    assert w.committed() == {"attempts/a.json", "attempts/b.json"}
    (k / "attempts" / "c.json").write_text("{}")
    assert w.exact() and w.touched_now() == set()
    w.close()
