"""Selected paths as ATIF v1.8 trajectories (`export.atif`; docs/outputs.md, "ATIF trajectories").

One `Trajectory` per selected path, built from the same step records as the SFT forms: the path's session in turn
order, each message once:

- the messages a request adds to the session (the first request's system prompt, the host's turn prompts) are
  `system` / `user` steps; an assistant or tool message a request holds that no earlier step of the path made
  (a rewritten context) is kept as a copied `agent` step (`is_copied_context`, `llm_call_count: 0`) or a
  `system` step with its observation, so nothing of the context is lost and no consumer trains on it;
- each model call is an `agent` step: its message, `reasoning_content`, `tool_calls` (arguments as the JSON object
  the model sent; arguments that are not one as `{}` with the text in the call's `extra.raw_arguments`), the tool
  results as its `observation`, and `metrics` (prompt, completion and cached tokens; where the step record keeps
  the Teacher's tokens, `completion_token_ids` and `logprobs`, the top-K in `metrics.extra`, the token text
  there too when the server gave no ids). `extra` holds the edge, turn, step, kind, finish reason and, for an
  ill-formed reply, why the SFT forms never train it (`exclusion`);
- `agent.tool_definitions` are the tools of the path's requests; `extra.sftree` the tree (task, root, stage, the
  tree's folder under results/), the path (rank, nodes, edges, leaf, the parent path: the same path less its last
  edge) and its scores and gain (the SFT records' path metadata), so the tree can be rebuilt from the
  trajectories: ATIF has no notion of a tree.

A failed model call (no reply) is left out (the SFT forms skip it too); title, summary and compaction calls are
not the agent's session. The builder is pure: `path_trajectory` maps a path's steps to one JSON document.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sftree import __version__
from sftree.dataset.messages import Step, exclusion, message_key, normalize_message, parse_arguments
from sftree.records.atif import SCHEMA_VERSION, read_trajectories, trajectory_writer
from sftree.records.sft import Message
from sftree.records.steplog import TokenLogprobs
from sftree.records.tree import SchemaDoc

log = logging.getLogger("sftree.dataset.atif")


def _metrics(step: Step) -> SchemaDoc:
    u = step.get("usage") or {}
    out: SchemaDoc = {
        "prompt_tokens": int(u.get("prompt_tokens") or 0),
        "completion_tokens": int(u.get("completion_tokens") or 0),
        "cached_tokens": int(u.get("cached_tokens") or 0),
    }
    extra: dict[str, Any] = {}
    if u.get("estimated"):
        extra["estimated"] = True
    lp: TokenLogprobs | None = step.get("logprobs")
    if isinstance(lp, dict):
        out["logprobs"] = list(lp["logprobs"])
        if "ids" in lp:
            out["completion_token_ids"] = list(lp["ids"])
            extra["top_ids"] = lp.get("top_ids")
        else:  # a server that gave no ids: the text, never ids made up
            extra["tokens"], extra["top_tokens"] = lp.get("tokens"), lp.get("top_tokens")
        extra["top_k"], extra["top_logprobs"] = lp["k"], lp["top_logprobs"]
    elif step.get("logprobs_dropped"):
        extra["logprobs_dropped"] = step["logprobs_dropped"]
    if extra:
        out["extra"] = extra
    return out


def _tool_calls(msg: Message) -> list[SchemaDoc]:
    calls: list[SchemaDoc] = []
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function") or {}
        args, bad = parse_arguments(fn.get("arguments"))
        call: SchemaDoc = {
            "tool_call_id": str(tc.get("id")),
            "function_name": str(fn.get("name")),
            "arguments": {} if bad else args,
        }
        if bad:
            call["extra"] = {"raw_arguments": args["_raw"]}
        calls.append(call)
    return calls


def _agent_step(step: Step, edge_id: str) -> SchemaDoc:
    msg, _ = normalize_message({**step["response"], "role": "assistant"})
    out: SchemaDoc = {"source": "agent", "message": msg["content"]}
    if msg.get("reasoning_content"):
        out["reasoning_content"] = msg["reasoning_content"]
    calls = _tool_calls(step["response"])
    if calls:
        out["tool_calls"] = calls
    results = [
        {"source_call_id": str(r.get("tool_call_id")), "content": str(r.get("content") or "")}
        | ({"extra": {"error": True}} if r.get("error") else {})
        for r in step.get("tool_results") or []
    ]
    if results:
        out["observation"] = {"results": results}
    out["metrics"] = _metrics(step)
    extra = {"edge": edge_id, "turn": step.get("turn"), "step": step.get("step"), "kind": step.get("kind", "agent"),
             "finish_reason": step.get("finish_reason")}  # fmt: skip
    why = exclusion(step)
    if why:
        extra["exclusion"] = why
    out["extra"] = extra
    return out


def _context_step(m: Message) -> SchemaDoc:
    """A message of the session no model call of the path made (module docstring)."""
    msg, _ = normalize_message(m)
    role = msg["role"]
    if role in ("system", "user"):
        return {"source": role, "message": msg["content"]}
    if role == "tool":
        result = {"source_call_id": str(msg.get("tool_call_id")), "content": msg["content"]}
        return {"source": "system", "message": "", "observation": {"results": [result]},
                "extra": {"tool_result_in_context": True}}  # fmt: skip
    out: SchemaDoc = {"source": "agent", "message": msg["content"], "is_copied_context": True,
                      "llm_call_count": 0}  # fmt: skip
    calls = _tool_calls(m)
    if calls:
        out["tool_calls"] = calls
    return out


def _key(m: object) -> str:
    """A session message as later requests repeat it: an assistant message by `message_key` (OpenCode
    re-serialises it), a tool result by its call id and text, any other by its role and text."""
    if not isinstance(m, dict):
        return json.dumps(m, sort_keys=True, ensure_ascii=False, default=str)
    if m.get("role") == "assistant":
        return "assistant\x00" + message_key(m)
    try:
        norm, _ = normalize_message(m)
    except (ValueError, AttributeError):
        return json.dumps(m, sort_keys=True, ensure_ascii=False, default=str)
    return json.dumps([norm["role"], norm.get("tool_call_id"), norm["content"]], ensure_ascii=False)


def path_steps(steps: Iterable[tuple[str, Step]]) -> tuple[list[SchemaDoc], list[Any]]:
    """The ATIF steps of one path's model calls ((edge id, step record) in order) and the tools they offered."""
    out: list[SchemaDoc] = []
    session: list[str] = []  # the session so far, as the keys of its messages
    tools: list[Any] = []
    for edge_id, step in steps:
        req = step.get("request") or {}
        sent = req.get("messages")
        messages: list[Any] = sent if isinstance(sent, list) else []  # as sent: `_key` takes any JSON
        keys = [_key(m) for m in messages]
        shared = 0
        while shared < min(len(keys), len(session)) and keys[shared] == session[shared]:
            shared += 1
        if shared < len(session):  # the context was rewritten (a compaction): what follows is as sent
            log.info("ATIF: %s turn %s step %s does not extend the path's session", edge_id, step.get("turn"),
                     step.get("step"))  # fmt: skip
        out.extend(_context_step(m) for m in messages[shared:])
        tools = list(req.get("tools") or tools)
        out.append(_agent_step(step, edge_id))
        results = [{"role": "tool", "tool_call_id": r.get("tool_call_id"), "content": r.get("content")}
                   for r in step.get("tool_results") or []]  # fmt: skip
        session = keys + [_key(step["response"])] + [_key(r) for r in results]
    return out, tools


