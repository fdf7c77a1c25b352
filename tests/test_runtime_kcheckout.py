"""A reused knowledge checkout of fenced edges (link(2) fails in their sandbox) is moved to the next fork's
commit by writing the tree diff and the paths its edge touched, with no index and no stat sweep
(runtime/kcheckout.py, docs/runtime.md "Knowledge cost per edge"). Whatever the edge did, the next branch
sees exactly its commit's files, as a full checkout would give them."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest
from runtime_helpers import make_root, spy_git_calls

from sftree.runtime import coral, gittrees, kcheckout, kwatch, safefs
from sftree.runtime import workspace as wsmod
from sftree.runtime.workspace import TreeStore

REC = {"commit_hash": "c1", "score": 1.0, "status": "improved", "timestamp": "2026-01-01T00:00:01"}
GIT_WAY = {"read-tree", "diff-files", "checkout-index", "update-index", "clean", "diff-tree", "ls-files"}


@pytest.fixture
def store(tmp_path):
    root = make_root(tmp_path, attempts=[REC, {**REC, "commit_hash": "c2", "score": 2.0}])
    st, state = TreeStore.create(tmp_path / "tree", root, {"name": "circle_packing"})
    yield st, state
    st.close()


@pytest.fixture
def calls(monkeypatch):
    return spy_git_calls(monkeypatch)


def _files(d):
    """Every path under `d` with its kind, content and executable bit (links: their target)."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            out[str(p.relative_to(d))] = ("link", os.readlink(p))
        elif stat.S_ISDIR(st.st_mode):
            out[str(p.relative_to(d))] = ("dir",)
        else:
            out[str(p.relative_to(d))] = ("file", p.read_bytes(), bool(st.st_mode & stat.S_IXUSR))
    return out


def _full(st, state, tmp_path):
    """A full checkout of `state` from a store with nothing parked (the reference)."""
    other = TreeStore(st.tree_dir, {})
    ws = other.fork(state, f"ref{len(list(tmp_path.iterdir()))}")
    try:
        return _files(ws.knowledge_dir)
    finally:
        ws.close()


def _edge(st, state, name, work, *, fenced=True):
    ws = st.fork(state, name, links_fenced=fenced)
    work(ws.knowledge_dir)
    child = ws.state(None)
    return ws, child


def _busy(k):
    """An edge that does a bit of everything to its knowledge folder."""
    (k / "notes" / "student.md").write_text("rewritten\n")
    (k / "notes" / "deep" / "er").mkdir(parents=True)
    (k / "notes" / "deep" / "er" / "f.md").write_text("deep")
    (k / "attempts" / "c1.json").unlink()
    (k / "attempts" / "c3.json").write_text(json.dumps({**REC, "commit_hash": "c3", "score": 9.0}))
    (k / "skills" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(k / "skills" / "run.sh", 0o755)
    os.symlink("../notes/student.md", k / "skills" / "link.md")
    (k / "package.json").write_text("{}")  # an excluded name: never committed, gone at the next fork
    (k / "node_modules" / "x").mkdir(parents=True)
    (k / "node_modules" / "x" / "i.js").write_text("1")


def test_fenced_forks_move_the_checkout_without_the_index(store, calls, tmp_path):
    st, root = store
    st.fork(root, "e0", links_fenced=True).close()  # parks a fresh checkout
    a, child = _edge(st, root, "e1", _busy)
    # written after the last commit: never committed, must not reach another branch
    (a.knowledge_dir / "notes" / "late.md").write_text("late")
    os.mkfifo(a.knowledge_dir / "notes" / "fifo")
    a.close()

    calls.clear()
    b = st.fork(root, "e2", links_fenced=True)  # back to the root: the edge's changes undone by name
    assert not GIT_WAY & set(calls), calls
    assert _files(b.knowledge_dir) == _full(st, root, tmp_path)
    assert coral.view_for(b.knowledge_dir / "attempts").best("maximize") == 2.0
    assert b.state(None).knowledge_commit == root.knowledge_commit  # nothing differs from the commit
    b.close()

    calls.clear()
    c = st.fork(child, "e3", links_fenced=True)  # forward to the child: its tree diff written
    assert not GIT_WAY & set(calls), calls
    kc = c.knowledge_dir
    assert _files(kc) == _full(st, child, tmp_path)
    assert os.stat(kc / "skills" / "run.sh").st_mode & stat.S_IXUSR
    assert os.readlink(kc / "skills" / "link.md") == "../notes/student.md"
    assert not (kc / "package.json").exists() and not (kc / "node_modules").exists()
    assert coral.view_for(kc / "attempts").best("maximize") == 9.0
    assert c.state(None).knowledge_commit == child.knowledge_commit
    c.close()


def test_what_the_edge_touched_is_restored_whatever_it_became(store, calls, tmp_path):
    """A tracked file replaced by a folder, a tracked folder by a link to a host folder, a file's mode
    changed, a record rewritten after the commit: the next fork restores each from the commit, never writing
    through the link."""
    st, root = store
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "student.md").write_text("host file")
    st.fork(root, "e0", links_fenced=True).close()

    def hostile(k):
        (k / "attempts" / "c2.json").unlink()
        (k / "attempts" / "c2.json").mkdir()
        (k / "attempts" / "c2.json" / "x").write_text("x")

    a, child = _edge(st, root, "e1", hostile)
    k = a.knowledge_dir
    for p in (k / "notes").iterdir():
        p.unlink()
    (k / "notes").rmdir()
    os.symlink(outside, k / "notes")
    os.chmod(k / "attempts" / "c1.json", 0o755)
    (k / "attempts" / "c1.json").write_text(json.dumps({**REC, "score": 1e9}))
    a.close()
    calls.clear()
    b = st.fork(root, "e2", links_fenced=True)
    assert not GIT_WAY & set(calls), calls
    assert _files(b.knowledge_dir) == _full(st, root, tmp_path)
    assert (outside / "student.md").read_text() == "host file" and len(list(outside.iterdir())) == 1
    assert coral.view_for(b.knowledge_dir / "attempts").best("maximize") == 2.0
    b.close()


