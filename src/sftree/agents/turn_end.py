"""Why a turn without a graded eval ended, said precisely: a weak model fails in a few distinct ways, and the card
counts each (docs/real_teacher.md, "End reasons").

A turn's backend first says how it stopped (`step_limit`, `no_eval`: the model went quiet after its nudges,
`teacher_error`, ...). For a turn that reached no eval this refines it from the turn's own model calls, as the proxy
recorded them (pure: records in, a reason out):

- `no_tool_call`: no reply of the turn carried a tool call (text only, or calls written as text OpenCode never ran);
- `cut_call`: a reply was cut at `max_tokens` inside a tool call. OpenCode resends such a call as its own `invalid`
  tool, the cut arguments twice (the call and the tool result) in every later request, so the backend ends the
  turn at that reply, before another step pays for them (docs/real_teacher.md, "A call cut at max_tokens");
- `malformed_call`: the turn's last call could not run as sent: its arguments are not a JSON object;
- `unknown_tool`: the turn's last call names a tool the request did not offer;
- `no_eval` / `step_limit`: the calls ran, and no `coral eval` came (the model stopped, or the steps ran out);
- `context_overflow`: the server refused a request past its context (its 400 says so);
- `teacher_stalled`: a request got no answer in time (a read timeout, a stream cut mid-reply) past the retries;
  the search treats it as `teacher_error` (a Teacher down is no property of the node).
"""

from __future__ import annotations

import json
import re
from typing import Literal

from sftree.jsontypes import JSONValue, arr, obj
from sftree.records.steplog import StepRecord
from sftree.records.tree import TurnEnd

CallFault = Literal["cut_call", "malformed_call", "unknown_tool"]
# Refined only from these: the others (eval, timeout, tampered, edge_error) already say why.
REFINED: tuple[TurnEnd, ...] = ("no_eval", "step_limit", "cut_call")
# search/edge.py, mcts.py: the Teacher, not the node
TEACHER_DOWN: tuple[TurnEnd, ...] = ("teacher_error", "teacher_stalled")
_OVERFLOW = re.compile(r"context|too (?:long|many tokens)|exceeds? (?:the )?(?:available|maximum)", re.I)
_STALL = re.compile(r"timed? ?out|timeout|stream cut|stall", re.I)


def offered(record: StepRecord) -> set[str]:
    """The tool names the record's request offered."""
    names = (obj(obj(t).get("function")).get("name") for t in arr(obj(record.get("request")).get("tools")))
    return {n for n in names if isinstance(n, str)}


def _args_ok(call: JSONValue) -> bool:
    raw = obj(obj(call).get("function")).get("arguments")
    if isinstance(raw, dict):
        return True
    try:
        return isinstance(json.loads(raw), dict) if isinstance(raw, str) else False
    except ValueError:
        return False


def _tool_calls(record: StepRecord) -> JSONValue:
    """The reply's `tool_calls` as sent (None when there is no reply or none)."""
    return obj(record.get("response")).get("tool_calls")


def cut_call(record: StepRecord) -> bool:
    """A reply cut at `max_tokens` while it was writing a tool call (the call's arguments are cut)."""
    return record.get("finish_reason") == "length" and bool(_tool_calls(record))


def call_fault(record: StepRecord) -> CallFault | None:
    """`cut_call` | `malformed_call` | `unknown_tool` | None for one model call's reply."""
    calls = [c for c in arr(_tool_calls(record)) if isinstance(c, dict)]
    if cut_call(record):
        return "cut_call"
    if any(not _args_ok(c) for c in calls):
        return "malformed_call"
    names = offered(record)
    if names and any(obj(c.get("function")).get("name") not in names for c in calls):
        return "unknown_tool"
    return None


def refine(ended: TurnEnd, records: list[StepRecord], error: str | None = None) -> TurnEnd:
    """The turn's end reason, from how the backend stopped it and the turn's step records."""
    if ended == "teacher_error":
        failed = (
            " ".join(str(r.get("error") or "") for r in records if r.get("error")) + " " + str(error or "")
        )
        if _OVERFLOW.search(failed):
            return "context_overflow"
        return "teacher_stalled" if _STALL.search(failed) else ended
    if ended not in REFINED:
        return ended
    calls = [r for r in records if r.get("kind") in ("agent", "nudge") and r.get("response")]
    with_calls = [r for r in calls if _tool_calls(r)]
    if not with_calls:
        return "no_tool_call"
    return call_fault(with_calls[-1]) or ended
