"""ask/tell/stop rules of search/mcts.py on EdgeResult values built by hand (no runtime): the algorithm itself."""

from dataclasses import replace

import pytest
from helpers.mcts import grow_root, new_tree, result, step
from helpers.tree_rules import check_tree

from sftree.search import mcts
from sftree.search import tree as treemod

approx = pytest.approx


def test_soft_scores_of_root_edges():
    tree = new_tree()
    e1, e2, e3 = grow_root(tree)
    assert (e1.outcome, e1.cleanliness, e1.knowledge_score, e1.regression_stability, e1.soft) == (
        1,
        1,
        1,
        1,
        1,
    )
    assert (
        e2.score == 0.8 and e2.outcome == 0.7 and e2.knowledge_score == 0.4 and e2.regression_stability == 0
    )
    # stored at full precision (tree.json keeps the float; only the log rounds)
    assert e2.tool_error_rate == 0.1 and e2.cleanliness == 0.8 - 0.5 * 0.1 / 0.3 != round(e2.cleanliness, 6)
    assert e2.soft == approx(0.21 + 0.2 * (0.8 - 0.5 / 3) + 0.08, abs=1e-15)
    assert e3.soft == 1.0 and e3.tool_error_rate == 0.0
    root = tree.node("n0")
    assert root.status == "expanded" and root.valid_children == 3 and root.failed_expansions == 0
    n2 = tree.node("n2")
    assert n2.score == 0.8 and n2.path_best_score == 1.0 and n2.eval_count == 12
    assert n2.state == {"code_commit": "c-e2", "knowledge_commit": "k-e2", "session": "sessions/e2.json"}


def test_select_breakdown_hand_computed():
    tree = new_tree()
    grow_root(tree)
    exps = mcts.ask(tree, 3)
    sel = {e.node: e.select for e in exps}
    # n1: score 2.0 (rank 3.5/4), path best 2.0 (3.5/4), process 1.0, tokens 1000 (2.5/3 among 1000/3000/2000)
    assert sel["n1"]["Q"] == approx(0.4 * 0.875 + 0.3 * 0.875 + 0.3, abs=1e-6)
    assert sel["n1"]["T"] == approx(2.5 / 3, abs=1e-6)
    assert sel["n1"]["select"] == approx(0.9125 + 0.5 * 2.5 / 3, abs=1e-5)
    # n3: score 1.2 (2.5/4), best 1.2 (2.5/4), process 1.0, tokens 2000 (1.5/3)
    assert sel["n3"]["select"] == approx(0.7375 + 0.25, abs=1e-5)
    # n1 takes both of its slots first (exempt: edges into depth 2), then n3; n2 (select 0.33) waits
    assert [(e.node, e.attempt, e.exempt, e.depth) for e in exps] == [
        ("n1", 1, True, 2), ("n1", 2, True, 2), ("n3", 1, True, 2)]  # fmt: skip
    s2 = mcts.select_breakdowns(tree, [tree.node("n1"), tree.node("n2"), tree.node("n3")])["n2"]
    assert s2["score_rank"] == 0.125 and s2["best_rank"] == 0.25 and s2["T"] == approx(1 / 6, abs=1e-6)
    assert s2["select"] == approx(0.05 + 0.075 + 0.3 * s2["process"] + 0.5 / 6, abs=1e-5)


def test_minimize_ranks_lower_scores_higher():
    tree = new_tree("minimize", root_score=10.0)
    exps = mcts.ask(tree, 3)
    ds = [mcts.begin(tree, e) for e in exps]
    mcts.tell(tree, ds[0], result("e1", 9.0, 8.0, parent=10.0, direction="minimize"))
    mcts.tell(tree, ds[1], result("e2", 12.0, 11.0, parent=10.0, direction="minimize"))
    mcts.tell(tree, ds[2], result("e3", 10.0, 10.0, parent=10.0, direction="minimize"))
    n1, n2, n3 = (tree.node(f"n{i}") for i in (1, 2, 3))
    assert (n1.score, n2.score, n3.score) == (8.0, 11.0, 10.0)
    assert (
        tree.edge("e1").outcome == 1.0 and tree.edge("e2").outcome == 0.7 and tree.edge("e3").outcome == 0.7
    )
    assert n2.path_best_score == 10.0 and n1.path_best_score == 8.0
    sel = mcts.select_breakdowns(tree, [n1, n2, n3])
    assert sel["n1"]["score_rank"] == 0.875 and sel["n2"]["score_rank"] == 0.125  # 8 best, 11 worst