def test_files_written_by_the_move_are_new_inodes(store):
    st, root = store
    st.fork(root, "e0", links_fenced=True).close()
    a, child = _edge(st, root, "e1", lambda k: (k / "notes" / "student.md").write_text("changed\n"))
    before = os.stat(a.knowledge_dir / "notes" / "student.md").st_ino
    keep = os.open(a.knowledge_dir / "notes" / "student.md", os.O_RDONLY)  # the inode stays allocated
    try:
        a.close()
        b = st.fork(root, "e2", links_fenced=True)
        assert os.stat(b.knowledge_dir / "notes" / "student.md").st_ino != before
        assert (b.knowledge_dir / "notes" / "student.md").read_text().startswith("# Student note")
        b.close()
    finally:
        os.close(keep)


def test_an_edge_without_the_fence_makes_its_checkout_git_s_for_good(store, calls, tmp_path):
    """A checkout an unfenced edge used (sandbox: none: a hard link may exist) is moved by git, with the
    stat sweep, at every later fork, even for fenced edges."""
    st, root = store
    st.fork(root, "e0", links_fenced=True).close()
    a, child = _edge(st, root, "e1", lambda k: (k / "notes" / "a.md").write_text("a"), fenced=False)
    os.link(a.knowledge_dir / "notes" / "student.md", tmp_path / "alias")
    a.close()
    (tmp_path / "alias").write_text("LEAKED")  # through the link, after the edge
    for i, target in enumerate((root, child, root)):
        calls.clear()
        w = st.fork(target, f"f{i}", links_fenced=True)
        assert "diff-files" in calls
        assert _files(w.knowledge_dir) == _full(st, target, tmp_path)
        w.state(None)
        w.close()


def test_an_unknown_change_set_takes_git_s_way(store, calls, tmp_path, monkeypatch):
    """More paths touched than the watch keeps: the next fork moves the checkout by git, and exactly."""
    st, root = store
    monkeypatch.setattr(kwatch, "MAX_TOUCHED", 3)
    st.fork(root, "e0", links_fenced=True).close()

    def many(k):
        for i in range(6):
            (k / "notes" / f"n{i}.md").write_text(str(i))

    a, child = _edge(st, root, "e1", many)
    a.close()
    calls.clear()
    b = st.fork(root, "e2", links_fenced=True)
    assert "diff-files" in calls
    assert _files(b.knowledge_dir) == _full(st, root, tmp_path)
    b.close()


