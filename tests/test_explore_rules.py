"""Trees grown by `sftree explore` against teacher-sim with scripted faults aimed at each rule of section 1."""

from helpers.explore import edges_by, explore, load_final, make_root, write_config
from helpers.mcts import search_params

from sftree.records import steplog
from sftree.search import scoring


def test_layer1_fallback_token_and_depth_leaves(tmp_path):
    """Root of 3 directions at max depth 1: e1 fails (no eval) and its fallback fails too but is kept;
    e2's context is padded over the token limit; e3 ends at the depth limit; then the frontier is empty."""
    root = make_root(tmp_path)
    script = [
        {"match": {"edge": "e1"}, "fault": "no_eval"},
        {"match": {"depth": 1, "attempt": 2}, "fault": "no_eval"},
        {"match": {"edge": "e2"}, "pad_tokens": 3000, "count": 1},
    ]
    cfg = write_config(tmp_path, {"root_children": 3, "max_depth": 1, "hard_token_limit": 6000,
                                  "parallel_width": 3}, script=script)  # fmt: skip
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 0
    tree = load_final(out)
    assert tree.status == "finished" and tree.stop_reason == "frontier_empty"
    assert not (out / "tree.live.json").exists() and list((out / "work").iterdir()) == []

    e1 = tree.edge("e1")
    assert (e1.slot, e1.attempt, e1.exempt, e1.pruned, e1.prune_reason, e1.child) == (
        0,
        1,
        False,
        True,
        "no_score",
        None,
    )
    assert [t.ended for t in e1.turns] == ["no_eval", "no_eval"]
    (retry,) = edges_by(tree, slot=0, attempt=2)
    assert retry.exempt and not retry.pruned and retry.failed and retry.fail_reason == "no_score"
    kept = tree.node(retry.child)
    assert kept.score is None and not kept.path_valid and kept.leaf_reason == "depth_limit"
    # soft of the kept failure from the real transcript numbers: not improved, no score on either turn
    clean = scoring.cleanliness(retry.tool_error_rate)
    ks = scoring.knowledge_score(False, retry.knowledge)
    assert retry.soft == 0.3 * 0.7 + 0.2 * clean + 0.2 * ks + 0.0  # stored at full precision

    e2, e3 = tree.edge("e2"), tree.edge("e3")
    n2, n3 = tree.node(e2.child), tree.node(e3.child)
    assert e2.tokens >= 6000 and n2.leaf_reason == "token_limit" and n2.max_token_total == e2.tokens
    assert e3.tokens < 6000 and n3.leaf_reason == "depth_limit" and n3.score == e3.score
    # the kept failure's leaf reached the depth limit: a normal leaf too (1.9 item 2), though not a ranked path
    # (its score is missing, 3.1)
    assert kept.status == "leaf" and tree.counters()["good_leaves"] == 3
    assert retry.id == "e4"  # the fallback after the three first tries (root first, first tries first)
    assert tree.node("n0").failed_expansions == 1 and tree.node("n0").status == "expanded"
    # the transcript of every attempt stays, also of the pruned one
    steps = steplog.read_steps(out / e1.transcript)
    assert steps and all(s["edge"] == "e1" for s in steps)
    assert tree.edge("e1").select["node"] == "n0" and tree.edge("e1").select["process"] == 0.0


def test_depth2_exempt_depth3_pruned_and_no_room(tmp_path):
    """One direction, one child per node, max depth 3: the depth-2 edge fails (no eval) but is kept; below it
    the first depth-3 edge fails its eval and the second has tool errors and no score: two failed expansions."""
    root = make_root(tmp_path)
    script = [
        {"match": {"depth": 2}, "fault": "no_eval"},
        {"match": {"depth": 3, "attempt": 1}, "fault": "no_eval"},
        {"match": {"depth": 3, "attempt": 2}, "fault": "tool_errors"},
    ]
    cfg = write_config(tmp_path, {"root_children": 1, "max_children": 1, "max_depth": 3, "parallel_width": 2},
                       script=script)  # fmt: skip
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 0
    tree = load_final(out)
    (d2,) = edges_by(tree, depth=2)
    assert d2.exempt and d2.failed and not d2.pruned and d2.child is not None
    mid = tree.node(d2.child)
    assert mid.score is None and mid.path_best_score == tree.node("n1").score  # best of the path above
    d3 = edges_by(tree, depth=3)
    assert [(e.attempt, e.exempt, e.pruned, e.prune_reason) for e in d3] == [
        (1, False, True, "no_score"), (2, False, True, "no_score")]  # fmt: skip
    assert d3[1].tool_error_rate > 0.30 and d3[1].tool_errors >= 3
    assert mid.failed_expansions == 2 and mid.status == "leaf" and mid.leaf_reason == "no_room"
    assert tree.stop_reason == "frontier_empty" and tree.counters()["good_leaves"] == 0
    assert len(tree.edges) == 4 and len(tree.nodes) == 3