def test_layer1_fallback_and_kept_failure():
    """Width 1: the three first tries in slot order, then the fallbacks; nothing deeper before the root layer."""
    tree = new_tree()
    exps = mcts.ask(tree, 1)
    e = step(tree, exps[0], 1.1, None)  # e1 slot 0, first try: no score -> pruned, root failed_expansions 1
    assert e.pruned and e.prune_reason == "no_score" and e.child is None and e.soft is None
    assert tree.node("n0").failed_expansions == 1
    nxt = mcts.ask(tree, 5)  # first tries of slots 1, 2 before the fallback of slot 0
    assert [(x.node, x.slot, x.attempt, x.exempt) for x in nxt] == [
        ("n0", 1, 1, False), ("n0", 2, 1, False), ("n0", 0, 2, True)]  # fmt: skip
    e = step(tree, nxt[0], None, 2.0)  # e2 slot 1 fails too: the root's second failure
    assert e.slot == 1 and e.pruned and tree.node("n0").failed_expansions == 2
    assert tree.node("n0").status == "active"  # the root is governed by its directions, not failed < 2
    e = step(tree, mcts.ask(tree, 1)[0], 1.5, 2.0)  # e3 slot 2 -> n1
    assert (e.slot, e.attempt, e.child) == (2, 1, "n1")
    # n1 could grow, but the two fallbacks come first (root first, 1.6 / 1.10 step 5)
    nxt = mcts.ask(tree, 5)
    assert [(x.node, x.slot, x.attempt) for x in nxt] == [("n0", 0, 2), ("n0", 1, 2)]
    retry = nxt[0]
    e = step(tree, retry, None, None, errors=9)  # e4: the retry fails again: kept anyway
    assert not e.pruned and e.failed and e.fail_reason == "no_score" and e.child == "n2"
    n2 = tree.node("n2")
    assert n2.score is None and n2.path_best_score == 1.0 and not n2.path_valid and n2.status == "active"
    # soft of the kept failure: not improved .7, cleanliness floor .3, knowledge .6, stability 0
    assert e.soft == approx(0.21 + 0.06 + 0.12 + 0.0, abs=1e-12)
    assert [(x.node, x.slot) for x in mcts.ask(tree, 5)] == [("n0", 1)]
    e = step(tree, mcts.ask(tree, 1)[0], 1.2, 1.4)  # e5: slot 1's fallback -> n3
    assert (e.slot, e.attempt, e.exempt, e.child) == (1, 2, True, "n3")
    root = tree.node("n0")
    assert root.status == "expanded" and root.valid_children == 3 and root.failed_expansions == 2
    assert not mcts.root_layer_pending(tree)
    assert {x.node for x in mcts.ask(tree, 8)} <= {"n1", "n2", "n3"}


def test_depth2_exempt_then_depth3_prunes():
    tree = new_tree(max_depth=4)
    for exp in mcts.ask(tree, 3):
        step(tree, exp, 1.5, 2.0)
    # expand n1 into depth 2 with a failed eval and 50% tool errors: exempt, kept
    exp = next(x for x in mcts.ask(tree, 8) if x.node == "n1")
    e = step(tree, exp, None, None, calls=10, errors=5)
    assert e.exempt and e.depth == 2 and not e.pruned and e.fail_reason == "no_score" and e.child is not None
    n = tree.node(e.child)
    assert n.score is None and not n.path_valid and n.status == "active"
    # from depth 3 on: no score -> pruned; 31% tool errors -> pruned; exactly 30% -> kept
    d3 = next(x for x in mcts.ask(tree, 20) if x.node == n.id)
    assert d3.depth == 3 and not d3.exempt
    assert step(tree, d3, 2.0, None).prune_reason == "no_score"
    d3 = next(x for x in mcts.ask(tree, 20) if x.node == n.id)
    assert step(tree, d3, 2.0, 2.1, calls=100, errors=31).prune_reason == "tool_error_rate"
    n = tree.node(n.id)  # (a node is a frozen record: the tree holds its latest copy)
    assert n.failed_expansions == 2 and n.status == "leaf" and n.leaf_reason == "no_room"
    assert not treemod.is_good_leaf(n)  # its path holds a failed (exempt) edge
    exp = next(x for x in mcts.ask(tree, 20) if x.node == "n2")
    e2 = step(tree, exp, 2.0, 2.1)
    d3 = next(x for x in mcts.ask(tree, 20) if x.node == e2.child)
    e = step(tree, d3, 2.0, 2.1, calls=10, errors=3)  # 3/10 == 0.30: not > 0.30
    assert not e.pruned and e.tool_error_rate == 0.3 and e.cleanliness == approx(0.3)
    assert tree.node("n2").valid_children == 1