def test_a_move_that_fails_half_way_is_repaired_by_git(store, calls, tmp_path, monkeypatch):
    st, root = store
    st.fork(root, "e0", links_fenced=True).close()
    a, child = _edge(st, root, "e1", _busy)
    a.close()
    real = kcheckout._write
    done = []

    def flaky(dfd, name, mode, data):
        if len(done) == 1:
            raise OSError(28, "No space left on device")
        done.append(name)
        return real(dfd, name, mode, data)

    monkeypatch.setattr(kcheckout, "_write", flaky)
    calls.clear()
    b = st.fork(root, "e2", links_fenced=True)
    assert len(done) == 1 and "diff-files" in calls
    assert _files(b.knowledge_dir) == _full(st, root, tmp_path)
    assert b.state(None).knowledge_commit == root.knowledge_commit
    b.close()


# ---- the plan, against hand-made trees ----------------------------------------------------------------------
@pytest.fixture
def trees(tmp_path):
    repo = tmp_path / "repo.git"
    wsmod.git(["init", "-q", "--bare", str(repo)])
    cache = gittrees.TreeCache(limit=1 << 20)  # every tree the test makes stays

    def blob(text):
        return gittrees.write_loose(repo, "blob", text.encode())

    def tree(spec):
        """{name: text | dict (a folder) | ("link", target) | ("sub", id) | ("tree", id)} -> tree id."""
        entries = {}
        for name, v in spec.items():
            if isinstance(v, dict):
                entries[name] = gittrees.entry(name, gittrees.TREE_MODE, tree(v))
            elif isinstance(v, tuple) and v[0] == "sub":
                entries[name] = gittrees.entry(name, "160000", v[1])
            elif isinstance(v, tuple) and v[0] == "tree":  # a tree already made
                entries[name] = gittrees.entry(name, gittrees.TREE_MODE, v[1])
            elif isinstance(v, tuple):
                entries[name] = gittrees.entry(name, "120000", blob(v[1]))
            else:
                entries[name] = gittrees.entry(name, "100644", blob(v))
        oid = gittrees.write_loose(repo, "tree", gittrees.encode_tree(entries))
        cache.put(oid, entries)
        return oid

    def load(oid):
        got = cache.get(oid)
        assert got is not None, f"tree {oid} not made by the test"
        return got

    return tree, blob, load


def test_plan_of_a_tree_diff(trees):
    tree, blob, load = trees
    old = tree(
        {"a": "1", "same": "s", "d": {"x": "x", "y": "y"}, "f2d": "f", "d2f": {"z": "z"}, "gone": {"q": "q"}}
    )
    new = tree({"a": "2", "same": "s", "d": {"x": "x", "y": "Y", "n": "n"}, "f2d": {"k": "k"}, "d2f": "z",
                "new": {"deep": {"w": "w"}}})  # fmt: skip
    p = kcheckout.plan(old, new, [], load)
    assert p.remove == ["a", "d/n", "d/y", "d2f", "f2d", "gone", "new"]
    assert p.write == [
        ("a", "100644", blob("2")),
        ("d/n", "100644", blob("n")),
        ("d/y", "100644", blob("Y")),
        ("d2f", "100644", blob("z")),
        ("f2d/k", "100644", blob("k")),
        ("new/deep/w", "100644", blob("w")),
    ]
    assert kcheckout.plan(old, old, [], load) == kcheckout.Plan([], [])


def test_plan_of_touched_paths(trees):
    tree, blob, load = trees
    t = tree({"notes": {"a": "a", "b": "b"}, "attempts": {"c1": "1"}, "l": ("link", "notes/a")})
    touched = ["notes/new", "notes", "notes/a", "attempts/c1", "attempts/tmp", "x/y/z", "l", ""]
    p = kcheckout.plan(t, t, touched, load)
    # `notes` as a whole covers what lies under it; paths not in the tree are only removed
    assert p.remove == ["attempts/c1", "attempts/tmp", "l", "notes", "x/y/z"]
    assert p.write == [
        ("attempts/c1", "100644", blob("1")),
        ("l", "120000", blob("notes/a")),
        ("notes/a", "100644", blob("a")),
        ("notes/b", "100644", blob("b")),
    ]
    # a path under a file of the tree is not in it: removed
    assert kcheckout.plan(t, t, ["l/x", "notes/a/b"], load).write == []


def test_plan_refuses_a_submodule(trees):
    tree, blob, load = trees
    old = tree({"a": "1"})
    new = tree({"a": "1", "m": ("sub", "1" * 40)})
    with pytest.raises(kcheckout.Unplannable):
        kcheckout.plan(old, new, [], load)


