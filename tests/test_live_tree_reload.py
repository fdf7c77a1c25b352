"""The live tree on disk (tree.LiveTree): snapshot + append-only log, reloaded exactly after every save,
and robust to a kill at any point (torn last line, a kill between a snapshot and the log's truncation)."""

from __future__ import annotations

import json
import random

import pytest
from helpers.mcts import new_tree, result

from sftree.errors import InputError
from sftree.search import mcts
from sftree.search import tree as treemod


def _state(tree: treemod.Tree) -> dict:
    d = tree.to_dict()
    d.pop("updated_at")
    return d


def runner(seed: int):
    rng = random.Random(seed)

    def run(d: mcts.Dispatch):
        s1, s2 = (
            rng.choice([None, rng.uniform(0, 3)]) if rng.random() < 0.2 else rng.uniform(0, 3) for _ in "ab"
        )
        return result(d.edge, s1, s2, errors=rng.choice([0, 0, 1, 5]), tokens=rng.randint(500, 9000),
                      parent=d.parent_score)  # fmt: skip

    return run


@pytest.mark.parametrize("snapshot_min", [1, 3, 1000])
def test_every_save_reloads_exactly(tmp_path, snapshot_min):
    tree = new_tree(max_children=3, max_depth=4, max_valid_edges=60, target_good_leaves=99, parallel_width=3)
    live = treemod.LiveTree(tmp_path, snapshot_min=snapshot_min)
    saves = []

    def persist(t):
        live.save(t)
        saves.append(len(t.edges))
        if len(saves) % 7 == 0 or t.status == "finished":  # (a load validates the whole tree: not every save)
            assert _state(treemod.LiveTree(tmp_path).load()) == _state(t)

    mcts.run_search(tree, runner(1), persist)
    live.close()
    assert tree.status == "finished" and len(tree.edges) > 40 and len(saves) > 40
    lines = live.log_path.read_text().splitlines()
    snap_edges = len(json.loads(live.snapshot_path.read_text())["edges"])
    if snapshot_min == 1000:  # one snapshot (the first save), everything else appended
        assert snap_edges == 0 and len(lines) == len(saves) - 1
    else:  # snapshots when the log is as long as the tree has edges: few, and a short log
        # (the edges grow after a snapshot: a new one comes when the log is as long as the tree is then)
        assert 0 < snap_edges and len(lines) <= max(snapshot_min, len(tree.edges))
    # a log line holds what changed, not the tree: a typical one is far smaller than the tree
    assert sorted(map(len, lines))[len(lines) // 2] * 5 < len(json.dumps(tree.to_dict()))


def grown(tmp_path, edges=12):
    tree = new_tree(max_children=3, max_depth=3, target_good_leaves=99, parallel_width=2)
    live = treemod.LiveTree(tmp_path)
    run, states = runner(2), []

    def persist(t):
        live.save(t)
        states.append(_state(t))

    # Driven by hand so it stops mid-tree (run_search would finish the tree).
    live.save(tree)
    states.append(_state(tree))
    while len(tree.edges) < edges:
        for exp in mcts.ask(tree, 2):
            d = mcts.begin(tree, exp)
            persist(tree)
            mcts.tell(tree, d, run(d))
            persist(tree)
    mcts.begin(tree, mcts.ask(tree, 1)[0])  # killed while this one runs
    persist(tree)
    live.close()
    return live, states


def test_torn_last_line_is_the_save_that_never_happened(tmp_path, caplog):
    live, states = grown(tmp_path)
    data = live.log_path.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    live.log_path.write_bytes(data[: last_start + (len(data) - last_start) // 2])  # kill -9 mid-write
    assert _state(treemod.LiveTree(tmp_path).load()) == states[-2]
    assert "torn last line" in caplog.text


def test_kill_between_snapshot_and_log_truncation(tmp_path):
    live, states = grown(tmp_path)
    old_log = live.log_path.read_bytes()
    tree = treemod.LiveTree(tmp_path).load()
    tree.in_flight = []  # what a resume does before its first save
    fresh = treemod.LiveTree(tmp_path)
    fresh.snapshot(tree)
    fresh.close()
    live.log_path.write_bytes(old_log)  # the old lines are still there: they must not be replayed
    assert _state(treemod.LiveTree(tmp_path).load()) == _state(tree) != states[-1]


def test_bad_log_line_names_file_and_line(tmp_path):
    live, _ = grown(tmp_path)
    lines = live.log_path.read_text().splitlines(keepends=True)
    lines[1] = "{not json\n"
    live.log_path.write_text("".join(lines))
    with pytest.raises(InputError, match=r"tree.log.jsonl line 2: not valid JSON"):
        treemod.LiveTree(tmp_path).load()
    entry = json.loads(lines[2])
    entry["nodes"] = [{"id": "n99", "parent": "n98"}]  # a node missing its fields
    lines[1], lines[2] = lines[0], json.dumps(entry) + "\n"
    live.log_path.write_text("".join(lines))
    with pytest.raises(InputError, match=r"tree.log.jsonl line 3: not a tree log entry"):
        treemod.LiveTree(tmp_path).load()
