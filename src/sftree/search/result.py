"""What one finished edge reports to the search (`search/edge.py:run_edge` -> `search/mcts.py:tell`): a frozen,
typed record, so the policy reads named fields and never guesses at a shape (as TreeQuest's `Trial` crosses
ask/tell). Field names match tree.json's edge entries and their `turns`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from sftree.jsontypes import JSONObject
from sftree.records.tree import Turn

if TYPE_CHECKING:
    from sftree.runtime.workspace import NodeState


# One rollout turn (it ends at the first `coral eval`, or fails): the tree's own turn record, declared once
# (records/tree.py `Turn`), so an edge's turns go into the tree as they are.
TurnResult = Turn


@dataclass(frozen=True)
class EdgeResult:
    """Everything the search needs about one edge; field names match tree.json's edge entries."""

    edge_id: str
    turns: list[TurnResult]
    score: float | None  # raw score of the best numeric turn (by direction), None if no turn had one
    valid: bool  # both turns got a numeric score
    steps: int
    tool_calls: int
    tool_errors: int
    tool_error_rate: float
    tokens: int  # session context length after the last step
    knowledge: bool  # both turns had a knowledge action
    regressed_rate: float
    child_state: NodeState | None  # state after turn 2 (also when a turn failed); None if the fork failed
    transcript: str  # edges/<id>/steps.jsonl, relative to the tree dir
    code_diff: str
    knowledge_diff: str
    error: str | None  # why the edge failed, if it did (teacher unreachable, workspace error, ...)
    wall_s: float
    evals: int = 0  # `coral eval` calls that produced an eval number (for the child's eval_count)
    framework_s: float = 0.0  # wall time minus model latency and grader time (benchmarks)
    teacher_s: float = 0.0
    grader_s: float = 0.0
    tampered: str | None = (
        None  # a request broke the session's chain (agents/chain.py): no child, never trained
    )

    def to_dict(self) -> JSONObject:
        d = asdict(self)
        d["child_state"] = self.child_state.to_dict() if self.child_state else None
        return d