def test_plan_of_folders_nested_deep(trees):
    """An agent can commit folders nested thousands deep (git keeps them). The plan walks the diff with a
    stack, not recursion, down to kwatch.MAX_DEPTH levels; deeper is git's job (one git call per tree read
    would make a fork cost thousands): Unplannable, never a RecursionError."""
    tree, blob, load = trees

    def chain(leaf: str, depth: int) -> str:
        oid = tree({"f.md": leaf})
        for _ in range(depth):
            oid = tree({"d": ("tree", oid)})
        return oid

    depth = kwatch.MAX_DEPTH
    path = "d/" * depth + "f.md"
    p = kcheckout.plan(chain("old", depth), chain("new", depth), [], load)
    assert p == kcheckout.Plan([path], [(path, "100644", blob("new"))])
    p = kcheckout.plan(tree({"x": "x"}), chain("new", depth), [], load)  # a whole deep folder written
    assert p == kcheckout.Plan(["d", "x"], [(path, "100644", blob("new"))])
    deeper = chain("new", depth + 1)
    for old in (chain("old", depth + 1), tree({"x": "x"})):
        with pytest.raises(kcheckout.Unplannable, match="nested deeper"):
            kcheckout.plan(old, deeper, [], load)


DEEP = 400  # deeper than the recursion limit the test sets (git's own `clean` takes seconds per 1000 levels)


def _deep(k, depth=DEEP):
    """A folder nested `depth` deep under notes/ with a file at the bottom (by fds: no long path)."""
    d = os.open(k / "notes", os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=d)
        d, up = os.open("d", os.O_RDONLY, dir_fd=d), d
        os.close(up)
    fd = os.open("f.md", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=d)
    os.write(fd, b"bottom")
    os.close(fd)
    os.close(d)


def _bottom(k, depth=DEEP):
    """The file at the bottom of `_deep`'s folder, or None."""
    try:
        d = os.open(k / "notes", os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        for _ in range(depth):
            d, up = os.open("d", os.O_RDONLY, dir_fd=d), d
            os.close(up)
        fd = os.open("f.md", os.O_RDONLY, dir_fd=d)
        try:
            return os.read(fd, 100)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None
    finally:
        os.close(d)


@pytest.fixture
def low_recursion():
    """Python's recursion limit at 300 until the tests' fixtures set up after this one are torn down."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(300)
    yield
    sys.setrecursionlimit(limit)


def test_folders_nested_deeper_than_python_s_recursion(low_recursion, store):
    """A hostile edge nests folders deeper than Python's recursion limit in its knowledge (lowered here so
    that git's way stays quick): its commit keeps them, and forks back and forth never fail (no RecursionError
    in the watch, the move or the removal of worktrees) and give each commit's files."""
    st, root = store
    st.fork(root, "e0", links_fenced=True).close()
    a, child = _edge(st, root, "e1", _deep)
    assert child.knowledge_commit != root.knowledge_commit
    a.close()
    b = st.fork(root, "e2", links_fenced=True)  # back: the deep folder goes
    assert not (b.knowledge_dir / "notes" / "d").exists()
    assert b.state(None).knowledge_commit == root.knowledge_commit
    b.close()
    c = st.fork(child, "e3", links_fenced=True)  # forward: it comes back
    assert _bottom(c.knowledge_dir) == b"bottom"
    assert c.state(None).knowledge_commit == child.knowledge_commit
    c.close()
    d = st.fork(root, "e4", links_fenced=True)  # and goes again
    assert _bottom(d.knowledge_dir) is None and (d.knowledge_dir / "notes" / "student.md").exists()
    d.close()


def test_git_attributes_in_the_knowledge_leave_the_move_to_git(store, calls, tmp_path):
    """A `.gitattributes` an edge commits in its knowledge changes what git's checkout writes (`ident`,
    `eol`, `working-tree-encoding`), where the move would write the blobs as they are: a checkout moved to a
    commit below one is git's job, so that a file written by a fork is the same whichever way it came."""
    st, root = store
    st.fork(root, "e0", links_fenced=True).close()
    a = st.fork(root, "e1", links_fenced=True)
    b = st.fork(root, "e2", links_fenced=True)  # its checkout stays at the root, parked
    (a.knowledge_dir / ".gitattributes").write_text("*.md ident eol=crlf\n")
    (a.knowledge_dir / "notes" / "x.md").write_text("$Id$\nline\n")
    child = a.state(None)
    a.close()
    b.close()
    st.fork(child, "e3", links_fenced=True)  # takes the edge's own checkout (at the child): nothing written
    calls.clear()
    d = st.fork(child, "e4", links_fenced=True)  # takes the one at the root: x.md is written
    assert "diff-files" in calls
    want = _full(st, child, tmp_path)["notes/x.md"]
    assert want[1].endswith(b" $\r\nline\r\n")
    assert _files(d.knowledge_dir)["notes/x.md"] == want
    assert d.state(None).knowledge_commit == child.knowledge_commit


