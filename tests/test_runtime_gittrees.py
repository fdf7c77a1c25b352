"""Knowledge trees built in Python from the last tree and the changed entries (gittrees.py) are the trees git
itself makes: same ids as `git mktree` and `git write-tree`, objects git reads back."""

from __future__ import annotations

import subprocess

import pytest

from sftree.runtime import gittrees
from sftree.runtime.objects import git_env


def git(args, *, git_dir=None, env=None, input=None, check=True, binary=False):
    """git with the store's clean environment (a CompletedProcess, stdout as text unless `binary`)."""
    cmd = ["git", "-c", "core.quotepath=off", *(["--git-dir", str(git_dir)] if git_dir else []), *args]
    proc = subprocess.run(
        cmd, env={**git_env(), **(env or {})}, input=input, capture_output=True, check=check
    )
    if not binary:
        proc.stdout = proc.stdout.decode()
    return proc


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "k.git"
    git(["init", "-q", "--bare", str(r)])
    return r


def blob(repo, text: str) -> str:
    return git(["hash-object", "-w", "--stdin"], git_dir=repo, input=text.encode()).stdout.strip()


def mktree(repo, entries: dict[str, tuple[str, str]]) -> str:
    lines = "".join(f"{m} {'tree' if m == '040000' else 'blob'} {o}\t{n}\0" for n, (m, o) in entries.items())
    return git(["mktree", "-z"], git_dir=repo, input=lines.encode()).stdout.strip()


def test_encoding_matches_git_order_and_modes(repo):
    """Git sorts a folder as `name/`: `a-b` < `a.b` < `a` (folder) < `a0`; modes as git writes them."""
    b1, b2 = blob(repo, "one\n"), blob(repo, "two\n")
    sub = mktree(repo, {"f": ("100644", b1)})
    want = mktree(
        repo,
        {"a0": ("100644", b1), "a": ("040000", sub), "a.b": ("100755", b2), "a-b": ("120000", b1), "ü.md": ("100644", b2)},
    )  # fmt: skip
    entries = {
        n: gittrees.entry(n, m, o)
        for n, m, o in [("a0", "100644", b1), ("a", "40000", sub), ("a.b", "100755", b2), ("a-b", "120000", b1),
                        ("ü.md", "100644", b2)]
    }  # fmt: skip
    got = gittrees.write_loose(repo, "tree", gittrees.encode_tree(entries))
    assert got == want
    raw = subprocess.run(["git", "--git-dir", str(repo), "cat-file", "tree", got], capture_output=True).stdout
    assert gittrees.parse_tree(raw) == entries
    # a tree only Python wrote (a new id) is read by git
    entries["new"] = gittrees.entry("new", "100644", b2)
    oid = gittrees.write_loose(repo, "tree", gittrees.encode_tree(entries))
    listed = git(["ls-tree", "--name-only", oid], git_dir=repo).stdout.split()
    assert listed == ["a-b", "a.b", "a", "a0", "new", "ü.md"]
    assert git(["fsck", "--strict", "--no-dangling"], git_dir=repo, check=False).returncode == 0