def test_two_failed_expansions_make_no_room_leaf_and_good():
    tree = new_tree(max_depth=3, max_children=2)
    for exp in mcts.ask(tree, 3):
        step(tree, exp, 1.5, 2.0)
    exp = next(x for x in mcts.ask(tree, 8) if x.node == "n1")
    child = tree.node(step(tree, exp, 2.0, 2.2).child)  # depth 2, valid path
    for _ in range(2):
        x = next(x for x in mcts.ask(tree, 20) if x.node == child.id)
        step(tree, x, None, 2.0)
    child = tree.node(child.id)  # (a node is a frozen record: the tree holds its latest copy)
    assert child.failed_expansions == 2 and child.status == "leaf" and child.leaf_reason == "no_room"
    assert treemod.is_good_leaf(child)
    assert all(x.node != child.id for x in mcts.ask(tree, 20))


def test_token_and_depth_limit_leaves():
    tree = new_tree(max_depth=2, hard_token_limit=5000)
    exps = mcts.ask(tree, 3)
    a = step(tree, exps[0], 1.5, 2.0, tokens=5000)  # == limit: leaf
    b = step(tree, exps[1], 1.5, 2.0, tokens=4999)
    step(tree, exps[2], 1.5, 2.0, tokens=4999)
    assert tree.node(a.child).leaf_reason == "token_limit" and tree.node(a.child).status == "leaf"
    assert tree.node(b.child).status == "active"
    x = next(x for x in mcts.ask(tree, 8) if x.node == b.child)
    c = step(tree, x, 2.0, 2.5, tokens=9000)  # over the token limit and at max depth: token_limit first
    d = step(tree, next(x for x in mcts.ask(tree, 8) if x.node == b.child), 2.0, 2.5, tokens=100)
    assert tree.node(c.child).leaf_reason == "token_limit"
    assert tree.node(d.child).leaf_reason == "depth_limit"
    assert tree.node(b.child).status == "expanded"


def run_tree(tree, script):
    """Grow the tree with `script(dispatch) -> EdgeResult`; the finished tree must pass the rule checker."""
    saved = []
    mcts.run_search(tree, lambda d: script(d), lambda t: saved.append(t.counters()))
    assert check_tree(tree.to_dict()) == []
    return saved


def test_stop_good_leaves_and_running_edges_finish():
    # depth 1 only: every root child is a depth_limit leaf; target 2 fires after the 2nd, the 3rd still lands
    tree = new_tree(max_depth=1, target_good_leaves=2, parallel_width=3)
    run_tree(tree, lambda d: result(d.edge, 1.5, 2.0, parent=d.parent_score))
    assert tree.stop_reason == "good_leaves" and tree.status == "finished"
    assert tree.counters()["good_leaves"] == 3 and len(tree.edges) == 3


def test_stop_edge_budget_strictly_more():
    tree = new_tree(max_valid_edges=4, parallel_width=1)
    run_tree(tree, lambda d: result(d.edge, 1.5, 2.0, parent=d.parent_score))
    assert tree.stop_reason == "edge_budget"
    assert tree.counters()["valid_edges"] == 5  # 4 is not > 4; the 5th valid edge fires the rule
    leaves = [n for n in tree.nodes if n.status == "leaf"]
    assert leaves and all(n.leaf_reason == "tree_stopped" for n in leaves)
    assert all(n.status in ("leaf", "expanded") for n in tree.nodes)


def test_stop_frontier_empty_full_tree():
    tree = new_tree(max_depth=2, root_children=2, max_children=2, parallel_width=4)
    saved = run_tree(tree, lambda d: result(d.edge, 1.5, 2.0, parent=d.parent_score))
    assert tree.stop_reason == "frontier_empty"
    assert len(tree.nodes) == 1 + 2 + 4 and tree.counters()["good_leaves"] == 4
    assert saved and saved[-1]["edges"] == 6
    obj = tree.to_dict()
    treemod.validate_tree(obj)
    again = treemod.Tree.from_dict(obj)
    assert again.to_dict() == obj


