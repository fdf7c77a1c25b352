"""Pure formulas of the token-aware MCTS (seed section 1.3 and 1.7): ranks, Q, T, Select and the soft score.

Scores are *raw* in tree.json; every comparison or ranking first orients them (`records.scores.oriented`, the
one definition every stage shares): "larger is better" everywhere below. `None` means "no numeric score" and
ranks below every number.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from sftree.records.scores import better, oriented, percentile_rank

# Q weights (1.3) and soft-score weights (1.7).
W_SCORE_RANK, W_BEST_RANK, W_PROCESS = 0.40, 0.30, 0.30
W_OUTCOME, W_CLEAN, W_KNOWLEDGE, W_STABILITY = 0.30, 0.20, 0.20, 0.30
OUTCOME_IMPROVED, OUTCOME_NOT_IMPROVED = 1.0, 0.7
CLEAN_REFERENCE_RATE = 0.30  # the error rate at which cleanliness has fallen to 0.3 (the prune threshold)
CLEAN_FLOOR = 0.3


def rank_table(values: Sequence[float | None]) -> Callable[[float | None], float]:
    """`percentile_rank(v, values)` for many v at O(log n) each (sorted once): Select ranks every candidate
    against every node, which is quadratic when done one by one. Same counts, same division: equal results."""
    n = len(values)
    if n == 0:
        raise ValueError("percentile_rank of an empty set")
    nums = sorted(v for v in values if v is not None)
    nones = n - len(nums)

    def rank(value: float | None) -> float:
        if value is None:
            return (0 + 0.5 * nones) / n
        lo, hi = bisect.bisect_left(nums, value), bisect.bisect_right(nums, value)
        return (nones + lo + 0.5 * (hi - lo)) / n

    return rank


def score_ranks(all_scores: Sequence[float | None], direction: str) -> Callable[[float | None], float]:
    """score_rank(s, all_scores, direction) as a function of s, for many s."""
    table = rank_table([oriented(s, direction) for s in all_scores])
    return lambda s: table(oriented(s, direction))


def token_rewards(active_tokens: Sequence[float]) -> Callable[[float], float]:
    """token_reward(t, active_tokens) as a function of t, for many t."""
    table = rank_table([-float(t) for t in active_tokens])
    return lambda t: table(-float(t))


def score_rank(score: float | None, all_scores: Sequence[float | None], direction: str) -> float:
    """score_rank(n): the node's own score among all tree nodes' scores (raw in, oriented inside)."""
    return percentile_rank(oriented(score, direction), [oriented(s, direction) for s in all_scores])


def best_rank(path_best: float | None, all_path_bests: Sequence[float | None], direction: str) -> float:
    """best_rank(n): the node's path_best_score among every node's path_best_score."""
    return score_rank(path_best, all_path_bests, direction)


def process(path_softs: Sequence[float | None]) -> float:
    """process(n): mean soft score of the edges root..n; the root (no edges) gets 0. None softs are skipped."""
    vals = [s for s in path_softs if s is not None]
    return sum(vals) / len(vals) if vals else 0.0


def q_value(score_rank_: float, best_rank_: float, process_: float) -> float:
    return W_SCORE_RANK * score_rank_ + W_BEST_RANK * best_rank_ + W_PROCESS * process_


def token_reward(tokens: float, active_tokens: Sequence[float]) -> float:
    """T(n): shorter context ranks higher among the active nodes (ties share a mid-rank)."""
    return percentile_rank(-float(tokens), [-float(t) for t in active_tokens])


def select_value(q: float, t: float, alpha: float) -> float:
    return q + alpha * t


# --- soft verifier (1.7) -------------------------------------------------------------------------------


def tool_error_rate(tool_calls: int, tool_errors: int) -> float:
    """failed / total tool calls over the edge; an edge with no tool calls has rate 0."""
    return tool_errors / tool_calls if tool_calls > 0 else 0.0


def improved(edge_score: float | None, parent_score: float | None, direction: str) -> bool:
    """The edge's best score strictly beats the parent's (a number beats a parent without one)."""
    return better(edge_score, parent_score, direction)


def outcome(edge_score: float | None, parent_score: float | None, direction: str) -> float:
    return OUTCOME_IMPROVED if improved(edge_score, parent_score, direction) else OUTCOME_NOT_IMPROVED


def cleanliness(rate: float) -> float:
    """1.0 for a clean edge, else 0.8 falling linearly with the error rate, floored at 0.3."""
    if rate == 0:
        return 1.0
    return max(CLEAN_FLOOR, 0.8 - 0.5 * rate / CLEAN_REFERENCE_RATE)


def knowledge_score(is_improved: bool, has_knowledge: bool) -> float:
    if is_improved:
        return 1.0 if has_knowledge else 0.8
    return 0.6 if has_knowledge else 0.4


def regression_stability(regressed_rate_: float) -> float:
    return 1.0 - regressed_rate_


def soft(outcome_: float, cleanliness_: float, knowledge_: float, stability: float) -> float:
    return W_OUTCOME * outcome_ + W_CLEAN * cleanliness_ + W_KNOWLEDGE * knowledge_ + W_STABILITY * stability


@dataclass(frozen=True)
class SoftBreakdown:
    outcome: float
    cleanliness: float
    knowledge_score: float
    regression_stability: float
    soft: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def soft_breakdown(
    edge_score: float | None,
    parent_score: float | None,
    direction: str,
    rate: float,
    has_knowledge: bool,
    regressed_rate_: float,
) -> SoftBreakdown:
    """All four soft components and the soft score of one edge."""
    is_imp = improved(edge_score, parent_score, direction)
    o = OUTCOME_IMPROVED if is_imp else OUTCOME_NOT_IMPROVED
    c = cleanliness(rate)
    k = knowledge_score(is_imp, has_knowledge)
    r = regression_stability(regressed_rate_)
    return SoftBreakdown(o, c, k, r, soft(o, c, k, r))