def test_applied_changes_equal_write_tree_of_the_same_index(repo, tmp_path):
    """Set, change and remove entries at several depths, empty a folder, put a file where a folder was: the
    tree equals what write-tree makes of an index holding the old tree with those entries."""
    b = [blob(repo, f"content {i}\n") for i in range(6)]
    index = tmp_path / "idx"
    env = {"GIT_INDEX_FILE": str(index)}
    start = {"attempts/c1.json": b[0], "attempts/c2.json": b[1], "notes/a.md": b[2], "notes/deep/x.md": b[3],
             "notes/gone/y.md": b[4], "top.md": b[5], "skills/s": b[0]}  # fmt: skip
    info = "".join(f"100644 {o}\t{p}\0" for p, o in start.items())
    git(["update-index", "-z", "--add", "--index-info"], git_dir=repo, env=env, input=info.encode())
    root = git(["write-tree"], git_dir=repo, env=env).stdout.strip()
    changes = {
        "attempts/c3.json": ("100644", b[2]),  # new
        "attempts/c1.json": ("100644", b[5]),  # changed
        "attempts/c2.json": None,  # removed
        "notes/deep/z.md": ("120000", b[1]),  # a link, one level down
        "notes/gone/y.md": None,  # the folder's last file: the folder goes
        "skills/s": None,
        "skills": ("100644", b[3]),  # a file where a folder was
        "roles/r/q.md": ("100755", b[4]),  # new folders
        "missing/none": None,  # removing what is not there changes nothing
    }
    lines = "".join(f"{c[0] if c else '0'} {c[1] if c else '0' * 40}\t{p}\0" for p, c in changes.items())
    # the index takes removals first (a file cannot replace a folder that still holds entries)
    removals = "".join(x + "\0" for x in lines.split("\0") if x.startswith("0 "))
    sets = "".join(x + "\0" for x in lines.split("\0") if x and not x.startswith("0 "))
    git(["update-index", "-z", "--index-info"], git_dir=repo, env=env, input=removals.encode())
    git(["update-index", "-z", "--add", "--index-info"], git_dir=repo, env=env, input=sets.encode())
    want = git(["write-tree"], git_dir=repo, env=env).stdout.strip()
    cache = gittrees.TreeCache()

    def load(oid):
        raw = subprocess.run(
            ["git", "--git-dir", str(repo), "cat-file", "tree", oid], capture_output=True
        ).stdout
        return cache.get(oid) or gittrees.parse_tree(raw)

    def store(entries, base=None, changed=()):
        oid = gittrees.write_loose(repo, "tree", gittrees.encode_tree(entries))
        cache.put(oid, entries)
        return oid

    got = gittrees.apply_changes(root, changes, load, store)
    assert got == want
    # and again from the cached trees: no change, the same tree; everything removed, the empty tree
    assert gittrees.apply_changes(got, {}, load, store) == got
    everything = dict.fromkeys(git(["ls-tree", "-r", "--name-only", got], git_dir=repo).stdout.split())
    assert gittrees.apply_changes(got, everything, load, store) == "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def test_a_tree_with_a_name_that_is_no_utf8_is_left_to_git(repo):
    """A name git stored with bytes that are no UTF-8 (0xff) would sort, as text, before one starting with
    U+E000 (bytes ee 80 80) where git puts it after: such a tree is not parsed, so no commit rebuilds it."""
    oid = blob(repo, "x")
    lines = b"".join(f"100644 blob {oid}\t".encode() + n + b"\0" for n in (b"\xff.md", "\ue000.md".encode()))
    tree = git(["mktree", "-z"], git_dir=repo, input=lines).stdout.strip()
    raw = git(["cat-file", "tree", tree], git_dir=repo, binary=True).stdout
    assert raw.index("\ue000".encode()) < raw.index(b"\xff")  # git's byte order
    with pytest.raises(ValueError):
        gittrees.parse_tree(raw)
    with pytest.raises(ValueError):
        gittrees.apply_changes(tree, {"a.md": ("100644", oid)}, lambda t: gittrees.parse_tree(raw), None)


def test_spliced_encodings_equal_full_ones():
    """A large tree's next encoding, spliced from its layout, is byte for byte the full encoding, layout
    included: additions, removals, changed ids, a file turned folder under the same name, names that sort
    around git's `name/` rule, edits at both ends, many at once."""
    import random

    rnd = random.Random(7)
    oid = lambda: f"{rnd.getrandbits(160):040x}"  # noqa: E731
    names = [f"{rnd.getrandbits(40):010x}.json" for _ in range(gittrees.LAYOUT_MIN + 300)]
    names += ["a", "a.b", "a-c", "b", "0", "zzzz"]
    base_entries = {n: gittrees.entry(n, "100644", oid()) for n in names}
    base_entries["a.d"] = gittrees.entry("a.d", gittrees.TREE_MODE, oid())  # sorts as "a.d/"
    data, layout = gittrees.encode_tree(base_entries, laid_out=True)
    base = gittrees.Tree(base_entries, layout)
    assert gittrees.parse_tree(data).layout == layout  # the same layout from git's bytes
    cases = [
        {"new.json": ("100644", oid())},  # one record added, as a commit does
        {names[0]: None},  # removed
        {names[5]: ("100755", oid())},  # changed mode and id
        {"a": (gittrees.TREE_MODE, oid())},  # a file turned folder: its sort key moves past "a.b", "a-c"
        {"a.d": ("100644", oid())},  # and a folder turned file
        {
            "0": None,
            "zzzz": ("100644", oid()),
            "00": ("100644", oid()),
            "zzzzz": ("100644", oid()),
        },  # both ends
        {n: ("100644", oid()) for n in rnd.sample(names, 200)} | {n: None for n in rnd.sample(names, 50)},
    ]
    for changes in cases:
        new = dict(base)
        for n, c in changes.items():
            if c is None:
                new.pop(n, None)
            else:
                new[n] = gittrees.entry(n, *c)
        got = gittrees.splice(base, new, set(changes))
        assert got is not None
        want_data, want_layout = gittrees.encode_tree(new, laid_out=True)
        assert got[0] == want_data
        assert got[1] == want_layout
    assert gittrees.splice({}, {}, ()) is None  # no layout: the caller encodes in full