def test_depth3_tool_error_rate_boundary_with_scores(tmp_path):
    """Two depth-3 edges that do their normal work (edit, eval, a numeric score on both turns) plus scripted extra
    calls: 3 failing reads per turn, and 3 resp. 4 extra successful calls. 6 errors of 19 calls (0.316) is pruned
    for its tool error rate although both turns scored; 6 of 20 (0.30 exactly) is kept: the rule is `> 0.30`."""
    root = make_root(tmp_path)

    def extra(attempt: int, ok_calls: int) -> list[dict]:
        errs = [{"match": {"depth": 3, "attempt": attempt, "turn": t}, "fault": "extra_tool_errors", "count": 3}
                for t in (1, 2)]  # fmt: skip
        return errs + [{"match": {"depth": 3, "attempt": attempt, "turn": 2}, "fault": "extra_tool_calls",
                        "count": ok_calls}]  # fmt: skip

    cfg = write_config(tmp_path, {"root_children": 1, "max_children": 1, "max_depth": 3, "parallel_width": 1},
                       script=extra(1, 3) + extra(2, 4))  # fmt: skip
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 0
    tree = load_final(out)
    d3 = edges_by(tree, depth=3)
    assert [(e.attempt, e.pruned) for e in d3] == [(1, True), (2, False)]
    over, at = d3
    for e in (over, at):
        assert not e.exempt and [t.ended for t in e.turns] == ["eval", "eval"]
        assert all(isinstance(t.score, float) for t in e.turns) and e.score is not None
        assert [t.tool_errors for t in e.turns] == [3, 3]
        steps = steplog.read_steps(out / e.transcript)
        calls = [
            (s["turn"], c["function"]["name"]) for s in steps for c in s["response"].get("tool_calls") or []
        ]
        assert {(1, "edit"), (2, "edit")} <= set(calls)  # each turn changed a constant besides the errors
        errors = [r["content"] for s in steps for r in s["tool_results"] if r["error"]]
        assert len(errors) == 6 and all("file not found: missing_extra_" in c for c in errors)
    # measured with seed 0: 13 and 14 successful calls (each turn's normal 5-6 plus the extra ones)
    assert (over.attempt, over.tool_errors, over.tool_calls) == (1, 6, 19) and over.tool_error_rate > 0.30
    assert over.pruned and over.failed and over.prune_reason == "tool_error_rate" and over.child is None
    assert (at.attempt, at.tool_errors, at.tool_calls) == (2, 6, 20) and at.tool_error_rate == 0.30
    assert not at.pruned and not at.failed and at.prune_reason is None
    assert at.cleanliness == scoring.cleanliness(0.30)  # full precision (0.30000000000000004)
    leaf = tree.node(at.child)
    assert leaf.score == at.score and leaf.path_valid and leaf.leaf_reason == "depth_limit"
    assert tree.node(at.parent).failed_expansions == 1 and tree.counters()["good_leaves"] == 1


def test_good_leaves_stop_lets_running_edge_finish(tmp_path):
    root = make_root(tmp_path)
    cfg = write_config(tmp_path, {"root_children": 3, "max_depth": 1, "target_good_leaves": 1,
                                  "parallel_width": 2})  # fmt: skip
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 0
    tree = load_final(out)
    # the first finished edge fires the rule; the other running one is still recorded; slot 2 never starts
    assert tree.stop_reason == "good_leaves" and len(tree.edges) == 2
    assert tree.counters()["good_leaves"] == 2
    assert tree.node("n0").status == "expanded"


def test_bad_root_is_a_clear_error(tmp_path, capsys):
    cfg = write_config(tmp_path, {})
    (tmp_path / "roots" / "eval-1").mkdir(parents=True)
    assert explore(tmp_path / "roots" / "eval-1", tmp_path / "out", cfg) == 2
    assert "metadata.json" in capsys.readouterr().err


def test_tree_killed_after_finishing_is_written_without_teacher(tmp_path):
    from helpers.mcts import result

    from sftree.search import mcts
    from sftree.search import tree as treemod

    root = make_root(tmp_path)
    state = {"code_commit": "c0", "knowledge_commit": "k0", "session": None}
    tree = treemod.Tree.new(
        "circle_packing", root.name, "maximize", search_params(max_depth=1), 1.2, state, 7
    )
    mcts.run_search(tree, lambda d: result(d.edge, 1.5, 2.0, parent=1.2), lambda t: None)
    out = tmp_path / "trees" / root.name
    treemod.save(tree, out / "tree.live.json")
    cfg = write_config(tmp_path, {"max_depth": 1}, base_url="http://127.0.0.1:9/v1")  # nothing listens there
    assert explore(root, out, cfg) == 0
    assert load_final(out).to_dict()["edges"] == tree.to_dict()["edges"]
    assert not (out / "tree.live.json").exists()
