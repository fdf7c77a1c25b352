"""One meaning of a raw score for every stage (sftree.records.scores), against hand-computed numbers: orientation,
best-of, and the regressed rate the search stores (an edge with no turns regressed entirely)."""

import math

import pytest

from sftree.records.scores import best_of, better, oriented, regressed_rate


def test_oriented_makes_larger_better_and_drops_non_numbers():
    assert oriented(2.5, "maximize") == 2.5
    assert oriented(2.5, "minimize") == -2.5
    assert oriented(None, "minimize") is None
    assert oriented(math.nan, "maximize") is None
    assert [oriented(s, "minimize") for s in (1.0, None, -2.0)] == [-1.0, None, 2.0]  # select-roots' stages
    with pytest.raises(ValueError, match="direction must be"):
        oriented(1.0, "up")
    with pytest.raises(ValueError):
        oriented(1.0, "max")


def test_better_is_strict_and_a_number_beats_none():
    assert better(3, 2, "maximize") and not better(2, 3, "maximize")
    assert better(2, 3, "minimize") and not better(2, 2, "minimize")
    assert better(0.0, None, "maximize") and not better(None, 0.0, "maximize")
    assert not better(None, None, "maximize")


def test_best_of_is_raw_by_direction_first_of_equals():
    assert best_of([1.0, None, 3.0, 2.0], "maximize") == 3.0
    assert best_of([1.0, None, 3.0, 2.0], "minimize") == 1.0
    assert best_of([3.0, None, 1.0], "minimize") == 1.0
    assert best_of([None, None], "maximize") is None and best_of([], "minimize") is None
    first, second = 2.0, 2.0
    assert best_of([first, second], "maximize") is first


@pytest.mark.parametrize(
    ("parent", "turns", "direction", "rate"),
    [
        (2.0, [2.5, 2.4], "maximize", 0.5),  # turn 2 (2.4) worse than turn 1 (2.5): 1 of 2
        (2.0, [1.9, 2.4], "maximize", 0.5),  # turn 1 (1.9) worse than the parent (2.0)
        (2.0, [2.0, 2.0], "maximize", 0.0),  # equal is not worse
        (1.8, [2.0, 1.5], "maximize", 0.5),
        (1.8, [2.0, 1.5], "minimize", 0.5),  # 2.0 worse than 1.8 when minimizing, 1.5 better than 2.0
        (10.0, [9.0, 9.5], "minimize", 0.5),  # 9.5 > 9.0 is worse when minimizing
        (None, [1.0, None], "maximize", 0.5),  # no start score: turn 1 not regressed; turn 2 has no score
        (None, [None, 3.0], "minimize", 0.5),  # turn 2 starts from None: not regressed
        (1.0, [None, None], "maximize", 1.0),  # no numeric score on either turn
        (None, [1.0], "maximize", 0.0),
        (1.0, [math.nan, 2.0], "maximize", 0.5),  # NaN is no score
        (1.0, [], "maximize", 1.0),  # an edge with no turns regressed entirely (the rate the search stores)
    ],
)
def test_regressed_rate_by_hand(parent, turns, direction, rate):
    assert regressed_rate(parent, turns, direction) == rate