def test_splice_takes_a_name_changed_twice_or_never_there_and_git_order_of_non_ascii(repo):
    """`changed` may name an entry twice (a list of edits) or name one in neither tree: the spliced encoding is
    still the full one. Names above U+FFFF and between U+0080 and U+07FF, beside ASCII ones and one turned from
    file to folder, sort as `git mktree` sorts them (UTF-8 bytes, which is code point order)."""
    b = blob(repo, "x")
    empty = mktree(repo, {})
    odd = [
        "a",
        "a.b",
        "a-",
        "a b",
        "é",
        "\u07ff",
        "\u0800",
        "\uffff",
        "\U00010000",
        "\U0001f600",
        "a\U0001f600",
    ]
    names = [f"{i:05d}.json" for i in range(gittrees.LAYOUT_MIN)] + odd
    base_entries = {n: gittrees.entry(n, "100644", b) for n in names}
    data, layout = gittrees.encode_tree(base_entries, laid_out=True)
    base = gittrees.Tree(base_entries, layout)
    new = dict(base)
    new["a"] = gittrees.entry("a", gittrees.TREE_MODE, empty)  # now sorts as "a/", past "a-", "a.b"
    new["é"] = gittrees.entry("é", gittrees.TREE_MODE, empty)
    new["\U0001f601"] = gittrees.entry("\U0001f601", "100644", b)
    del new["\u0800"]
    changed = ["a", "é", "\U0001f601", "a", "\U0001f601", "\u0800", "\u0800", "never.json", "a.b"]
    got = gittrees.splice(base, new, changed)
    assert got is not None
    want = gittrees.encode_tree(new, laid_out=True)
    assert got[0] == want[0]
    assert got[1] == want[1]
    by_git = mktree(
        repo, {n: ("040000" if e[0] == gittrees.TREE_MODE else e[0], e[1]) for n, e in new.items()}
    )
    assert gittrees.object_id("tree", got[0]) == by_git


def test_tree_cache_keeps_layouts_within_a_byte_budget():
    """Layouts (about the encoding's size again on top of the entries) are kept for the most recently used
    trees within `layout_bytes`; an older tree keeps its entries but is encoded in full next time."""
    oid = lambda i, j: f"{i:020x}{j:020x}"  # noqa: E731

    def made():
        out = []
        for i in range(4):
            names = [f"{j:06d}" for j in range(gittrees.LAYOUT_MIN)]
            entries = {n: gittrees.entry(n, "100644", oid(i, j)) for j, n in enumerate(names)}
            data, layout = gittrees.encode_tree(entries, laid_out=True)
            out.append((gittrees.object_id("tree", data), gittrees.Tree(entries, layout)))
        return out

    trees = made()
    one = gittrees.layout_cost(trees[0][1].layout)
    assert one > len(trees[0][1].layout[2])  # the encoding, and the keys' and offsets' lists
    cache = gittrees.TreeCache(limit=64, layout_bytes=2 * one + 1)
    for t_oid, tree in trees[:3]:
        cache.put(t_oid, tree)
    assert [t.layout is not None for _o, t in trees[:3]] == [False, True, True]
    assert cache.get(trees[0][0]) == trees[0][1]  # still there, without its layout
    cache.get(trees[1][0])  # used: the newest now
    cache.put(*trees[3])
    assert [t.layout is not None for _o, t in trees] == [False, True, False, True]
    base = trees[2][1]
    new = dict(base) | {"x": gittrees.entry("x", "100644", oid(9, 9))}
    assert gittrees.splice(base, new, {"x"}) is None  # the caller encodes in full
    small = gittrees.TreeCache(limit=2, layout_bytes=10 * one)
    trees = made()
    for t_oid, tree in trees:
        small.put(t_oid, tree)
    assert small.get(trees[0][0]) is None  # evicted trees leave the budget with their entries
    assert small.layout_total == 2 * one
