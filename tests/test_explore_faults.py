"""Branches of the search that only a misbehaving Teacher reaches, grown by `sftree explore` against teacher-sim
fault scripts: a broken workspace (`edge_error`) on exempt edges and a root direction lost after two tries, the
Teacher down past its retries, a turn cut by `turn_timeout`, a root snapshot without a score. Every finished tree
also passes the rule checker (helpers.explore.load_final -> tests/helpers/tree_rules.py)."""

from helpers.explore import explore, load_final, make_root, write_config
from helpers.tree_rules import check_paths

from sftree.dataset import select_paths as paths
from sftree.records import steplog
from sftree.records.tree import Tree
from sftree.search import tree as treemod
from sftree.settings import SelectPathsSettings, schema_defaults


def test_edge_error_on_exempt_edges_and_a_lost_root_direction(tmp_path):
    """Two directions, one child per node, depth 2, width 1. e1 (slot 0) ends without an eval; its fallback e3
    breaks its workspace (the Teacher links `.coral/public` away): no state to attach, so even the exempt fallback is
    pruned (`edge_error`) and the direction is lost. Below n1 the first depth-2 edge (exempt) breaks the same way;
    the second makes the only leaf."""
    root = make_root(tmp_path)
    script = [
        {"match": {"edge": "e1"}, "fault": "no_eval"},
        {"match": {"depth": 1, "attempt": 2, "turn": 1}, "fault": "break_workspace", "count": 1},
        {"match": {"depth": 2, "attempt": 1, "turn": 2}, "fault": "break_workspace", "count": 1},
    ]
    cfg = write_config(tmp_path, {"root_children": 2, "max_children": 1, "max_depth": 2, "parallel_width": 1},
                       script=script)  # fmt: skip
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 0
    tree = load_final(out)
    got = [(e.id, e.parent, e.slot, e.attempt, e.exempt, e.prune_reason, e.child) for e in tree.edges]
    assert got == [
        ("e1", "n0", 0, 1, False, "no_score", None),  # first tries of both directions first
        ("e2", "n0", 1, 1, False, None, "n1"),
        ("e3", "n0", 0, 2, True, "edge_error", None),  # the fallback broke: direction 0 is lost
        ("e4", "n1", None, 1, True, "edge_error", None),  # exempt depth-2 edge broke: pruned all the same
        ("e5", "n1", None, 2, True, None, "n2"),
    ]
    for e in (tree.edge("e3"), tree.edge("e4")):
        assert e.failed and e.fail_reason == "edge_error" and e.soft is None
        assert "UnsafeWorkspace" in e.error and "symlink" in e.error
        steps = steplog.read_steps(out / e.transcript)
        cmds = [c["function"]["arguments"] for s in steps for c in s["response"].get("tool_calls") or []]
        assert any(
            ".coral/public" in c and "nonexistent" in c for c in cmds
        )  # the transcript of the break is kept
    root_node, n1, n2 = tree.node("n0"), tree.node("n1"), tree.node("n2")
    assert (root_node.valid_children, root_node.failed_expansions, root_node.status) == (1, 2, "expanded")
    assert (n1.valid_children, n1.failed_expansions, n1.status) == (1, 1, "expanded")
    # seed 0: e5's second eval crashes (no score), so e5 is an exempt-kept failure; n2 reached the depth limit,
    # so it is a normal leaf all the same (1.9 item 2) and, with all four metrics computable, a ranked path (3.1)
    assert tree.edge("e5").fail_reason == "no_score" and tree.edge("e5").turns[1].ended == "eval"
    assert n2.leaf_reason == "depth_limit" and not n2.path_valid and treemod.is_good_leaf(n2)
    assert tree.stop_reason == "frontier_empty" and tree.counters()["good_leaves"] == 1
    assert (out / "edges" / "e3" / "code.diff").read_text() == ""
    doc = paths.select_paths(
        Tree.from_doc(tree.to_dict()), schema_defaults(SelectPathsSettings).top_k
    ).to_doc()
    assert [p["leaf"] for p in doc["paths"]] == ["n2"] and check_paths(tree.to_dict(), doc) == []


