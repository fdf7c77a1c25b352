"""The benchmark's work-conserving bound: the longest parent-before-child chain of edge times."""

import sys

from helpers.mcts import new_tree, step

from sftree.config import REPO_ROOT
from sftree.search import mcts

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from schedule import longest_chain, root_layer_bound  # noqa: E402


def test_longest_chain_counts_the_fallback_wait_and_the_root_layer():
    tree = new_tree(root_children=2, max_depth=3)
    first = mcts.ask(tree, 2)
    step(tree, first[0], None, None)  # e1: slot 0 fails
    step(tree, first[1], 1.5, 2.0)  # e2: slot 1 -> n1
    retry = next(x for x in mcts.ask(tree, 8) if x.node == "n0")
    assert (retry.slot, retry.attempt) == (0, 2)
    e3 = step(tree, retry, 1.5, 2.0)  # e3: the fallback, after e1 -> n2
    below = next(x for x in mcts.ask(tree, 8) if x.node == e3.child)
    step(tree, below, 1.5, 2.5)  # e4 below n2
    dur = {"e1": 2.0, "e2": 1.0, "e3": 3.0, "e4": 4.0}
    assert longest_chain(tree, dur) == 2.0 + 3.0 + 4.0
    dur["e2"] = 10.0  # root first: e4 waits for the whole root layer, e2 included
    assert longest_chain(tree, dur) == 10.0 + 4.0
    # root layer: slot 0's try + fallback (2 + 3) vs slot 1 (10); then e4 (4 s) on 2 workers
    assert root_layer_bound(tree, dur, 2) == 10.0 + 4.0 / 2
    dur["e2"] = 1.0
    assert root_layer_bound(tree, dur, 1) == 2.0 + 3.0 + 4.0