def test_plan_refuses_a_folder_with_git_attributes(trees):
    tree, blob, load = trees
    old = tree({"a": "1", "d": {"x": "x"}, "e": {"y": "y"}})
    attrs = {".gitattributes": "* ident\n"}
    for new, touched in (
        (tree({"a": "2", "d": {"x": "x"}, "e": {"y": "y"}, **attrs}), []),  # at the root
        (tree({"a": "1", "d": {"x": "X", **attrs}, "e": {"y": "y"}}), []),  # in a folder that differs
        (tree({"a": "1", "d": {"x": "x", **attrs}, "e": {"y": "y"}}), ["d/x"]),  # a touched path below one
        (tree({"a": "1", "d": {"x": "x"}, "e": {"y": "y"}, "n": {"z": "z", **attrs}}), []),  # a new folder
    ):
        with pytest.raises(kcheckout.Unplannable, match="gitattributes"):
            kcheckout.plan(old, new, touched, load)
    # in a folder where nothing is written it changes nothing
    old = tree({"a": "1", "d": {"x": "x", **attrs}, "e": {"y": "y"}})
    new = tree({"a": "2", "d": {"x": "x", **attrs}, "e": {"y": "y"}})
    assert kcheckout.plan(old, new, ["e/y"], load).write == [
        ("a", "100644", blob("2")),
        ("e/y", "100644", blob("y")),
    ]


# ---- handing the checkout to the sandbox uid (sftree as root) -----------------------------------------------
def _owners(root):
    """{path: uid} of every entry under `root` (links themselves, never followed)."""
    out = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(top, name)
            out[os.path.relpath(p, root)] = os.lstat(p).st_uid
    return out


@pytest.fixture
def counted(monkeypatch):
    """How many entries the handover looked at, and how many changed owner."""
    from sftree.runtime import sandbox

    n = {"look": 0, "chown": 0}

    def spy(real, key):
        def call(*a, **k):
            n[key] += 1
            return real(*a, **k)

        return call

    monkeypatch.setattr(sandbox, "own", spy(sandbox.own, "look"))
    monkeypatch.setattr(wsmod, "own", spy(wsmod.own, "look"))
    monkeypatch.setattr(os, "chown", spy(os.chown, "chown"))
    return n


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another uid needs root")
def test_hand_to_gives_every_entry_and_later_only_what_the_host_wrote(tmp_path, counted):
    root = make_root(tmp_path, attempts=[{**REC, "commit_hash": f"c{i}"} for i in range(300)])
    st, state = TreeStore.create(tmp_path / "tree", root, {"name": "circle_packing"})
    uid, other = 200_123, 200_124
    try:
        st.fork(state, "e0", links_fenced=True).close()
        a = st.fork(state, "e1", links_fenced=True)
        a.hand_to(uid)  # the first time: everything
        assert set(_owners(a.root).values()) == {uid}
        k = a.knowledge_dir
        (k / "notes" / "student.md").write_text("the agent's\n")
        a.commit_knowledge("turn 1")
        (k / "attempts" / "new.json").write_text(
            json.dumps({**REC, "commit_hash": "new"})
        )  # the host, as root
        (k / "notes" / "host").mkdir()
        (k / "notes" / "host" / "n.md").write_text("by the host")
        counted.update(look=0, chown=0)
        a.hand_to(uid)  # what the host wrote since, alone
        seen = dict(counted)
        assert set(_owners(a.root).values()) == {uid}
        assert seen["chown"] == 3 and seen["look"] < 100, seen
        child = a.state(None)
        a.close()

        b = st.fork(state, "e2", links_fenced=True)  # moved back by name: the fork's writes are root's
        assert 0 in set(_owners(b.knowledge_dir).values())
        counted.update(look=0, chown=0)
        b.hand_to(uid)
        seen = dict(counted)
        assert set(_owners(b.root).values()) == {uid}
        assert 0 < seen["chown"] < 20 and seen["look"] < 100, seen
        b.close()

        c = st.fork(child, "e3", links_fenced=True)
        c.hand_to(other)  # another uid: everything again
        assert set(_owners(c.root).values()) == {other}
        c.close()
    finally:
        st.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another uid needs root")
