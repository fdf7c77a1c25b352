"""What a raw score means, for every stage: scores are stored *raw* (tree.json, metadata.json, paths.json) and
every comparison first orients them (`oriented`): maximize tasks keep the value, minimize tasks negate it, so
"larger is better" everywhere after. `None` (and NaN) means "no numeric score" and ranks below every number.

One definition of each, so select-roots' stages, the search, path selection, the export and the report cannot
disagree on which score is better; `percentile_rank` is the one mid-rank both the search (Select) and path
selection (PathScore) rank oriented values with.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypeGuard

MAXIMIZE, MINIMIZE = "maximize", "minimize"


def _numeric(x: float | None) -> TypeGuard[float]:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def oriented(score: float | None, direction: str) -> float | None:
    """The score in "larger is better" form: negated for minimize tasks; None (and NaN) become None."""
    if not _numeric(score):
        return None
    if direction == MAXIMIZE:
        return float(score)
    if direction == MINIMIZE:
        return -float(score)
    raise ValueError(f"direction must be {MAXIMIZE!r} or {MINIMIZE!r}, not {direction!r}")


def better(a: float | None, b: float | None, direction: str) -> bool:
    """True when raw score `a` is strictly better than raw score `b`. A number beats None; None beats nothing."""
    oa, ob = oriented(a, direction), oriented(b, direction)
    if oa is None:
        return False
    return ob is None or oa > ob


def best_of(scores: Iterable[float | None], direction: str) -> float | None:
    """The best raw score of a sequence, the first of equals (None when none is numeric)."""
    best = None
    for s in scores:
        if _numeric(s) and (best is None or better(s, best, direction)):
            best = s
    return best


def regressed_rate(parent_score: float | None, turn_scores: Sequence[float | None], direction: str) -> float:
    """Share of an edge's turns that ended worse than they started (turn 1: the parent's score, turn 2: turn 1's),
    on oriented scores. A turn with no numeric score counts as regressed; a numeric turn whose start had no score
    is not. An edge with no turns regressed entirely (1.0): it made nothing to keep."""
    if not turn_scores:
        return 1.0
    start, regressed = parent_score, 0
    for s in turn_scores:
        if not _numeric(s) or better(start, s, direction):
            regressed += 1
        start = s
    return regressed / len(turn_scores)


def percentile_rank(value: float | None, values: Sequence[float | None]) -> float:
    """(number strictly worse + 0.5 * number equal, itself included) / n over already-oriented values.

    `values` must contain `value`. None ranks below every number and ties with other Nones. Equals
    `scipy.stats.percentileofscore(values, value, kind="mean") / 100` when all values are numeric.
    """
    n = len(values)
    if n == 0:
        raise ValueError("percentile_rank of an empty set")
    if value is None:
        worse, equal = 0, sum(1 for v in values if v is None)
    else:
        worse = sum(1 for v in values if v is None or v < value)
        equal = sum(1 for v in values if v is not None and v == value)
    return (worse + 0.5 * equal) / n


def signed_gain(root: float | None, score: float | None, direction: str | None) -> float | None:
    """score - root oriented so that positive is better (a minimize task gains when its score drops); None when
    either is not a number or the direction is unknown."""
    if direction not in (MAXIMIZE, MINIMIZE):
        return None
    a, b = oriented(score, direction), oriented(root, direction)
    return None if a is None or b is None else a - b
