"""Rank tables (sorted once) give exactly the one-by-one percentile ranks Select used before."""

import random

import pytest

from sftree.search import scoring


def test_hand_computed_ties_none_and_minimize():
    raw = [1.0, None, 2.0, 2.0, float("nan"), 0.5]  # NaN is "no numeric score" like None
    ranks = scoring.score_ranks(raw, "maximize")
    # 2.0: worse = 2 None-likes + 1.0 + 0.5 = 4, equal = 2 -> (4 + 1) / 6
    assert ranks(2.0) == 5 / 6 and ranks(None) == (0.5 * 2) / 6 and ranks(0.5) == (2 + 0.5) / 6
    low = scoring.score_ranks(raw, "minimize")  # smaller is better: 0.5 beats 1.0 and both 2.0
    assert low(0.5) == (2 + 3 + 0.5) / 6 and low(2.0) == (2 + 0.5 * 2) / 6
    tokens = scoring.token_rewards([1000, 3000, 3000, 2000])
    assert tokens(1000) == (3 + 0.5) / 4 and tokens(3000) == (0 + 0.5 * 2) / 4
    with pytest.raises(ValueError):
        scoring.rank_table([])


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_equal_to_percentile_rank(direction):
    rng = random.Random(7)
    for _ in range(50):
        vals = [rng.choice([None, rng.randint(0, 5), rng.random()]) for _ in range(rng.randint(1, 30))]
        table = scoring.score_ranks(vals, direction)
        for v in vals:
            assert table(v) == scoring.score_rank(v, vals, direction)
        toks = [rng.randint(0, 4) * 1000 for _ in vals]
        treward = scoring.token_rewards(toks)
        assert all(treward(t) == scoring.token_reward(t, toks) for t in toks)