def test_a_deep_folder_is_handed_to_the_sandbox_uid(low_recursion, store):
    """Folders nested deeper than the recursion limit (in the code tree and the knowledge) are handed over
    whole, the first time and by path later, without a RecursionError."""
    st, root = store
    uid = 200_125
    st.fork(root, "e0", links_fenced=True).close()
    a = st.fork(root, "e1", links_fenced=True)
    a.hand_to(uid)
    _deep(a.knowledge_dir)
    os.mkdir(a.root / "notes")
    _deep(a.root)  # the code tree too
    a.hand_to(uid)  # the knowledge by the paths reported
    a.hand_to(uid + 1)  # another uid: everything
    for top in (a.root, a.knowledge_dir):
        d = os.open(top / "notes", os.O_RDONLY)
        for _ in range(DEEP):
            d, up = os.open("d", os.O_RDONLY, dir_fd=d), d
            os.close(up)
        assert os.stat("f.md", dir_fd=d).st_uid == uid + 1
        os.close(d)
    a.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another uid needs root")
def test_a_host_write_while_the_checkout_is_handed_over_is_not_forgotten(store, tmp_path, monkeypatch):
    """The Coral server's thread may still finish an eval (the graded code chooses when) and write its attempt
    record while the next turn hands the checkout to the sandbox uid: the owners' own events are no changes,
    but that record is, and the next fork removes it."""
    st, root = store
    st.fork(root, "e0", links_fenced=True).close()
    a = st.fork(root, "e1", links_fenced=True)
    real = wsmod.give_to

    def racing(path, uid, skip=None):
        if path == a.knowledge_dir:  # inside the handover of the checkout: the server writes meanwhile
            record = json.dumps({**REC, "commit_hash": "late", "score": 1e9}).encode()
            safefs.write_bytes_atomic(a.root, ".opencode/attempts/late.json", record)
        return real(path, uid, skip)

    monkeypatch.setattr(wsmod, "give_to", racing)
    a.hand_to(200_126)
    monkeypatch.setattr(wsmod, "give_to", real)
    a.close()
    b = st.fork(root, "e2", links_fenced=True)
    assert not (b.knowledge_dir / "attempts" / "late.json").exists()
    assert _files(b.knowledge_dir) == _full(st, root, tmp_path)
    b.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another uid needs root")
def test_a_host_write_just_before_the_handover_is_handed_over(store, monkeypatch):
    """The Coral server's thread writes (as root) while a turn starts: what it wrote before the owners' events
    are set aside is reported by the watch, so the handover by paths gives it to the sandbox uid too."""
    st, root = store
    uid = 200_127
    st.fork(root, "e0", links_fenced=True).close()
    a = st.fork(root, "e1", links_fenced=True)
    a.hand_to(uid)  # the first time: everything
    a.commit_knowledge("turn 1")
    watch = a.attempt_view.watch
    real = watch.owners_only

    def racing():
        (a.knowledge_dir / "notes" / "late").mkdir()  # the server, as root, as the handover begins
        (a.knowledge_dir / "notes" / "late" / "n.md").write_text("late")
        return real()

    monkeypatch.setattr(watch, "owners_only", racing)
    a.hand_to(uid)  # by the paths reported
    monkeypatch.setattr(watch, "owners_only", real)
    assert set(_owners(a.root).values()) == {uid}
    a.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another uid needs root")
def test_what_a_fork_wrote_for_an_edge_that_never_handed_it_over_is_handed_later(store):
    """An edge may end before its first turn (so before any handover): the files its fork wrote are still
    root's when the checkout is parked. The next edge with the same sandbox uid must not take them as the
    uid's."""
    st, root = store
    uid = 200_128
    st.fork(root, "e0", links_fenced=True).close()
    a = st.fork(root, "e1", links_fenced=True)
    a.hand_to(uid)
    (a.knowledge_dir / "notes" / "student.md").write_text("the agent's\n")
    a.state(None)
    a.close()  # parked: the uid's, at the child's commit
    b = st.fork(root, "e2", links_fenced=True)  # moved back: the fork rewrites the note as root
    assert os.lstat(b.knowledge_dir / "notes" / "student.md").st_uid == 0
    b.close()  # no turn ran: never handed over
    c = st.fork(root, "e3", links_fenced=True)  # already at this commit: the fork writes nothing
    c.hand_to(uid)
    assert set(_owners(c.root).values()) == {uid}
    c.close()