def test_teacher_down_past_its_retries_then_resume(tmp_path, capsys):
    """Every request of e2 gets 503 past the client's 2 retries: the run records e1 and e3, keeps e2 in flight in
    the live tree and exits 2 naming the Teacher. A rerun with the Teacher back discards e2 and retries its
    direction as e4 (first try again: a Teacher outage is not a property of the node)."""
    root = make_root(tmp_path)
    search = {"root_children": 3, "max_depth": 1, "parallel_width": 3}
    cfg = write_config(tmp_path, search, script=[{"match": {"edge": "e2"}, "fault": "http_503"}])
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 2
    err = capsys.readouterr().err
    assert "e2" in err and "503" in err
    live = treemod.LiveTree(out).load()  # the snapshot with its log replayed
    assert [d["edge"] for d in live.in_flight] == ["e2"] and sorted(e.id for e in live.edges) == ["e1", "e3"]
    assert live.status == "running" and not (out / "tree.json").exists()
    steps = steplog.read_steps(out / "edges" / "e2" / "steps.jsonl")
    assert steps[-1]["response"] is None and "503" in steps[-1]["error"]

    cfg = write_config(tmp_path, search, script=[])
    assert explore(root, out, cfg) == 0
    tree = load_final(out)
    # e1 and e3 finish in either order under load: the edge list is in completion order.
    assert sorted((e.id, e.slot, e.attempt) for e in tree.edges) == [("e1", 0, 1), ("e3", 2, 1), ("e4", 1, 1)]
    assert not (out / "edges" / "e2").exists() and tree.in_flight == []
    assert tree.stop_reason == "frontier_empty" and tree.counters()["good_leaves"] == 3


def test_turn_timeout_fails_the_turn_and_the_fallback_follows(tmp_path):
    """The first request of e1 hangs past the turn's time limit: the turn ends `timeout` without an eval, so the
    first try fails (no score) and the direction's fallback e2 makes the node."""
    root = make_root(tmp_path)
    script = [{"match": {"edge": "e1", "turn": 1}, "fault": "hang", "hang_s": 6, "count": 1}]
    cfg = write_config(tmp_path, {"root_children": 1, "max_depth": 1, "parallel_width": 1}, script=script,
                       agent={"turn_timeout": 5})  # fmt: skip
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 0
    tree = load_final(out)
    e1, e2 = tree.edge("e1"), tree.edge("e2")
    assert e1.turns[0].ended == "timeout" and e1.turns[0].score is None and e1.turns[0].steps == 1
    assert e1.turns[1].ended == "eval"  # the next turn has its own time limit
    assert e1.pruned and e1.prune_reason == "no_score"
    assert (e2.slot, e2.attempt, e2.exempt, e2.failed) == (0, 2, True, False)
    assert tree.node(e2.child).leaf_reason == "depth_limit"


def test_root_snapshot_without_a_score(tmp_path):
    """A root whose snapshot has no score: every numeric child improves on it (outcome 1.0), turn 1 is not
    regressed, the root ranks below every child, and paths.json reports root_score null."""
    root = make_root(tmp_path, score=None)
    cfg = write_config(tmp_path, {"root_children": 2, "max_depth": 1, "parallel_width": 2})
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 0
    tree = load_final(out)
    assert tree.node("n0").score is None and tree.node("n0").path_best_score is None
    for e in tree.edges:
        assert e.score is not None and e.outcome == 1.0
        assert tree.node(e.child).path_best_score == e.score
        assert e.regression_stability == (0.5 if e.turns[1].score < e.turns[0].score else 1.0)
    doc = paths.select_paths(
        Tree.from_doc(tree.to_dict()), schema_defaults(SelectPathsSettings).top_k
    ).to_doc()
    assert doc["root_score"] is None and len(doc["paths"]) == 2 and check_paths(tree.to_dict(), doc) == []
