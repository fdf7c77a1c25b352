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
from pathlib import Path

from sftree.agents.base import AgentBackend, ToolOutcome, TurnOutcome, TurnRun
from sftree.agents.nativetools import TOOL_SCHEMAS, TOOLBOX, ToolContext, execute
from sftree.agents.prompts import render
from sftree.runtime.sandbox import CORAL_MOUNT, resolve_mode
from sftree.teacher.client import BadReply, ContextOverflow, TeacherError
from sftree.world.standin import nudge_prompt

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


def assistant_message(msg: dict) -> dict:
    """The assistant message as it goes back into the session: fixed keys, content always present."""
    out = {"role": "assistant", "content": msg.get("content") or ""}
    if msg.get("reasoning_content"):
        out["reasoning_content"] = msg["reasoning_content"]
    calls = []
    for i, c in enumerate(msg.get("tool_calls") or []):
        fn = c.get("function") or {}
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        calls.append(
            {
                "id": c.get("id") or f"call_{i}",
                "type": "function",
                "function": {"name": str(fn.get("name", "")), "arguments": args},
            }
        )
    if calls:
        out["tool_calls"] = calls
    return out


def failed_step(turn: int, step: int, kind: str, request: dict, error: str, raw: str | None = None) -> dict:
    """The step record of a model call that produced no message (docs/architecture.md)."""
    rec = {
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


class NativeAgent(AgentBackend):
    name = "native"

    def __init__(self, teacher, agent_cfg: dict):
        self.teacher = teacher
        self.cfg = agent_cfg
        self.sandbox = resolve_mode(agent_cfg.get("sandbox", "auto"))
        self.tools = TOOL_SCHEMAS

    @staticmethod
    def toolbox_path(box) -> str:
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
            bash_timeout=float(self.cfg.get("bash_timeout", 300)),
            output_cap=int(self.cfg.get("output_cap", 30000)),
            deadline=deadline,
        )

    def run_turn(self, run: TurnRun) -> TurnOutcome:
        ctx = self.tool_context(run, time.monotonic() + float(self.cfg.get("turn_timeout", 3600)))
        return self._run_turn(run, ctx)

    def _run_turn(self, run: TurnRun, ctx: ToolContext) -> TurnOutcome:
        max_steps = int(self.cfg.get("max_steps_per_turn", 40))
        deadline = ctx.deadline
        nudges_left = int(self.cfg.get("nudges", 2))
        out = TurnOutcome(ended="step_limit")
        messages = self._open_turn(run)
        kind = "agent"
        evals_before = len(run.coral.evals)
        used = int(run.context_used or 0)  # the session's context so far (usage of its last step)
        while True:
            if out.steps >= max_steps:
                out.ended = "step_limit"
                break
            if time.monotonic() >= deadline:
                out.ended = "timeout"
                break
            request = {"model": self.teacher.model, "messages": list(messages), "tools": self.tools}
            full = context_check(
                used, getattr(self.teacher, "max_tokens", 0), getattr(self.teacher, "context_tokens", None)
            )
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
            msg = assistant_message(comp.message)
            messages.append(msg)
            out.tokens = used = comp.usage.prompt_tokens + comp.usage.completion_tokens
            results, turn_done = self._run_calls(run, ctx, comp, msg, out, evals_before)
            run.recorder.write(self._step_record(run, out.steps, kind, request, msg, results, comp))
            kind = "agent"
            if turn_done:
                out.ended = "eval"
                break
            if time.monotonic() >= deadline:
                out.ended = "timeout"
                break
            if not msg.get("tool_calls"):
                if nudges_left <= 0:
                    out.ended = "no_eval"
                    break
                nudges_left -= 1
                messages.append({"role": "user", "content": nudge_prompt()})
                kind = "nudge"
        return out

    def _open_turn(self, run: TurnRun) -> list[dict]:
        """The session with the turn's prompt added (a fresh one starts with the system prompt)."""
        overrides = self.cfg.get("prompts") or {}
        messages = run.messages
        if not messages:  # a fresh session: the system prompt, carrying AGENTS.md as OpenCode does
            text = run.instructions.strip()
            messages.append({"role": "system", "content": render("system", overrides, agents_md=text)})
        messages.append({"role": "user", "content": run.prompt})
        return messages

    @staticmethod
    def _run_calls(
        run: TurnRun, ctx: ToolContext, comp, msg: dict, out: TurnOutcome, evals_before: int
    ) -> tuple[list[dict], bool]:
        """Run the step's tool calls in order, each result added to the session and counted in `out`; once the
        turn's `coral eval` ran (True returned with the results) or its time is up, the rest are not run."""
        messages, deadline = run.messages, ctx.deadline
        results = []
        turn_done = False
        for call in msg.get("tool_calls", []):
            name, call_id = call["function"]["name"], call["id"]
            if turn_done:
                res = ToolOutcome(NOT_RUN)
            elif time.monotonic() >= deadline:
                res = ToolOutcome(NOT_RUN_TIMEOUT)
            elif comp.truncated_calls:
                res = ToolOutcome(TRUNCATED, error=True)
                out.tool_calls += 1
                out.tool_errors += 1
            else:
                res = execute(name, call["function"]["arguments"], ctx)
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
        run: TurnRun, step: int, kind: str, request: dict, msg: dict, results: list[dict], comp
    ) -> dict:
        """The step record of a model call and the tool calls it made (docs/architecture.md)."""
        record = {
            "turn": run.turn,
            "step": step,
            "kind": kind,
            "request": request,
            "response": msg,
            "tool_results": results,
            "usage": comp.usage.to_dict(),
            "latency_s": round(comp.latency_s, 4),
            "finish_reason": comp.finish_reason,
        }
        if comp.notes:
            record["notes"] = list(comp.notes)
        return record