def test_async_refill_counts_in_flight():
    tree = new_tree(max_depth=3)
    ds = [mcts.begin(tree, e) for e in mcts.ask(tree, 3)]
    mcts.tell(tree, ds[0], result(ds[0].edge, 1.5, 2.0, parent=1.0))
    assert mcts.ask(tree, 8) == []  # n1 exists, but root slots 1, 2 are still running: root first
    mcts.tell(tree, ds[1], result(ds[1].edge, None, 2.0, parent=1.0))  # slot 1 fails
    (retry,) = mcts.ask(tree, 8)  # its fallback, not n1 (slot 2 still running)
    assert (retry.node, retry.slot, retry.attempt, retry.exempt) == ("n0", 1, 2, True)
    dr = mcts.begin(tree, retry)
    mcts.tell(tree, ds[2], result(ds[2].edge, 1.5, 2.0, parent=1.0))
    assert mcts.ask(tree, 8) == [] and mcts.root_layer_pending(tree)  # the fallback is running
    mcts.tell(tree, dr, result(dr.edge, 1.5, 1.6, parent=1.0))
    assert not mcts.root_layer_pending(tree)
    exps = mcts.ask(tree, 8)  # n1 and n2 tie on everything: the older node first
    assert [(e.node, e.depth) for e in exps][:2] == [("n1", 2), ("n1", 2)]
    mcts.begin(tree, exps[0])
    assert [(e.node, e.attempt) for e in mcts.ask(tree, 8)][:1] == [("n1", 2)]


def _timed_runs(schedule):
    """Run a 2-level tree whose edges take 0.05 s, except e4 (the first below the root) which takes 0.3 s;
    record (edge, node, start, end)."""
    import threading
    import time

    tree = new_tree(max_depth=2, root_children=3, max_children=2, parallel_width=3, schedule=schedule)
    log, lock = [], threading.Lock()

    def run(d):
        t0 = time.monotonic()
        time.sleep(0.3 if d.edge == "e4" else 0.05)
        with lock:
            log.append((d.edge, d.node, t0, time.monotonic()))
        return result(d.edge, 1.5, 2.0, parent=d.parent_score)

    mcts.run_search(tree, run, lambda t: None)
    return tree, log


def test_rounds_waits_for_the_whole_batch_async_refills():
    tree, log = _timed_runs("rounds")
    root_end = max(end for _, node, _, end in log if node == "n0")
    assert min(start for _, node, start, _ in log if node != "n0") >= root_end  # root first
    e4_end = next(end for e, _, _, end in log if e == "e4")
    later = [start for e, _, start, _ in log if int(e[1:]) > 6]
    assert later and min(later) >= e4_end  # nothing of round 3 starts before the slow edge of round 2 ends
    assert tree.stop_reason == "frontier_empty" and len(tree.nodes) == 1 + 3 + 6

    tree, log = _timed_runs("async")
    root_end = max(end for _, node, _, end in log if node == "n0")
    assert min(start for _, node, start, _ in log if node != "n0") >= root_end  # root first here too
    e4_end = next(end for e, _, _, end in log if e == "e4")
    early = [start for e, _, start, _ in log if int(e[1:]) > 6 and start < e4_end]
    assert early  # a freed slot was refilled while e4 was still running
    assert tree.stop_reason == "frontier_empty" and len(tree.nodes) == 1 + 3 + 6


def test_an_exception_in_an_edge_stops_the_loop_and_keeps_it_in_flight():
    tree = new_tree(max_depth=1, parallel_width=3)

    def run(d):
        if d.edge == "e2":
            raise RuntimeError("boom")
        return result(d.edge, 1.5, 2.0, parent=d.parent_score)

    with pytest.raises(RuntimeError):
        mcts.run_search(tree, run, lambda t: None)
    assert [d["edge"] for d in tree.in_flight] == ["e2"] and {e.id for e in tree.edges} == {"e1", "e3"}
    assert tree.status == "running"


def test_teacher_down_is_not_recorded_and_raises():
    from sftree.errors import TeacherUnavailable

    tree = new_tree(max_depth=1, parallel_width=3)

    def run(d):
        r = result(d.edge, 1.5, 2.0, parent=d.parent_score)
        if d.edge == "e3":
            turns = [r.turns[0], replace(r.turns[1], ended="teacher_error")]
            r = replace(r, turns=turns, error="connection refused")
        return r

    with pytest.raises(TeacherUnavailable):
        mcts.run_search(tree, run, lambda t: None)
    assert [d["edge"] for d in tree.in_flight] == ["e3"] and len(tree.edges) == 2


