"""Hand-written tree directories (tree.json, steps.jsonl, root metadata) as input fixtures for export/report tests.

The layout follows docs/architecture.md: results/<task>/roots/<root>/metadata.json and
results/<task>/trees/<root>/{tree.json,edges/<edge>/steps.jsonl}. Sessions grow like a real agent's: each step's
request is the previous request + the previous response + its tool results, and a forked edge starts from its
parent's final messages. `paths_file` runs section 3 on such a tree; `run_report` runs `sftree report` on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sftree.dataset.select_paths import select_paths
from sftree.records.paths import write_paths
from sftree.records.tree import Tree

# Two tools whose parameter schemas differ, as real ones do (Arrow must not merge their keys).
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "shell command"},
                    "timeout": {"type": "integer"},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "read",
            "parameters": {
                "type": "object",
                "properties": {"filePath": {"type": "string"}, "offset": {"type": "number", "minimum": 0}},
                "required": ["filePath"],
                "additionalProperties": False,
            },
        },
    },
]
ROOT = "eval-000005-agent-1-aaaaaaaaaaaa"


def _assistant(edge, turn, step, last, fault, reasoning=True):
    cid = f"call_{edge}_{turn}_{step}"
    if last:
        name, args = "bash", json.dumps({"command": 'coral eval -m "try"'})
    else:
        name, args = "read", json.dumps({"filePath": ".opencode/notes/a.md"})
    if fault == "malformed":
        args = '{"command": "ls'
    msg = {
        "role": "assistant",
        "content": None if step % 2 else f"step {step}",
        "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}],
    }
    if reasoning and turn == 2 and step == 1:
        msg["reasoning_content"] = "think first"
    if fault == "length":  # the call came whole, but the server says the reply hit max_tokens
        msg["content"] = f"{edge} cut {turn}.{step}"
    return msg, [
        {"tool_call_id": cid, "name": name, "content": f"out {cid}", "error": False, "knowledge": not last}
    ]


# Step faults (`faults={(turn, step): kind}`), as the native agent records them: `malformed` (arguments that
# are not JSON), `length` (finish_reason length), `text` (a Hermes text call normalised into a call: a note).
FINISH = {"length": "length"}
NOTES = {"text": ["text_tool_calls:hermes"]}


def write_edge(
    tree_dir: Path,
    edge: str,
    start: list[dict],
    steps_per_turn: int = 2,
    faults=None,
    title=True,
    reasoning=True,
):
    """Two turns of `steps_per_turn` steps; returns the session's messages after the edge."""
    faults = faults or {}
    messages = list(start)
    lines = []
    for turn in (1, 2):
        messages.append({"role": "user", "content": f"{edge} turn {turn} prompt"})
        for step in range(1, steps_per_turn + 1):
            fault = faults.get((turn, step))
            resp, results = _assistant(edge, turn, step, step == steps_per_turn, fault, reasoning)
            lines.append(
                {
                    "edge": edge,
                    "turn": turn,
                    "step": step,
                    "kind": "agent",
                    "request": {"model": "m", "messages": list(messages), "tools": TOOLS},
                    "response": resp,
                    "tool_results": results,
                    "usage": {"prompt_tokens": 100 * step, "completion_tokens": 10, "cached_tokens": 50},
                    "finish_reason": FINISH.get(fault, "tool_calls"),
                }
                | ({"notes": NOTES[fault]} if fault in NOTES else {})
            )
            messages.append(resp)
            messages.extend(
                {"role": "tool", "tool_call_id": r["tool_call_id"], "content": r["content"]} for r in results
            )
    if title:
        lines.insert(
            0,
            {
                "edge": edge,
                "turn": 1,
                "step": 0,
                "kind": "title",
                "request": {"messages": [{"role": "user", "content": "title?"}]},
                "response": {"role": "assistant", "content": "A title"},
                "tool_results": [],
            },
        )
    d = tree_dir / "edges" / edge
    d.mkdir(parents=True, exist_ok=True)
    (d / "steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return messages


DEFAULT_FAULTS = {"e2": {(2, 1): "malformed"}}


def make_results(
    base: Path,
    task: str = "circle_packing",
    direction: str = "maximize",
    stage: str = "middle",
    faults: dict | None = None,
    tree_extra: dict | None = None,
    reasoning: bool = True,
):
    """n0 -(e1)-> n1 -(e2)-> n2 ; n1 -(e3)-> n3 ; n0 -(e4)-> n4 (no score: pruned-like, excluded). Returns tree dir.

    `faults` = {edge: {(turn, step): kind}} (write_edge), by default e2's turn 2 step 1 has malformed arguments;
    `tree_extra` is merged into tree.json (e.g. `backend`, `coral`); `reasoning`: turn 2 step 1 of each edge
    carries `reasoning_content`."""
    faults = DEFAULT_FAULTS if faults is None else faults
    root_dir = base / task / "roots" / ROOT
    root_dir.mkdir(parents=True)
    (root_dir / "metadata.json").write_text(json.dumps({"stage": stage, "score": 1.0, "task": task}))
    tree_dir = base / task / "trees" / ROOT
    system = [{"role": "system", "content": "You are a Coral agent."}]
    s1 = write_edge(tree_dir, "e1", system, faults=faults.get("e1"), reasoning=reasoning)
    write_edge(tree_dir, "e2", s1, faults=faults.get("e2"), reasoning=reasoning)
    write_edge(tree_dir, "e3", s1, faults=faults.get("e3"), reasoning=reasoning)
    write_edge(tree_dir, "e4", system, faults=faults.get("e4"), reasoning=reasoning)

    def node(i, parent, score, depth, leaf):
        return {
            "id": f"n{i}",
            "parent": parent,
            "edge": f"e{i}" if i else None,
            "depth": depth,
            "score": score,
            "max_token_total": 1000 * i,
            "leaf_reason": leaf,
            "status": "leaf" if leaf else "expanded",
        }

    def edge(i, parent, score, clean, know, soft):
        return {
            "id": f"e{i}",
            "parent": parent,
            "child": f"n{i}",
            "depth": 1,
            "attempt": 1,
            "pruned": False,
            "score": score,
            "cleanliness": clean,
            "knowledge_score": know,
            "soft": soft,
            "tokens": 1000 * i,
            "transcript": f"edges/e{i}/steps.jsonl",
            "select": {
                "node": parent,
                "score_rank": 0.5,
                "best_rank": 0.5,
                "process": 0.0,
                "Q": 0.35,
                "T": 0.5,
                "select": 0.6,
            },
        }

    tree = {
        "version": 1,
        "task": task,
        "root": ROOT,
        "direction": direction,
        "status": "finished",
        "stop_reason": "frontier_empty",
        "nodes": [
            node(0, None, 1.0, 0, None),
            node(1, "n0", 2.0, 1, None),
            node(2, "n1", 3.0, 2, "depth_limit"),
            node(3, "n1", 1.5, 2, "depth_limit"),
            node(4, "n0", None, 1, "tree_stopped"),
        ],
        "edges": [
            edge(1, "n0", 2.0, 1.0, 1.0, 0.9),
            edge(2, "n1", 3.0, 0.8, 1.0, 0.8),
            edge(3, "n1", 1.5, 1.0, 0.6, 0.7),
            edge(4, "n0", None, None, None, None),
        ],
    }
    tree.update(tree_extra or {})
    (tree_dir / "tree.json").write_text(json.dumps(tree))
    return tree_dir


def llamafactory_alternates(messages):
    """LLaMA-Factory's `openai` converter rule: after the system prompt, consecutive tool messages form one
    observation, assistant messages with tool_calls are function turns, trailing tool messages are dropped;
    turns must then alternate user|observation, assistant|function and end on the assistant side."""
    msgs = messages[1:] if messages and messages[0]["role"] == "system" else messages
    aligned, pending = [], False
    for m in msgs:
        if m["role"] == "tool":
            pending = True
            continue
        if pending:
            aligned.append("observation")
            pending = False
        calls = m["role"] == "function_call" or (m["role"] == "assistant" and m.get("tool_calls"))
        aligned.append("function" if calls else m["role"])
    odd, even = ("user", "observation"), ("assistant", "function")
    return len(aligned) % 2 == 0 and all(r in (odd if i % 2 == 0 else even) for i, r in enumerate(aligned))


def paths_file(tree_dir: Path, top_k: int = 6) -> Path:
    doc = select_paths(Tree.from_doc(json.loads((tree_dir / "tree.json").read_text())), top_k=top_k)
    write_paths(tree_dir / "paths.json", doc)
    return tree_dir / "paths.json"


def run_report(base, out) -> str:
    """`sftree report` as a user runs it; the page it wrote."""
    res = subprocess.run(
        [sys.executable, "-m", "sftree", "report", "--results", str(base), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    return out.read_text()


# A record's whole metadata (records/sft.py `RecordMeta`), for records made by hand in tests.
RECORD_META = {
    "task": "circle_packing", "root": "eval-0001", "stage": "middle", "direction": "maximize", "root_score": 0.5,
    "sandbox": "bwrap", "backend": "opencode", "coral": "stand-in", "path_rank": 1, "leaf": "n3",
    "leaf_reason": "depth_limit", "path_nodes": ["n1", "n3"], "path_edges": ["e1", "e3"], "avg_cleanliness": 1.0,
    "avg_knowledge": 0.5, "avg_score": 0.7, "avg_score_rank": 0.5, "max_score": 0.9, "max_score_rank": 1,
    "path_score": 0.8, "leaf_score": 0.9, "gain": 0.4, "granularity": "step", "path_ranks": [1], "edge": "e1",
    "transcript": "circle_packing/trees/eval-0001/edges/e1/steps.jsonl", "turn": 1, "step": 1, "kind": "agent",
    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}, "finish_reason": "stop",
    "malformed_arguments": 0, "history_excluded": 0, "id": "circle_packing/eval-0001/e1/t1s1",
}  # fmt: skip
