"""The native agent: a Python loop over the Teacher's chat completions with OpenCode's tools.

One rollout turn: append the turn's user prompt, then model steps until the first `coral eval` (the turn ends
right after it; later tool calls of the same step get a "not run" result so every call has its answer), the
step limit (`step_limit`), the turn timeout (`timeout`), or a model that keeps stopping without an eval after
`agent.nudges` reminders (`no_eval`). A Teacher that stays down past the retry budget ends the turn with
`teacher_error`. A session that outgrows the model's context ends the turn with `context_overflow`: either the
server's 400 says so, or the last step's usage plus `teacher.max_tokens` would reach `teacher.context_tokens`
(checked before each request, so the 400 is rarely needed). A reply that is not a readable completion is one
failed step (recorded with `response: null` and the reason; the request is sent again as the next step). A tool
call cut off by `finish_reason: length` is not run: it gets an error result (a tool error) so every call has its
answer. The session is the message list itself; nothing else is carried between turns.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sftree.agents.base import Teacher, ToolOutcome, TurnOutcome, TurnRun
from sftree.agents.nativetools import TOOL_SCHEMAS, TOOLBOX, ToolContext, execute
from sftree.agents.prompts import render
from sftree.jsontypes import JSONObject, JSONValue, arr, obj
from sftree.records.steplog import ChatRequest, StepKind, StepRecord, ToolResult, usage_from
from sftree.runtime.sandbox import CORAL_MOUNT, resolve_mode
from sftree.teacher.client import BadReply, ContextOverflow
from sftree.teacher.params import sent_params
from sftree.teacher.transport import TeacherError
from sftree.world.standin import nudge_prompt

if TYPE_CHECKING:
    from sftree.runtime.edgebox import EdgeBox
    from sftree.settings import AgentSettings
    from sftree.teacher.client import Completion

log = logging.getLogger(__name__)

NOT_RUN = "Not run: the turn ended at `coral eval`."
NOT_RUN_TIMEOUT = "Not run: the turn's time (turn_timeout) is up."
TRUNCATED = (
    "Not run: your reply was cut off at the output token limit (finish_reason: length) inside this tool call, "
    "so its arguments are incomplete. Make the call again with shorter arguments."
)


def context_check(used: int, max_tokens: int, context_tokens: int | None) -> str | None:
    """Why the next request would not fit the model's context, or None (pure: used = last prompt+completion)."""
    if not context_tokens or used + max_tokens < context_tokens:
        return None
    return (
        f"context_overflow: the session holds {used} tokens; with max_tokens {max_tokens} the next request "
        f"would reach teacher.context_tokens {context_tokens}"
    )


@dataclass(frozen=True)
class ToolCall:
    """One tool call of the Teacher's reply as it goes back into the session (`arguments` as JSON text)."""

    id: JSONValue  # the reply's own id (`call_<i>` when it gave none)
    name: str
    arguments: str

    def to_json(self) -> JSONObject:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def tool_calls(msg: Mapping[str, JSONValue]) -> list[ToolCall]:
    """The calls of a reply's message (`teacher.response.normalize`d), in order."""
    calls = []
    for i, c in enumerate(arr(msg.get("tool_calls"))):
        call = obj(c)
        fn = obj(call.get("function"))
        args = fn.get("arguments")
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        calls.append(ToolCall(call.get("id") or f"call_{i}", str(fn.get("name", "")), text))
    return calls


def assistant_message(msg: Mapping[str, JSONValue]) -> JSONObject:
    """The assistant message as it goes back into the session: fixed keys, content always present."""
    out: JSONObject = {"role": "assistant", "content": msg.get("content") or ""}
    if msg.get("reasoning_content"):
        out["reasoning_content"] = msg["reasoning_content"]
    calls: list[JSONValue] = [c.to_json() for c in tool_calls(msg)]
    if calls:
        out["tool_calls"] = calls
    return out