def test_default_params_stop_at_12_good_leaves():
    tree = new_tree(parallel_width=8)  # the seed's v0 defaults: 3/2 children, depth 4, 12 leaves, 40 edges
    run_tree(tree, lambda d: result(d.edge, 1.5, 2.0, parent=d.parent_score))
    c = tree.counters()
    assert tree.stop_reason == "good_leaves" and c["good_leaves"] >= 12 and c["valid_edges"] <= 40


def test_kept_failures_do_not_stop_depth_limit_leaves_from_counting():
    # every edge into depth 2 fails but is kept (exempt). Depth-4 leaves below them are normal leaves (1.9 item
    # 2: the depth limit was reached, every edge passed hard prune or exemption), so the 12-leaf rule fires.
    tree = new_tree(parallel_width=1)
    run_tree(tree, lambda d: result(d.edge, None if d.depth == 2 else 1.5, 2.0, parent=d.parent_score))
    c = tree.counters()
    assert tree.stop_reason == "good_leaves" and c["good_leaves"] == 12
    assert all(not n.path_valid for n in tree.nodes if n.depth >= 2)
    assert {n.leaf_reason for n in tree.nodes if treemod.is_good_leaf(n)} == {"depth_limit"}
    # with width 1 the 12th leaf is the last edge: 3 + 6 + 12 inner edges at most, 12 into depth 4
    assert c["valid_edges"] <= 3 + 6 + 12 + 12


def test_default_params_stop_over_40_valid_edges():
    # With the seed's 12-leaf target, 41 valid edges cannot happen (depths 1-3 hold at most 21 nodes, so 20 edges
    # into depth 4 = 20 normal leaves). A large target lets the budget stop at the 41st valid edge (width 1).
    tree = new_tree(parallel_width=1, target_good_leaves=100)
    run_tree(tree, lambda d: result(d.edge, None if d.depth == 2 else 1.5, 2.0, parent=d.parent_score))
    c = tree.counters()
    assert tree.stop_reason == "edge_budget" and c["valid_edges"] == 41 and c["good_leaves"] >= 20
    assert all(n.status != "active" for n in tree.nodes)


def test_edge_without_state_is_pruned_even_when_exempt():
    tree = new_tree()
    first = mcts.ask(tree, 1)[0]
    step(tree, first, None, None)
    retry = next(x for x in mcts.ask(tree, 8) if x.slot == 0)
    assert retry.exempt
    d = mcts.begin(tree, retry)
    r = result(d.edge, None, None, parent=1.0)
    r = replace(r, child_state=None, error="GitError: worktree add failed")
    e = mcts.tell(tree, d, r)
    assert e.pruned and e.prune_reason == "edge_error" and e.child is None and e.error.startswith("GitError")
    assert tree.node("n0").failed_expansions == 2
    assert all(x.slot != 0 for x in mcts.ask(tree, 8))  # the direction is spent: two tries


def _tie_tree(first_knows: bool):
    """alpha 0.024; n1 and n2 both score 2.0 (equal ranks). The one with knowledge has soft 1.0 (process 1.0)
    and 2000 tokens, the other soft 0.96 (knowledge .8) and 1000 tokens; n3 (0.9, 1000 tokens) is worse.
    Long+knowledge: Q .3 + .225 + .3 = .825, T 1/6 (-> .829); short: Q .3 + .225 + .288 = .813, T 2/3 (-> .829)."""
    tree = new_tree(alpha=0.024)
    ds = [mcts.begin(tree, e) for e in mcts.ask(tree, 3)]
    long_ = dict(knowledge=True, tokens=2000)
    short = dict(knowledge=False, tokens=1000)
    mcts.tell(tree, ds[0], result("e1", 1.5, 2.0, parent=1.0, **(long_ if first_knows else short)))
    mcts.tell(tree, ds[1], result("e2", 1.5, 2.0, parent=1.0, **(short if first_knows else long_)))
    mcts.tell(tree, ds[2], result("e3", 0.8, 0.9, tokens=1000, parent=1.0))
    return tree


