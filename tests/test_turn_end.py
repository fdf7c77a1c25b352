"""Why a turn without a graded eval ended (agents/turn_end.py): each way a weak model fails is its own end reason."""

from __future__ import annotations

import json

import pytest

from sftree.agents.turn_end import TEACHER_DOWN, call_fault, cut_call, refine

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in ("bash", "read", "edit")]


def step(calls=None, content="", finish="stop", kind="agent", error=None):
    resp = {"role": "assistant", "content": content}
    if calls:
        resp["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ]
    rec = {
        "kind": kind,
        "request": {"messages": [], "tools": TOOLS},
        "response": resp,
        "finish_reason": finish,
    }
    if error:
        rec.update(response=None, error=error)
    return rec


READ = ("read", json.dumps({"filePath": "solution.py"}))


@pytest.mark.parametrize(
    ("records", "ended", "why"),
    [
        ([step(content="I will now improve it."), step(content="Done.", kind="nudge")], "no_eval", "no_tool_call"),
        ([step([READ]), step([("edit", '{"filePath": "solution.py", "oldString": "x')], finish="length")],
         "cut_call", "cut_call"),
        ([step([READ]), step([("edit", "{filePath: solution.py}")])], "step_limit", "malformed_call"),
        ([step([READ]), step([("circle_packing", "{}")])], "no_eval", "unknown_tool"),
        ([step([("circle_packing", "{}")]), step([READ])], "step_limit", "step_limit"),  # the last call counts
        ([step([READ]), step(content="Finished.")], "no_eval", "no_eval"),
        ([step([READ])], "eval", "eval"),
        ([step([READ])], "timeout", "timeout"),
        ([step(error="HTTP 400: the request exceeds the available context size")], "teacher_error",
         "context_overflow"),
        ([step(error="stream cut: ConnectionError")], "teacher_error", "teacher_stalled"),
        ([step(error="teacher unreachable: ReadTimeout(...)")], "teacher_error", "teacher_stalled"),
        ([step(error="HTTP 500: boom")], "teacher_error", "teacher_error"),
    ],
)  # fmt: skip
def test_each_failure_of_a_weak_model_is_its_own_end_reason(records, ended, why):
    assert refine(ended, records) == why


def test_a_call_cut_at_max_tokens_is_told_from_cut_text():
    assert cut_call(step([READ], finish="length"))
    assert not cut_call(step(content="a long text", finish="length"))
    assert call_fault(step([READ])) is None
    assert "teacher_stalled" in TEACHER_DOWN and "teacher_error" in TEACHER_DOWN
