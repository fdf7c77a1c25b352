"""search/scoring.py against hand-computed numbers: ties, minimize, missing scores, a single node."""

import pytest
from scipy.stats import percentileofscore

from sftree.search import scoring as s

approx = pytest.approx


def test_percentile_rank_ties_and_single():
    vals = [1.0, 2.0, 2.0, 3.0]
    assert s.percentile_rank(2.0, vals) == approx((1 + 0.5 * 2) / 4)  # 0.5
    assert s.percentile_rank(3.0, vals) == approx(3.5 / 4)
    assert s.percentile_rank(1.0, vals) == approx(0.5 / 4)
    assert s.percentile_rank(7.0, [7.0]) == 0.5
    for v in vals:
        assert s.percentile_rank(v, vals) == approx(percentileofscore(vals, v, kind="mean") / 100)


def test_percentile_rank_none_below_numbers():
    vals = [None, 1.0, 2.0]
    assert s.percentile_rank(None, vals) == approx(0.5 / 3)
    assert s.percentile_rank(1.0, vals) == approx(1.5 / 3)
    assert s.percentile_rank(None, [None, None]) == 0.5


def test_score_rank_minimize_and_best_rank():
    # minimize: 3 is best, 7 worst
    assert s.score_rank(3.0, [5.0, 3.0, 7.0], "minimize") == approx(2.5 / 3)
    assert s.score_rank(5.0, [5.0, 3.0, 7.0], "minimize") == approx(1.5 / 3)
    assert s.score_rank(7.0, [5.0, 3.0, 7.0], "minimize") == approx(0.5 / 3)
    assert s.score_rank(None, [5.0, None, 7.0], "minimize") == approx(0.5 / 3)
    assert s.best_rank(2.0, [2.0, 2.0, 1.0, 3.0], "maximize") == approx(2 / 4)


def test_process_q_t_select():
    assert s.process([]) == 0.0  # root
    assert s.process([0.8, 0.6]) == approx(0.7)
    assert s.process([0.8, None]) == approx(0.8)
    q = s.q_value(0.5, 0.75, 0.7)
    assert q == approx(0.2 + 0.225 + 0.21)
    toks = [100, 200, 200, 300]
    assert s.token_reward(100, toks) == approx(3.5 / 4)
    assert s.token_reward(200, toks) == approx(2 / 4)
    assert s.token_reward(300, toks) == approx(0.5 / 4)
    assert s.token_reward(0, [0]) == 0.5
    assert s.select_value(q, 0.875, 0.5) == approx(0.635 + 0.4375)


def test_outcome():
    assert s.outcome(2.36, 2.31, "maximize") == 1.0
    assert s.outcome(2.31, 2.31, "maximize") == 0.7
    assert s.outcome(2.0, 2.31, "minimize") == 1.0
    assert s.outcome(2.5, 2.31, "minimize") == 0.7
    assert s.outcome(1.0, None, "maximize") == 1.0
    assert s.outcome(None, None, "maximize") == 0.7
    assert s.outcome(None, 1.0, "maximize") == 0.7


def test_cleanliness_and_rate():
    assert s.tool_error_rate(0, 0) == 0.0
    assert s.tool_error_rate(17, 1) == approx(1 / 17)
    assert s.cleanliness(0.0) == 1.0
    assert s.cleanliness(0.06) == approx(0.7)
    assert s.cleanliness(0.15) == approx(0.55)
    assert s.cleanliness(0.30) == approx(0.3)
    assert s.cleanliness(0.5) == 0.3  # floor (a pruned rate, but exempt edges still get a value)
    assert s.cleanliness(1 / 17) == approx(0.8 - 0.5 * (1 / 17) / 0.3)


def test_knowledge_and_stability():
    assert [s.knowledge_score(True, True), s.knowledge_score(True, False)] == [1.0, 0.8]
    assert [s.knowledge_score(False, True), s.knowledge_score(False, False)] == [0.6, 0.4]
    assert s.regression_stability(0.5) == 0.5


def test_soft_and_breakdown():
    assert s.soft(1.0, 0.7, 1.0, 0.5) == approx(0.3 + 0.14 + 0.2 + 0.15)
    b = s.soft_breakdown(2.36, 2.31, "maximize", 1 / 17, True, 0.5)
    assert b.outcome == 1.0 and b.knowledge_score == 1.0 and b.regression_stability == 0.5
    assert b.cleanliness == approx(0.8 - 0.5 * (1 / 17) / 0.3)
    assert b.soft == approx(0.3 + 0.2 * b.cleanliness + 0.2 + 0.15)
    # not improved, no knowledge, dirty (exempt edge with no score): 0.3*.7 + .2*.3 + .2*.4 + .3*0
    b = s.soft_breakdown(None, 2.0, "minimize", 0.5, False, 1.0)
    assert b.soft == approx(0.21 + 0.06 + 0.08 + 0.0)
