"""The edge result that crosses run_edge -> mcts.tell is a frozen, typed record: the search cannot change what an
edge reported, and tell reads named fields (no duck typing)."""

import dataclasses
import inspect

import pytest

from sftree.search import mcts
from sftree.search.edge import EdgeResult, TurnResult


def _turn(i: int) -> TurnResult:
    return TurnResult(i, 1.0, "improved", "c", 1, 2, 0, True, 100, "eval")


def test_edge_result_and_its_turns_are_frozen():
    r = EdgeResult(
        edge_id="e1", turns=[_turn(1), _turn(2)], score=1.0, valid=True, steps=2, tool_calls=4, tool_errors=0,
        tool_error_rate=0.0, tokens=100, knowledge=True, regressed_rate=0.0, child_state=None,
        transcript="edges/e1/steps.jsonl", code_diff="", knowledge_diff="", error=None, wall_s=0.1,
    )  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.score = 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.turns[0].ended = "teacher_error"


def test_tell_takes_the_typed_record():
    hints = inspect.signature(mcts.tell).parameters["result"].annotation
    assert hints in ("EdgeResult", EdgeResult)
