"""Section 2 formulas as pure functions: stage split of a Student run and the quota picks inside stages.

All inputs are plain lists in global (eval) order; nothing here reads files. The choices DESIGN.md fixes:

- smoothing: centred moving average (pandas `rolling(window, center=True, min_periods=1)`), shrinking at the
  ends; for an even window the extra value is taken from the earlier side, as pandas does;
- S0 = mean of the first max(1, ceil(5% N)) smoothed values, S_inf = mean of the last max(1, ceil(20% N));
- gain ratio c = clip((smooth - S0) / (S_inf - S0), 0, 1): early c < 0.5 <= middle < 0.9 <= late;
- when S_inf <= S0 the split falls back to time position: first round(N/10) early, next round(4N/10) middle,
  the rest late (Python's round: halves go to the even neighbour);
- quotas split num_roots 1:3:2 by largest remainder (ties go middle, late, early);
- inside a stage, k of m candidates are taken at positions floor((i + 0.5) * m / k);
- a stage with too few eligible snapshots gives its shortfall to middle, then late, then early.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

STAGES = ("early", "middle", "late")
REFILL_ORDER = ("middle", "late", "early")
STAGE_RATIO = {"early": 1, "middle": 3, "late": 2}
EARLY_BELOW, LATE_FROM = 0.5, 0.9


def fill_missing(scores: Sequence[float | None]) -> list[float]:
    """score_for_stage: own score, else the nearest earlier numeric score, else the nearest later one.

    Raises ValueError when there is no numeric score at all (the caller names the task).
    """
    if all(s is None for s in scores):
        raise ValueError("no numeric score")
    out: list[float | None] = list(scores)
    last = None
    for i, s in enumerate(out):  # forward fill
        if s is None:
            out[i] = last
        else:
            last = s
    first = next(s for s in out if s is not None)
    return [first if s is None else s for s in out]  # leading gap: the first (nearest later) score


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Centred moving average with shrinking ends, same as pandas rolling(window, center=True, min_periods=1)."""
    if window < 1:
        raise ValueError("window must be >= 1")
    n = len(values)
    before, after = window // 2, (window - 1) // 2
    prefix = list(accumulate(values, initial=0.0))  # the same additions, in the same order, as a loop

    def at(i: int) -> float:
        lo, hi = max(0, i - before), min(n, i + after + 1)
        return (prefix[hi] - prefix[lo]) / (hi - lo)

    if n < window:
        return [at(i) for i in range(n)]
    # Away from the ends every window is full: (prefix[i + after + 1] - prefix[i - before]) / window.
    full = [(hi - lo) / window for lo, hi in zip(prefix, prefix[window:], strict=False)]
    return [at(i) for i in range(before)] + full + [at(i) for i in range(n - after, n)]


def levels(smooth: Sequence[float]) -> tuple[float, float]:
    """(S0, S_inf): means of the first max(1, ceil(5% N)) and the last max(1, ceil(20% N)) smoothed values."""
    n = len(smooth)
    if n == 0:
        raise ValueError("empty sequence")
    head = max(1, -(-n // 20))  # ceil(5% N) in exact integer arithmetic
    tail = max(1, -(-n // 5))  # ceil(20% N)
    return sum(smooth[:head]) / head, sum(smooth[n - tail :]) / tail


def gain_ratio(value: float, s0: float, s_inf: float) -> float:
    """c = clip((value - S0) / (S_inf - S0), 0, 1); only defined when S_inf > S0."""
    return min(1.0, max(0.0, (value - s0) / (s_inf - s0)))


def stage_of_ratio(c: float) -> str:
    return "early" if c < EARLY_BELOW else ("middle" if c < LATE_FROM else "late")


def time_stages(n: int) -> list[str]:
    """Fallback split by position: first round(N/10) early, next round(4N/10) middle, rest late."""
    early = round(n / 10)
    middle = round(4 * n / 10)
    return ["early"] * early + ["middle"] * middle + ["late"] * (n - early - middle)


@dataclass(frozen=True)
class StageSplit:
    smooth: list[float]  # oriented smoothed scores
    gain: Sequence[float | None]  # None in the time fallback
    stages: list[str]
    s0: float
    s_inf: float
    method: str  # "gain" or "time"


def split_stages(oriented: Sequence[float], window: int = 5) -> StageSplit:
    """Stage of each snapshot from its oriented score_for_stage sequence (global order)."""
    smooth = moving_average(oriented, window)
    s0, s_inf = levels(smooth)
    if s_inf <= s0:
        return StageSplit(smooth, [None] * len(smooth), time_stages(len(smooth)), s0, s_inf, "time")
    # gain_ratio and stage_of_ratio, inlined as comprehensions (they run once per snapshot) with the same
    # results: min(1.0, max(0.0, c)) keeps c only when 0 < c < 1 (NaN gives 0.0, as max does).
    span = s_inf - s0
    ratios = [(v - s0) / span for v in smooth]
    gain = [1.0 if c >= 1.0 else (c if c > 0.0 else 0.0) for c in ratios]
    stages = ["early" if c < EARLY_BELOW else ("middle" if c < LATE_FROM else "late") for c in gain]
    return StageSplit(smooth, gain, stages, s0, s_inf, "gain")


def quotas(num_roots: int, ratio: dict[str, int] = STAGE_RATIO) -> dict[str, int]:
    """Split num_roots by the stage ratio with the largest-remainder method (30 -> 5/15/10).

    Remainder ties go in refill order (middle, late, early), the stage the method favours.
    """
    total = sum(ratio.values())
    base = {s: num_roots * ratio[s] // total for s in STAGES}
    left = num_roots - sum(base.values())
    by_remainder = sorted(REFILL_ORDER, key=lambda s: -(num_roots * ratio[s] % total))  # stable: refill order
    for s in by_remainder[:left]:
        base[s] += 1
    return base


def even_picks(m: int, k: int) -> list[int]:
    """Positions of k evenly spaced picks among m items: floor((i + 0.5) * m / k); all of them when k >= m."""
    if k >= m:
        return list(range(m))
    return [(2 * i + 1) * m // (2 * k) for i in range(k)]


def choose(stages: Sequence[str], eligible: Sequence[bool], num_roots: int) -> dict[int, str]:
    """Pick roots: {position: selection_reason}, reason `quota` or `refill:<stage that was short>`.

    Each stage takes its quota from its eligible snapshots (global order, evenly spaced). A stage with fewer
    eligible snapshots than its quota takes them all, and its shortfall is taken from middle, then late, then
    early, each giving evenly spaced picks among its not yet chosen eligible snapshots. Short stages are
    refilled in time order (early, middle, late).
    """
    if len(stages) != len(eligible):
        raise ValueError("stages and eligible differ in length")
    pool: dict[str, list[int]] = {s: [] for s in STAGES}
    for i, (stage, ok) in enumerate(zip(stages, eligible, strict=True)):
        if ok:
            pool[stage].append(i)
    want = quotas(num_roots)
    chosen: dict[int, str] = {}
    short: dict[str, int] = {}
    for s in STAGES:
        take = min(want[s], len(pool[s]))
        for p in even_picks(len(pool[s]), take):
            chosen[pool[s][p]] = "quota"
        if want[s] > take:
            short[s] = want[s] - take
    for s, missing in short.items():
        for donor in REFILL_ORDER:
            if missing == 0:
                break
            rest = [i for i in pool[donor] if i not in chosen]
            take = min(missing, len(rest))
            for p in even_picks(len(rest), take):
                chosen[rest[p]] = f"refill:{s}"
            missing -= take
    return chosen