def failed_step(
    turn: int, step: int, kind: StepKind, request: ChatRequest, error: str, raw: str | None = None
) -> StepRecord:
    """The step record of a model call that produced no message (docs/architecture.md)."""
    rec: StepRecord = {
        "turn": turn,
        "step": step,
        "kind": kind,
        "request": request,
        "response": None,
        "tool_results": [],
        "usage": None,
        "latency_s": 0.0,
        "finish_reason": None,
        "error": error,
    }
    if raw is not None:
        rec["raw_response"] = raw
    return rec


class NativeAgent:
    """The native backend (module docstring): an `AgentBackend`."""

    name = "native"
    student_model: str | None = None  # its prompt and tools are OpenCode's, for no model id in particular
    needs_probe = False

    def __init__(self, teacher: Teacher, settings: AgentSettings):
        self.teacher = teacher
        self.settings = settings
        self.sandbox = resolve_mode(settings.sandbox)
        self.tools = TOOL_SCHEMAS

    def prepare(self, run: TurnRun) -> None:
        """Nothing to learn: the native agent's session is its own."""

    def end_edge(self, edge_id: str) -> None:
        """Nothing is held per edge."""

    def close(self) -> None:
        """Nothing is held per tree."""

    @staticmethod
    def toolbox_path(box: EdgeBox) -> str:
        """The toolbox program as the sandbox sees it: a copy beside the coral client (the project is hidden)."""
        if not box.sandboxed or box.coral_dir is None:
            return str(TOOLBOX)
        copy = Path(box.coral_dir) / "bin" / TOOLBOX.name
        if not copy.exists():
            copy.write_bytes(TOOLBOX.read_bytes())
            copy.chmod(0o644)
        return f"{CORAL_MOUNT}/bin/{TOOLBOX.name}"

    def tool_context(self, run: TurnRun, deadline: float | None = None) -> ToolContext:
        return ToolContext(
            box=run.box,
            toolbox=self.toolbox_path(run.box),
            bash_timeout=self.settings.bash_timeout,
            output_cap=self.settings.output_cap,
            deadline=deadline,
        )

    def run_turn(self, run: TurnRun) -> TurnOutcome:
        deadline = time.monotonic() + self.settings.turn_timeout
        return self._run_turn(run, self.tool_context(run, deadline), deadline)

    def _run_turn(self, run: TurnRun, ctx: ToolContext, deadline: float) -> TurnOutcome:
        max_steps = self.settings.max_steps_per_turn
        nudges_left = self.settings.nudges
        out = TurnOutcome(ended="step_limit")
        messages = self._open_turn(run)
        kind: StepKind = "agent"
        evals_before = len(run.coral.evals)
        used = int(run.context_used or 0)  # the session's context so far (usage of its last step)
        while True:
            if out.steps >= max_steps:
                out.ended = "step_limit"
                break
            if time.monotonic() >= deadline:
                out.ended = "timeout"
                break
            request: ChatRequest = {
                "model": self.teacher.model,
                "messages": list(messages),
                "tools": self.tools,
                # the other fields sent (teacher/params.py: the one place both backends take them from)
                "params": sent_params(
                    self.teacher.params.body(list(messages), list(self.tools), run.headers)
                ),
            }
            full = context_check(used, self.teacher.max_tokens, self.teacher.context_tokens)
            if full:
                out.ended, out.error = "context_overflow", full
                break
            try:
                comp = self.teacher.chat(messages, self.tools, headers=run.headers)
            except (TeacherError, ContextOverflow) as exc:
                overflow = isinstance(exc, ContextOverflow)
                out.ended = "context_overflow" if overflow else "teacher_error"
                out.error = f"context_overflow: {exc}" if overflow else str(exc)
                run.recorder.write(failed_step(run.turn, out.steps + 1, kind, request, out.error))
                break
            except BadReply as exc:
                # one failed step: nothing joins the session, the next step resends the same request
                out.steps += 1
                run.recorder.write(
                    failed_step(run.turn, out.steps, kind, request, f"malformed reply: {exc}", exc.raw)
                )
                continue
            out.steps += 1
            msg, calls = assistant_message(comp.message), tool_calls(comp.message)
            messages.append(msg)
            out.tokens = used = comp.usage.prompt_tokens + comp.usage.completion_tokens
            results, turn_done = self._run_calls(run, ctx, comp, calls, out, evals_before)
            run.recorder.write(self._step_record(run, out.steps, kind, request, msg, results, comp))
            kind = "agent"
            if turn_done:
                out.ended = "eval"
                break
            if time.monotonic() >= deadline:
                out.ended = "timeout"
                break
            if not calls:
                if nudges_left <= 0:
                    out.ended = "no_eval"
                    break
                nudges_left -= 1
                messages.append({"role": "user", "content": nudge_prompt()})
                kind = "nudge"
        return out

    def _open_turn(self, run: TurnRun) -> list[JSONObject]:
        """The session with the turn's prompt added (a fresh one starts with the system prompt)."""
        messages = run.messages
        if not messages:  # a fresh session: the system prompt, carrying AGENTS.md as OpenCode does
            text = run.instructions.strip()
            messages.append(
                {"role": "system", "content": render("system", self.settings.prompts, agents_md=text)}
            )
        messages.append({"role": "user", "content": run.prompt})
        return messages

    @staticmethod
    def _run_calls(
        run: TurnRun,
        ctx: ToolContext,
        comp: Completion,
        calls: list[ToolCall],
        out: TurnOutcome,
        evals_before: int,
    ) -> tuple[list[ToolResult], bool]:
        """Run the step's tool calls in order, each result added to the session and counted in `out`; once the
        turn's `coral eval` ran (True returned with the results) or its time is up, the rest are not run."""
        messages, deadline = run.messages, ctx.deadline
        results: list[ToolResult] = []
        turn_done = False
        for call in calls:
            name, call_id = call.name, call.id
            if turn_done:
                res = ToolOutcome(NOT_RUN)
            elif deadline is not None and time.monotonic() >= deadline:
                res = ToolOutcome(NOT_RUN_TIMEOUT)
            elif comp.truncated_calls:
                res = ToolOutcome(TRUNCATED, error=True)
                out.tool_calls += 1
                out.tool_errors += 1
            else:
                res = execute(name, call.arguments, ctx)
                out.tool_calls += 1
                out.tool_errors += int(res.error)
                out.knowledge = out.knowledge or res.knowledge
                if len(run.coral.evals) > evals_before:
                    out.eval = run.coral.evals[evals_before]
                    turn_done = True
            messages.append({"role": "tool", "tool_call_id": call_id, "content": res.content})
            results.append(
                {
                    "tool_call_id": call_id,
                    "name": name,
                    "content": res.content,
                    "error": res.error,
                    "knowledge": res.knowledge,
                }
            )
        return results, turn_done

    @staticmethod
    def _step_record(
        run: TurnRun,
        step: int,
        kind: StepKind,
        request: ChatRequest,
        msg: JSONObject,
        results: list[ToolResult],
        comp: Completion,
    ) -> StepRecord:
        """The step record of a model call and the tool calls it made (docs/architecture.md)."""
        record: StepRecord = {
            "turn": run.turn,
            "step": step,
            "kind": kind,
            "request": request,
            "response": msg,
            "tool_results": results,
            "usage": usage_from(comp.usage),
            "latency_s": round(comp.latency_s, 4),
            "finish_reason": comp.finish_reason,
        }
        if comp.notes:
            record["notes"] = list(comp.notes)
        if comp.logprobs is not None:
            record["logprobs"] = comp.logprobs
        if comp.logprobs_dropped is not None:
            record["logprobs_dropped"] = comp.logprobs_dropped
        return record
