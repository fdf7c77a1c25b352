"""Prompt rendering: start prompt, Coral's results prompt and its heartbeats, failed-turn prompt, overrides."""

from __future__ import annotations

from sftree.agents.prompts import agents_md, heartbeat, next_turn_prompt, start_prompt
from sftree.config import REPO_ROOT

TASK = {
    "name": "circle_packing",
    "direction": "maximize",
    "task_dir": str(REPO_ROOT / "examples" / "circle_packing"),
}


def attempts(statuses):
    return [
        {"commit_hash": f"{i:040d}", "status": s, "timestamp": f"2020-01-{i + 1:02d}"}
        for i, s in enumerate(statuses)
    ]


def test_start_prompt_has_task_knowledge_and_submission():
    p = start_prompt(TASK)
    assert "26 non-overlapping circles" in p  # task.md content
    assert ".opencode/notes/" in p and "coral eval -m" in p and "higher is better" in p


def test_heartbeats():
    assert heartbeat(7, attempts(["improved"])).count("\n- ") == 0 and "Reflect" in heartbeat(7, [])
    assert "Consolidate: this is eval #20" in heartbeat(20, [])
    assert "Consolidate" not in heartbeat(21, [])
    assert "Pivot: the last 5 evals" in heartbeat(3, attempts(["improved"] + ["regressed"] * 4 + ["crashed"]))
    assert "Pivot" not in heartbeat(3, attempts(["regressed"] * 4 + ["improved"]))


def test_results_prompt_from_the_hosts_records():
    commit = "ab" * 20
    kdir = [{"commit": commit, "title": "raise MARGIN", "score": 2.5, "status": "improved"}]
    ev = {"number": 10, "score": 2.5, "commit": commit, "status": "improved", "feedback": "fine"}
    last = {"eval": {**ev, "message": "raise MARGIN"}, "ended": "eval"}
    p = next_turn_prompt(last, kdir, TASK)
    assert p.startswith("## Eval #10 Results")
    assert f"- Commit: {commit}" in p and "- Status: improved" in p and "- What you did: raise MARGIN" in p
    assert "- Feedback: fine" in p and "Consolidate: this is eval #10" in p
    # a turn that ended without an eval (the last message is the model's text) gets the failed-turn prompt
    failed = next_turn_prompt({"eval": None, "ended": "no_eval"}, kdir, TASK)
    assert failed.startswith("## Last Turn Results") and "no eval was submitted" in failed
    nothing = {"eval": {"number": None, "status": "nothing_to_commit"}, "ended": "eval"}
    assert "(nothing to commit)" in next_turn_prompt(nothing, kdir, TASK)
    assert "no eval was submitted" in next_turn_prompt(None, kdir, TASK)  # no record: nothing is trusted


def test_overrides_and_agents_md(tmp_path):
    t = tmp_path / "turn.md"
    t.write_text("Eval ${eval_number} gave ${score}; {braces} stay.")
    ev = {"number": 3, "score": None, "commit": "abc", "status": "crashed", "feedback": "boom", "message": ""}
    p = next_turn_prompt({"eval": ev, "ended": "eval"}, [], TASK, {"turn": str(t)})
    assert p == "Eval 3 gave FAILED; {braces} stay."
    assert "circle_packing" in agents_md(TASK)
