"""Trees grown by a real model: llama-server (llama.cpp) with a 135M GGUF, started by `teacher.launch`.

Skipped only when scripts/install_llm_server.sh has not been run (no binary or model); .ci/run runs it, so in CI
these run. What they prove and why the model/template pair makes tool calls: docs/real_teacher.md.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
import yaml
from helpers.explore import explore, make_root
from helpers.workflow import REPO, SCHEMA, rules_run, snakemake

from sftree.agents.nativetools import TOOL_NAMES, TOOL_SCHEMAS
from sftree.records import steplog
from sftree.search import tree as treemod
from sftree.teacher.llm_server import LaunchSpec
from sftree.world.standin import nudge_prompt

MISSING = LaunchSpec.from_config({}).missing()
pytestmark = [
    pytest.mark.llm,
    pytest.mark.skipif(MISSING is not None, reason=f"no real model: {MISSING}"),
]
TURN_ENDS = {"eval", "step_limit", "timeout", "no_eval", "teacher_error"}
# `constrain: tool_call_required`: a call's arguments are exactly its tool's required ones (no invented `workdir`)
REQUIRED = {t["function"]["name"]: sorted(t["function"]["parameters"]["required"]) for t in TOOL_SCHEMAS}


def steps_of(tree_dir: Path, edge_id: str) -> list[dict]:
    f = tree_dir / "edges" / edge_id / "steps.jsonl"
    return steplog.read_steps(f) if f.exists() else []


def check_server_usage(tree_dir: Path, tree: treemod.Tree) -> list[dict]:
    """Token counts come from the server's usage: every answered step has one, and each turn's `tokens` is its
    last step's prompt + completion; the server's prefix cache reports cached tokens on a later step."""
    all_steps = []
    for e in tree.edges:
        steps = steps_of(tree_dir, e.id)
        all_steps += steps
        for t in e.turns:
            answered = [s for s in steps if s["turn"] == t.turn and s["response"] is not None]
            for s in answered:
                assert s["usage"]["prompt_tokens"] > 0 and s["usage"]["completion_tokens"] > 0, s["usage"]
                assert s["latency_s"] > 0
            if answered:
                u = answered[-1]["usage"]
                assert t.tokens == u["prompt_tokens"] + u["completion_tokens"], (e.id, t)
    assert any(s["usage"] and s["usage"]["cached_tokens"] > 0 for s in all_steps)
    return all_steps


def check_constrained_call(tc: dict) -> None:
    """A call under `constrain: tool_call_required`: an offered tool with JSON arguments, its required ones only."""
    assert tc["function"]["name"] in TOOL_NAMES, tc
    args = json.loads(tc["function"]["arguments"])
    assert sorted(args) == REQUIRED[tc["function"]["name"]], tc


def explore_one_real_tree(tmp_path: Path, teacher: dict, agent: dict, example: str = "real.yaml") -> Path:
    """One circle_packing tree from examples/<example> with `teacher`/`agent` overrides, in the sandbox
    (`agent.sandbox: auto`, bwrap here as in CI); returns its folder."""
    root = make_root(tmp_path, "circle_packing")
    cfg = yaml.safe_load((REPO / "examples" / example).read_text())
    cfg.pop("snapshots")
    cfg["results"] = str(tmp_path / "results")
    cfg["tasks"] = {"circle_packing": {**cfg["tasks"]["circle_packing"],
                                       "coral_task": str(REPO / "examples/circle_packing")}}  # fmt: skip
    cfg["teacher"].update(teacher)
    cfg["agent"].update(agent)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "tree"
    assert explore(root, out, path) == 0
    assert treemod.load(out / "tree.json").sandbox == "bwrap"
    return out


def check_reasons(tree: treemod.Tree) -> None:
    """Every turn says how it ended; every turn without a score and every failed edge says why."""
    for e in tree.edges:
        for t in e.turns:
            assert t.ended in TURN_ENDS, (e.id, t)
            if t.score is None:
                # an eval without a score names why: the grader crashed or timed out, or there was nothing to commit
                assert t.ended != "eval" or t.eval_status in (
                    "crashed",
                    "timeout",
                    "nothing_to_commit",
                ), (
                    e.id,
                    t,
                )
        if e.failed or e.pruned:
            assert e.fail_reason or e.prune_reason, e.id


@pytest.mark.slow
def test_real_model_tree_per_example_task_through_the_workflow(tmp_path, example_snapshots_dir):
    """examples/real.yaml through Snakemake, one root per task, `tool_choice: required` and `constrain:
    tool_call`: each explore job starts its own llama-server; the trees finish and validate, every reply not cut
    at max_tokens is a tool call that ran, every turn and failed edge says why it ended, the token counts are the
    server's, and export, merge and report run on what came out. (Graded evals by this 135M model are rare:
    docs/real_teacher.md, "Open".)"""
    config = yaml.safe_load((REPO / "examples/real.yaml").read_text())
    config["snapshots"] = str(example_snapshots_dir)
    for task in config["tasks"].values():
        task["coral_task"] = str(REPO / task["coral_task"])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))

    res = snakemake(tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    ran = rules_run(res)
    assert ran["explore"] == 2 and ran["export_sft"] == 2 and ran["merge_sft"] == 1, ran
    results = tmp_path / "results"
    for task in ("circle_packing", "tsp"):
        (tree_file,) = results.glob(f"{task}/trees/*/tree.json")
        tree_dir = tree_file.parent
        tree = treemod.load(tree_file)  # schema + links
        assert tree.status == "finished" and tree.edges and tree.sandbox == "bwrap"
        log = (tree_dir / "explore.log").read_text()
        assert "starting llama-server: " in log and "--jinja" in log and "--chat-template-file" in log
        assert (tree_dir / "llama-server.log").stat().st_size > 0
        check_reasons(tree)
        steps = check_server_usage(tree_dir, tree)
        for s in steps:  # constrained: each reply is one JSON call (or one cut at max_tokens), and it ran
            assert s["response"] is not None, s.get("error")
            if s["response"].get("tool_calls"):
                assert "text_tool_calls:json" in s["notes"] and len(s["tool_results"]) == len(
                    s["response"]["tool_calls"]
                )
                for tc in s["response"]["tool_calls"]:
                    check_constrained_call(tc)
            else:
                assert s["finish_reason"] == "length", s["response"]
        # graded turns (if the model got there) carry a real grader score and commit
        for e in tree.edges:
            for t in e.turns:
                if isinstance(t.score, float | int):
                    assert t.eval_status in ("baseline", "improved", "regressed") and t.commit
        records = [json.loads(x) for x in (results / task / "sft.jsonl").read_text().splitlines()]
        for r in records:
            jsonschema.validate(r, SCHEMA)
            asked = [
                tc["id"] for m in r["messages"] if m["role"] == "assistant" for tc in m.get("tool_calls", [])
            ]
            answered = Counter(m["tool_call_id"] for m in r["messages"] if m["role"] == "tool")
            assert sorted(asked) == sorted(answered) and set(answered.values()) <= {1}
    assert (results / "report.html").exists()


@pytest.mark.slow
def test_real_model_auto_tool_choice_text_replies_are_nudged(tmp_path):
    """`tool_choice: auto`: the model may answer in text; each such reply is recorded, then nudged (a user
    message with the nudge prompt, a step of kind `nudge`), and a turn out of nudges ends `no_eval`."""
    out = explore_one_real_tree(
        tmp_path,
        {"tool_choice": "auto", "constrain": "none", "max_tokens": 64},
        {"max_steps_per_turn": 3, "nudges": 1},
    )
    tree = treemod.load(out / "tree.json")
    check_reasons(tree)
    steps = [s for e in tree.edges for s in steps_of(out, e.id)]
    texts = [
        i for i, s in enumerate(steps) if s["response"] is not None and not s["response"].get("tool_calls")
    ]
    assert texts, "the model made a tool call on every step; no text-only reply to check"
    nudge = nudge_prompt()
    for i in texts:
        s = steps[i]
        assert s["finish_reason"] in ("stop", "length") and s["tool_results"] == []
        nxt = steps[i + 1] if i + 1 < len(steps) and steps[i + 1]["turn"] == s["turn"] else None
        if nxt is not None and nxt["edge"] == s["edge"] and nxt["kind"] == "nudge":
            assert nxt["request"]["messages"][-1] == {"role": "user", "content": nudge}
            assert nxt["request"]["messages"][-2]["content"] == (s["response"]["content"] or "")
        else:  # out of nudges (or of steps): the turn ended there, and says so
            turn = next(t for e in tree.edges for t in e.turns if t.turn == s["turn"])
            assert turn.ended in ("no_eval", "step_limit"), turn
    assert any(s["kind"] == "nudge" for s in steps)
    check_server_usage(out, tree)


@pytest.mark.slow
def test_real_model_constrained_replies_are_tool_calls_that_run(tmp_path):
    """`teacher.constrain: tool_call_required` (examples/real.yaml): the client sends a `response_format` JSON
    schema built from the tool schemas (required arguments only), llama-server constrains the reply to it from
    the first token, and every answered step is a tool call with exactly those arguments that the agent ran for
    real in the sandboxed workspace (a tool result recorded for each call)."""
    teacher = yaml.safe_load((REPO / "examples/real.yaml").read_text())["teacher"]
    assert teacher["constrain"] == "tool_call_required" and teacher["seed"] == 0
    out = explore_one_real_tree(tmp_path, {}, {"max_steps_per_turn": 3})
    tree = treemod.load(out / "tree.json")
    check_reasons(tree)
    steps = [s for e in tree.edges for s in steps_of(out, e.id)]
    answered = [s for s in steps if s["response"] is not None]
    assert answered
    calls = 0
    for s in answered:
        cut = s["finish_reason"] == "length" and not s["response"].get("tool_calls")
        if cut:  # the call ran past max_tokens: its JSON is cut, so it stays text (nudged like any text)
            continue
        assert "text_tool_calls:json" in s.get("notes", []), s
        tcs = s["response"]["tool_calls"]
        assert tcs
        for tc in tcs:  # arguments obey the constraint: valid JSON, the tool's required arguments only
            check_constrained_call(tc)
        # each call was executed by the agent: one result per call, with the tool's output (or its error)
        assert [r["tool_call_id"] for r in s["tool_results"]] == [tc["id"] for tc in tcs]
        # a result is recorded for every call; a command that printed nothing has an empty one
        assert all(isinstance(r["content"], str) for r in s["tool_results"])
        calls += len(tcs)
    assert calls > 0
    print(f"constrained: {len(answered)} answered steps, {calls} tool calls run, "
          f"{sum(not r['error'] for s in answered for r in s['tool_results'])} without a tool error")  # fmt: skip
    check_server_usage(out, tree)


QWEN_MISSING = LaunchSpec.from_config(
    yaml.safe_load((REPO / "examples/real_qwen.yaml").read_text())["teacher"]["launch"]
).missing()


@pytest.mark.slow
@pytest.mark.skipif(QWEN_MISSING is not None, reason=f"no Qwen model: {QWEN_MISSING}")
def test_real_qwen_model_with_its_own_template_calls_offered_tools_that_run(tmp_path):
    """examples/real_qwen.yaml: Qwen2.5-Coder-0.5B-Instruct with its own chat template (no template file on the
    command line; the tool list in its system prompt), streamed, under `constrain: tool_call_required`: every
    complete reply is a call of an offered tool with exactly its required arguments, and each one ran (got its
    result). Whether a call then succeeds as a tool is the model's skill, not the pipeline's: on Coral's CORAL.md
    prompt it mostly invents paths (seed 0: 12 of 12 calls tool errors; seed 1: one `read` ran), so no count of
    successful calls is claimed. Per-run figures: docs/real_teacher.md."""
    out = explore_one_real_tree(tmp_path, {}, {"max_steps_per_turn": 3}, example="real_qwen.yaml")
    log = (out / "explore.log").read_text()
    assert "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf" in log and "--chat-template-file" not in log
    tree = treemod.load(out / "tree.json")
    check_reasons(tree)
    steps = [s for e in tree.edges for s in steps_of(out, e.id)]
    answered = [s for s in steps if s["response"] is not None]
    calls = ok = 0
    for s in answered:
        if s["finish_reason"] == "length" and not s["response"].get("tool_calls"):
            continue
        assert "text_tool_calls:json" in s.get("notes", []), s
        tcs = s["response"]["tool_calls"]
        for tc in tcs:
            check_constrained_call(tc)
        assert [r["tool_call_id"] for r in s["tool_results"]] == [tc["id"] for tc in tcs]
        calls += len(tcs)
        ok += sum(not r["error"] for r in s["tool_results"])
    assert calls > 0, calls
    assert tree.teacher["stream"] and tree.teacher["requests"] == len(answered)
    print(f"qwen: {len(answered)} answered steps, {calls} tool calls, {ok} without a tool error, "
          f"tools {Counter(tc['function']['name'] for s in answered for tc in s['response'].get('tool_calls', []))}")  # fmt: skip
    check_server_usage(out, tree)