@pytest.mark.parametrize("first_knows", [True, False])
def test_select_tie_between_different_nodes_goes_to_the_older(first_knows):
    tree = _tie_tree(first_knows)
    n1, n2, n3 = (tree.node(f"n{i}") for i in (1, 2, 3))
    sel = mcts.select_breakdowns(tree, [n1, n2, n3])
    knows, short = (sel["n1"], sel["n2"]) if first_knows else (sel["n2"], sel["n1"])
    assert (knows["Q"], knows["T"]) == (approx(0.825, abs=1e-15), approx(1 / 6, abs=1e-15))
    assert (short["Q"], short["T"]) == (approx(0.813, abs=1e-15), approx(2 / 3, abs=1e-15))
    assert knows["select"] == approx(0.829, abs=1e-15) and short["select"] == approx(0.829, abs=1e-15)
    assert sel["n3"]["select"] < 0.829
    # different parts, equal Select: the older node (creation order) first, whichever part is larger
    exps = mcts.ask(tree, 8)
    assert [e.node for e in exps] == ["n1", "n1", "n2", "n2", "n3", "n3"]


def test_select_order_treats_float_noise_as_a_tie():
    tree = new_tree()
    a, b = treemod.Node("a", "n0", "e1", 1, 1.0, 1.0, 0), treemod.Node("b", "n0", "e2", 1, 1.0, 1.0, 0)
    assert mcts.select_order([a, b], {"a": {"select": 0.7}, "b": {"select": 0.7 + 1e-15}}) == [a, b]
    assert mcts.select_order([a, b], {"a": {"select": 0.7}, "b": {"select": 0.7 + 1e-9}}) == [b, a]
    assert tree.root_node.id == "n0"


def test_rule_checker_catches_each_broken_rule():
    """tests/helpers/tree_rules.py must be able to fail: break one rule at a time in a tree that passes it."""
    tree = new_tree(max_depth=2, parallel_width=1)
    run_tree(tree, lambda d: result(d.edge, 1.5, 2.0, errors=1, parent=d.parent_score))
    good = tree.to_dict()
    assert check_tree(good) == []

    def broken(change):
        import copy

        obj = copy.deepcopy(good)
        change(obj)
        return " | ".join(check_tree(obj))

    def deeper_first(o):  # a deeper edge takes the id of a root edge
        e3, e4 = o["edges"][2], o["edges"][3]
        e3["id"], e4["id"] = e4["id"], e3["id"]

    assert "root first" in broken(deeper_first)
    assert "cleanliness" in broken(
        lambda o: o["edges"][0].update(cleanliness=round(o["edges"][0]["cleanliness"], 6))
    )
    assert "good_leaves" in broken(
        lambda o: o["counters"].update(good_leaves=o["counters"]["good_leaves"] + 1)
    )
    assert "exempt" in broken(lambda o: o["edges"][3].update(exempt=False))
    assert "kept should be" in broken(lambda o: o["edges"][0].update(tool_errors=4, tool_error_rate=0.4))
    assert "path_valid" in broken(lambda o: o["nodes"][4].update(path_valid=False))


@pytest.mark.parametrize("schedule", ["async", "rounds"])
def test_root_first_with_width_below_root_children(schedule):
    """Width 2 < 3 directions: the first tries e1-e3, then e1's fallback e4, and only then deeper nodes, in both
    schedules; a kept fallback failure (no score) still makes the direction's node."""
    tree = new_tree(max_depth=2, parallel_width=2, schedule=schedule)
    order = []

    def run(d):
        order.append((d.edge, d.node, d.slot, d.attempt))
        return result(d.edge, None if d.edge in ("e1", "e4") else 1.5, 2.0, parent=d.parent_score)

    mcts.run_search(tree, run, lambda t: None)
    assert check_tree(tree.to_dict()) == []
    order.sort(key=lambda x: int(x[0][1:]))  # dispatch order
    assert order[:4] == [
        ("e1", "n0", 0, 1),
        ("e2", "n0", 1, 1),
        ("e3", "n0", 2, 1),
        ("e4", "n0", 0, 2),
    ]
    assert all(node != "n0" for _, node, _, _ in order[4:]) and len(order) == 4 + 6
    e4 = tree.edge("e4")
    assert e4.exempt and e4.failed and e4.child is not None and not tree.node(e4.child).path_valid
    assert tree.node("n0").valid_children == 3 and tree.stop_reason == "frontier_empty"
