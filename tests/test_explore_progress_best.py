"""The explore progress line's best score is kept from the nodes added since the last line (explore.BestSoFar),
and equals a scan of every node: hand-computed values, ties, missing scores, a minimize task."""

from __future__ import annotations

from types import SimpleNamespace

from sftree.search.explore import BestSoFar


def tree(direction, *scores):
    return SimpleNamespace(direction=direction, nodes=[SimpleNamespace(score=s) for s in scores])


def test_best_so_far_reads_only_new_nodes_and_matches_hand_values():
    b = BestSoFar()
    t = tree("maximize", None)  # the root has no numeric score
    assert b.update(t) is None
    t.nodes += [SimpleNamespace(score=2.5), SimpleNamespace(score=None)]
    assert b.update(t) == 2.5 and b.seen == 3
    t.nodes[1] = SimpleNamespace(score=-100.0)  # an old node is not read again (scores never change)
    t.nodes += [SimpleNamespace(score=2.5), SimpleNamespace(score=1.0)]  # a tie, a worse one
    assert b.update(t) == 2.5
    t.nodes.append(SimpleNamespace(score=3.0))
    assert b.update(t) == 3.0 and b.update(t) == 3.0


def test_minimize_and_a_new_tree_start_over():
    b = BestSoFar()
    assert b.update(tree("minimize", 5.0, 7.0, 4.5, None)) == 4.5
    assert b.update(tree("minimize", 9.0)) == 9.0  # fewer nodes than seen: another tree, counted afresh
