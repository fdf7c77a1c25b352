"""Roots that refer to their snapshot (`select-roots --link symlink`, the default; docs/select_roots.md): explore
grows a tree from one, and a snapshot that vanished or changed since select-roots stops explore with a message
naming the path, before anything is written."""

import json
import os
import shutil
import subprocess
import time

import pytest
from helpers.cli import fails
from helpers.explore import EXAMPLES, explore, explore_args, write_config
from helpers.roots import make_run, tree_digest

from sftree import cli

RISING = [0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 10, 10, 10, 10]


def student_run(tmp_path):
    """A small Student run of circle_packing whose code is the example's real solution."""
    snaps = tmp_path / "run" / "circle_packing"
    for folder in make_run(snaps, RISING):
        shutil.copy(EXAMPLES / "circle_packing" / "seed" / "solution.py", folder / "code" / "solution.py")
    return snaps


def select_one(tmp_path, snaps, *extra):
    """select-roots with one root; returns (root, its snapshot)."""
    res = tmp_path / "results" / "circle_packing"
    argv = ["select-roots", "--snapshots", str(snaps), "--out", str(res / "roots"),
            "--table", str(res / "stages.tsv"), "--direction", "maximize", "--num-roots", "1", *extra]  # fmt: skip
    assert cli.main(argv) == 0
    (root,) = (res / "roots").iterdir()
    return root, snaps / root.name


@pytest.fixture
def linked(tmp_path):
    snaps = student_run(tmp_path)
    root, src = select_one(tmp_path, snaps)
    cfg = write_config(tmp_path, {"root_children": 1, "max_depth": 1, "parallel_width": 1})
    out = tmp_path / "results" / "circle_packing" / "trees" / root.name
    return tmp_path, snaps, root, src, cfg, out


def test_explore_grows_a_tree_from_a_linked_root(linked):
    tmp_path, snaps, root, src, cfg, out = linked
    assert os.path.islink(root / "code") and os.path.islink(root / "shared")
    before = tree_digest(snaps)
    assert explore(root, out, cfg) == 0
    tree = json.loads((out / "tree.json").read_text())
    assert tree["status"] == "finished" and tree["edges"] and tree["root"] == src.name
    # the store was seeded with the snapshot's own files, read through the links
    git = ["git", "--git-dir", str(out / "store" / "code.git"), "show", "refs/sftree/root:solution.py"]
    assert (
        subprocess.run(git, capture_output=True, check=True).stdout
        == (src / "code" / "solution.py").read_bytes()
    )
    git = [
        "git",
        "--git-dir",
        str(out / "store" / "knowledge.git"),
        "ls-tree",
        "-r",
        "--name-only",
        "refs/sftree/root",
    ]
    attempts = [f"attempts/{p.name}" for p in (src / "shared" / "attempts").iterdir()]
    assert set(attempts) <= set(
        subprocess.run(git, capture_output=True, text=True, check=True).stdout.split()
    )
    assert tree_digest(snaps) == before  # the Teacher's edges never wrote through a link


def _wait_for_the_clock():
    # Timestamps advance in coarse ticks (a few ms): a change made in the tick select-roots ran in could keep
    # the same mtime. A real Student run is not edited within milliseconds of select-roots.
    time.sleep(0.05)


def _moved(tmp_path, snaps, root, src):
    os.rename(snaps.parent, tmp_path / "run-moved")
    return [
        f"{root}/code -> {src}/code: the snapshot entry it refers to is gone",
        f"{src}/code: No such file",
    ]


def _rebuilt(tmp_path, snaps, root, src):
    copy = tmp_path / "rebuilt"
    shutil.copytree(src, copy, symlinks=True)  # same content, new files
    shutil.rmtree(src)
    os.rename(copy, src)
    return [f"{src}/code: changed since select-roots", f"{src}/shared: changed since select-roots"]


def _attempt_added(tmp_path, snaps, root, src):
    _wait_for_the_clock()
    (src / "shared" / "attempts" / "f00d.json").write_text("{}")
    return [f"{src}/shared/attempts: changed since select-roots"]


def _code_edited(tmp_path, snaps, root, src):
    _wait_for_the_clock()
    (src / "code" / "solution.py").write_text("# edited in place\n")
    return [f"{src}/code/solution.py: changed since select-roots"]


def _note_removed(tmp_path, snaps, root, src):
    shutil.rmtree(src / "shared" / "notes")
    return [f"{src}/shared/notes: gone since select-roots"]


def _shared_removed(tmp_path, snaps, root, src):
    shutil.rmtree(src / "shared")
    return [f"{root}/shared -> {src}/shared: the snapshot entry it refers to is gone"]


def _link_swapped(tmp_path, snaps, root, src):
    other = next(d for d in snaps.iterdir() if d.name != src.name)
    os.unlink(root / "code")
    os.symlink(other / "code", root / "code")
    return [f"{root}/code: not the link to {src}/code that select-roots made"]


@pytest.mark.parametrize(
    "change",
    [_moved, _rebuilt, _attempt_added, _code_edited, _note_removed, _shared_removed, _link_swapped],
    ids=lambda f: f.__name__.strip("_"),
)
def test_a_vanished_or_changed_snapshot_stops_explore_naming_the_path(linked, capsys, change):
    tmp_path, snaps, root, src, cfg, out = linked
    needles = change(tmp_path, snaps, root, src)
    fails(capsys, explore_args(root, out, cfg), f"root {root} refers to", "--link hardlink", *needles)
    assert not out.exists()


def test_unchanged_snapshot_read_by_others_is_fine(linked):
    """Reading the snapshot (another tree seeded from it, a copy of the whole run) changes nothing checked."""
    tmp_path, snaps, root, src, cfg, out = linked
    from sftree.records.root import verify_root
    from sftree.runtime.store import TreeStore

    _wait_for_the_clock()
    TreeStore.create(tmp_path / "other-tree", root, {})
    shutil.copytree(snaps, tmp_path / "run-copy", symlinks=True)
    verify_root(root)


def test_bad_root_links_record_names_the_field(linked, capsys):
    tmp_path, snaps, root, src, cfg, out = linked
    meta = json.loads((root / "metadata.json").read_text())
    for bad, field in (("x", "`root_links` must be an object"), ({"source": "rel", "entries": {}}, ".source"),
                       ({"source": str(src), "entries": {"code": 1}}, ".entries")):  # fmt: skip
        (root / "metadata.json").write_text(json.dumps({**meta, "root_links": bad}))
        fails(capsys, explore_args(root, out, cfg), f"{root}/metadata.json", field)
    assert not out.exists()


def test_unsupported_files_are_refused_by_explore_through_the_links(tmp_path, capsys):
    """A linked root is not walked by select-roots (it places no files); explore checks what the links lead to,
    and follows only the root's own top-level links, never one inside the snapshot."""
    snaps = student_run(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.mkfifo(outside / "far-pipe")
    for d in snaps.iterdir():
        os.mkfifo(d / "code" / "pipe")
        os.symlink(outside, d / "code" / "linked-dir")
    root, src = select_one(tmp_path, snaps)  # no walk, no error: nothing is copied
    cfg = write_config(tmp_path, {"root_children": 1, "max_depth": 1, "parallel_width": 1})
    out = tmp_path / "trees" / root.name
    err = fails(capsys, explore_args(root, out, cfg), f"{root}/code/pipe: a FIFO, not a file or folder")
    assert "far-pipe" not in err and not out.exists()
