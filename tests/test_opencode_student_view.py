"""What a trained record holds when the Teacher is real OpenCode: exactly the request OpenCode sent, built for the
Student's model id (agent.student_model, as Coral's agents.model names it), with OpenCode's tools for that id and
Coral's instruction file - and nothing of the host: no host path, no port, not the Teacher's real model name.

One small tree through `sftree explore`, `select-paths` and `export-sft` (the workflow's commands), teacher-sim
behind the recording proxy. Skipped when the opencode binary is missing (`bash scripts/install_opencode.sh`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.explore import explore_cmd
from helpers.runtime import config, make_root, opencode_binary

from sftree.records import steplog

OPENCODE, WHY = opencode_binary()
pytestmark = [
    pytest.mark.opencode,
    pytest.mark.skipif(OPENCODE is None, reason=f"opencode binary missing: {WHY}"),
]
TEACHER_NAME = "teacher-sim-7f3a"  # the Teacher's real model name: it must reach no record
# OpenCode 1.18.33's tool set, in its order, for a model id that is not a GPT one, under Coral's permissions
# less what sftree denies (task, webfetch, websearch, question: docs/opencode.md, "Tools")
TOOLS = ["bash", "edit", "glob", "grep", "read", "skill", "todowrite", "write"]
# ... and for a GPT id (Coral's default, openai/gpt-5): apply_patch instead of edit and write
GPT_TOOLS = ["apply_patch", "bash", "glob", "grep", "read", "skill", "todowrite"]


def grow_and_export(tmp_path: Path, student_model: str | None, seed: int) -> tuple[Path, list[dict]]:
    cfg = config(
        teacher={"sim": {"seed": seed}, "model": TEACHER_NAME},
        agent={"backend": "opencode", "student_model": student_model, "max_steps_per_turn": 12},
        search={"root_children": 1, "max_children": 1, "max_depth": 2, "max_valid_edges": 2,
                "target_good_leaves": 1, "parallel_width": 1},
    )  # fmt: skip
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    root = make_root(tmp_path)
    out = tmp_path / "trees" / root.name
    run = lambda argv: subprocess.run(argv, capture_output=True, text=True, timeout=600)  # noqa: E731
    proc = run(explore_cmd(root, out, tmp_path / "cfg.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    sftree = [sys.executable, "-m", "sftree"]
    proc = run([*sftree, "select-paths", "--tree", str(out / "tree.json"), "--out", str(out / "paths.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    sft = tmp_path / "sft.jsonl"
    proc = run(
        [
            *sftree,
            "export-sft",
            "--paths",
            str(out / "paths.json"),
            "--out",
            str(sft),
            "--granularity",
            "step",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in sft.read_text().splitlines()]
    assert records
    return out, records


def sent_requests(out: Path) -> dict[tuple, dict]:
    """(edge, turn, step) -> the request OpenCode sent, as the recording proxy kept it."""
    tree = json.loads((out / "tree.json").read_text())
    sent = {}
    for e in tree["edges"]:
        for s in steplog.read_steps(out / e["transcript"]):
            sent[(e["id"], s["turn"], s["step"])] = s
    return sent


def with_parsed_arguments(msg: dict) -> dict:
    if not msg.get("tool_calls"):
        return msg
    calls = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
             for c in msg["tool_calls"]]  # fmt: skip
    return {**msg, "tool_calls": calls}


def host_traces(text: str, tmp_path: Path) -> list[str]:
    """Pieces of `text` that name the host: a host path, a loopback address or port, the Teacher's real name."""
    found = [p for p in (str(tmp_path), str(Path(__file__).resolve().parents[1]), "/tmp/pytest") if p in text]
    found += re.findall(r"127\.0\.0\.1(?::\d+)?|localhost:\d+", text)
    return found + ([TEACHER_NAME] if TEACHER_NAME in text else [])


def test_a_trained_record_is_the_request_opencode_sent_for_the_students_model(tmp_path):
    student = "sglang/Qwen3-Coder-30B-A3B-Instruct"
    out, records = grow_and_export(tmp_path, student, seed=3)
    sent = sent_requests(out)
    tree = json.loads((out / "tree.json").read_text())
    assert tree["backend"] == "opencode" and tree["coral"]["student_model"] == student
    for rec in records:
        meta = rec["metadata"]
        assert meta["backend"] == "opencode", meta
        step = sent[(meta["edge"], meta["turn"], meta["step"])]
        request = step["request"]
        # the prompt: every message OpenCode sent, in order; the two changes export makes (docs/outputs.md): tool
        # results carry the tool's name, and call arguments are objects, as SGLang hands them to the chat template
        prompt = [
            {k: v for k, v in m.items() if not (m["role"] == "tool" and k == "name")} for m in rec["prompt"]
        ]
        assert prompt == [with_parsed_arguments(m) for m in request["messages"]], meta
        assert rec["tools"] == request["tools"]  # OpenCode's tool list as sent (descriptions, schemas, order)
        assert [t["function"]["name"] for t in rec["tools"]] == TOOLS
        system = request["messages"][0]["content"]
        # OpenCode's system prompt for the Student's model id, not the Teacher's
        name = student.split("/", 1)[1]
        assert f"You are powered by the model named {name}. The exact model ID is {student}" in system
        assert "Working directory: /workspace/results/circle_packing/agents/agent-1" in system
        # the instruction file Coral writes: CORAL.md as AGENTS.md in the worktree, as OpenCode loads it
        agents_md = "Instructions from: /workspace/results/circle_packing/agents/agent-1/AGENTS.md\n"
        assert agents_md in system and "# Task: " in system.split(agents_md, 1)[1]
        assert (
            step["request"]["model"] == name
        )  # what OpenCode asked for; the proxy sent it on for the Teacher
        assert not host_traces(json.dumps(rec), tmp_path), host_traces(json.dumps(rec), tmp_path)


def test_coral_s_default_student_model_gets_opencode_s_gpt_tool_set(tmp_path):
    """No agent.student_model and no agents.model in task.yaml: Coral's default for its opencode runtime
    (openai/gpt-5), for which OpenCode offers apply_patch instead of edit and write; teacher-sim patches."""
    out, records = grow_and_export(tmp_path, None, seed=1)
    for rec in records:
        assert [t["function"]["name"] for t in rec["tools"]] == GPT_TOOLS
        assert "The exact model ID is openai/gpt-5" in rec["prompt"][0]["content"]
        assert not host_traces(json.dumps(rec), tmp_path)
    patched = [c for r in records for c in r["completion"][0].get("tool_calls") or []]
    assert any(c["function"]["name"] == "apply_patch" for c in patched)