def path_trajectory(
    steps: list[tuple[str, Step]], meta: SchemaDoc, *, agent: str, model: str | None
) -> SchemaDoc:
    """One selected path as an ATIF Trajectory document (module docstring); `meta` is the path's metadata."""
    body, tools = path_steps(steps)
    for i, s in enumerate(body, 1):
        s["step_id"] = i
    agent_steps = [s for s in body if "metrics" in s]
    totals = {k: sum(s["metrics"][k] for s in agent_steps) for k in ("prompt_tokens", "completion_tokens",
                                                                     "cached_tokens")}  # fmt: skip
    doc: SchemaDoc = {
        "schema_version": SCHEMA_VERSION,
        "session_id": f"{meta['task']}/{meta['root']}",
        "trajectory_id": f"{meta['task']}/{meta['root']}/{meta['leaf']}",
        "agent": {"name": agent, "version": __version__, "tool_definitions": tools}
        | ({"model_name": model} if model else {}),
        "steps": [{"step_id": s.pop("step_id"), **s} for s in body],
        "final_metrics": {f"total_{k}": v for k, v in totals.items()} | {"total_steps": len(body)},
        "extra": {"sftree": meta},
    }
    return doc


def with_logprobs(doc: SchemaDoc) -> tuple[int, int]:
    """(agent steps with the Teacher's logprobs, agent steps without) of one trajectory."""
    calls = [s for s in doc["steps"] if s["source"] == "agent" and not s.get("is_copied_context")]
    kept = sum("logprobs" in s.get("metrics", {}) for s in calls)
    return kept, len(calls) - kept


def trajectories(
    paths: Iterator[tuple[list[tuple[str, Step]], SchemaDoc, str, str | None]],
) -> Iterator[SchemaDoc]:
    """The trajectories of (steps, path metadata, agent name, model) items."""
    for steps, meta, agent, model in paths:
        if steps:
            yield path_trajectory(steps, meta, agent=agent, model=model)


def tree_folder(tree_dir: Path) -> str:
    """The tree's folder relative to the results folder (<task>/trees/<root>): a trajectory names no host path."""
    return "/".join(tree_dir.parts[-3:])


def merge_trajectories(inputs: Iterable[str | Path], out: str | Path) -> int:
    """The tasks' ATIF files as one (`merge-sft --atif-inputs`), each line checked; written whole or not at all."""
    with trajectory_writer(out) as w:
        for f in inputs:
            for doc in read_trajectories(f):
                w.write(doc)
    log.info("ATIF: %d trajectories -> %s", w.count, out)
    return w.count
