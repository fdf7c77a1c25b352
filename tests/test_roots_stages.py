"""Section 2 formulas (sftree.roots.stages), checked against hand-computed values."""

import random

import pandas as pd
import pytest

from sftree.roots import stages as st


def test_moving_average_hand_values():
    # window 5, shrinking ends: i0 = mean(1,2,3), i1 = mean(1..4), i2 = mean(1..5), i3 = mean(2..6), ...
    assert st.moving_average([1, 2, 3, 4, 5, 6], 5) == [2.0, 2.5, 3.0, 4.0, 4.5, 5.0]
    assert st.moving_average([4, 8], 1) == [4.0, 8.0]
    # even window: the extra value comes from the earlier side (pandas center=True)
    assert st.moving_average([0, 1, 2, 3, 4, 5], 4) == [0.5, 1.0, 1.5, 2.5, 3.5, 4.0]


@pytest.mark.parametrize("window", [1, 2, 4, 5, 7, 30])
def test_moving_average_matches_pandas(window):
    rng = random.Random(window)
    values = [rng.uniform(-5, 5) for _ in range(23)]
    expected = pd.Series(values).rolling(window, center=True, min_periods=1).mean().tolist()
    assert st.moving_average(values, window) == pytest.approx(expected, abs=1e-12)


def test_levels_head_and_tail_sizes():
    # N=20: S0 over ceil(1) = 1 value, S_inf over ceil(4) = 4 values
    seq = list(range(20))
    assert st.levels(seq) == (0.0, (16 + 17 + 18 + 19) / 4)
    # N=21: ceil(1.05) = 2 and ceil(4.2) = 5
    seq = list(range(21))
    assert st.levels(seq) == (0.5, (16 + 17 + 18 + 19 + 20) / 5)
    assert st.levels([7.0]) == (7.0, 7.0)


def test_fill_missing_earlier_then_later():
    assert st.fill_missing([None, None, 3.0, None, 5.0, None]) == [3.0, 3.0, 3.0, 3.0, 5.0, 5.0]
    with pytest.raises(ValueError):
        st.fill_missing([None, None])


def test_gain_split_boundaries_are_inclusive_upward():
    # S0 = 0 (first value), S_inf = mean of last 2 = 10: c = 0, 0.5, 0.9, 1 -> early, middle, late, late
    split = st.split_stages([0, 5, 9, 10, 10, 10, 10, 10, 10, 10], window=1)
    assert split.method == "gain" and (split.s0, split.s_inf) == (0.0, 10.0)
    assert split.gain[:4] == [0.0, 0.5, 0.9, 1.0]
    assert split.stages[:4] == ["early", "middle", "late", "late"]


def test_gain_ratio_is_clipped():
    assert st.gain_ratio(-3, 0, 10) == 0.0 and st.gain_ratio(12, 0, 10) == 1.0


@pytest.mark.parametrize(
    "n, counts",
    [(10, (1, 4, 5)), (15, (2, 6, 7)), (25, (2, 10, 13)), (5, (0, 2, 3)), (1, (0, 0, 1)), (3, (0, 1, 2))],
)
def test_time_fallback_uses_round_half_even(n, counts):
    # 25 -> round(2.5) = 2 early (half to even), round(10) = 10 middle; 15 -> round(1.5) = 2; 5 -> round(0.5) = 0
    stages = st.time_stages(n)
    assert (stages.count("early"), stages.count("middle"), stages.count("late")) == counts
    assert stages == sorted(stages, key=st.STAGES.index)  # early block, then middle, then late


def test_flat_and_falling_use_time_fallback():
    flat = st.split_stages([3.0] * 10)
    assert flat.method == "time" and flat.gain == [None] * 10  # S_inf == S0 counts as no rise
    falling = st.split_stages([10 - i for i in range(10)])
    assert falling.method == "time"
    assert falling.stages == ["early"] + ["middle"] * 4 + ["late"] * 5


@pytest.mark.parametrize(
    "num_roots, expected",
    [
        (30, (5, 15, 10)),
        (7, (1, 4, 2)),  # 7/6, 21/6, 14/6 -> 1, 3, 2 + the largest remainder (middle, .5)
        (10, (2, 5, 3)),  # 10/6 = 1.67 -> early gets the extra
        (31, (5, 16, 10)),  # remainders .17, .5, .33 -> middle
        (1, (0, 1, 0)),
        (2, (0, 1, 1)),
        (3, (0, 2, 1)),  # early and middle tie at .5: the tie goes to middle
        (4, (1, 2, 1)),
        (60, (10, 30, 20)),
    ],
)
def test_quotas_largest_remainder(num_roots, expected):
    q = st.quotas(num_roots)
    assert (q["early"], q["middle"], q["late"]) == expected and sum(q.values()) == num_roots


def test_even_picks():
    assert st.even_picks(10, 3) == [1, 5, 8]  # floor(1.67), floor(5), floor(8.33)
    assert st.even_picks(9, 1) == [4]
    assert st.even_picks(4, 3) == [0, 2, 3]
    assert st.even_picks(3, 5) == [0, 1, 2]
    assert st.even_picks(0, 2) == []


def test_choose_quota_picks():
    stages = ["early"] * 9 + ["middle"] * 4 + ["late"] * 7
    chosen = st.choose(stages, [True] * 20, 6)  # quotas 1/3/2
    assert chosen == {4: "quota", 9: "quota", 11: "quota", 12: "quota", 14: "quota", 18: "quota"}


def test_choose_refills_middle_then_late_then_early():
    # middle has one snapshot (quota 3): short by 2; late (3, quota 2) gives its one leftover, early the last
    stages = ["early"] * 8 + ["middle"] + ["late"] * 3
    chosen = st.choose(stages, [True] * 12, 6)
    assert chosen == {
        4: "quota",
        8: "quota",
        9: "quota",
        11: "quota",
        10: "refill:middle",
        3: "refill:middle",
    }


def test_choose_skips_ineligible_and_refills_a_short_early_stage():
    # early: 3 snapshots, none eligible -> short by 1 (quota 1 of 6); middle has room and refills it
    stages = ["early"] * 3 + ["middle"] * 6 + ["late"] * 4
    eligible = [False] * 3 + [True] * 10
    chosen = st.choose(stages, eligible, 6)
    # middle quota 3 of 6 -> positions 1, 3, 5 (idx 4, 6, 8); leftover 3, 5, 7 -> middle pick 5
    # late quota 2 of 4 -> positions 1, 3 (idx 10, 12)
    assert chosen == {4: "quota", 6: "quota", 8: "quota", 10: "quota", 12: "quota", 5: "refill:early"}


def test_choose_fewer_eligible_than_roots():
    chosen = st.choose(["early", "early", "middle", "late"], [True, False, True, True], 30)
    assert chosen == {0: "quota", 2: "quota", 3: "quota"}
