"""The runtime's prompt calls (agents/prompts.py) over the Teacher's world: start prompt, AGENTS.md, the turn prompt
from the host's record of the last turn (with and without the host's counters), failed turns, the nudge."""

from __future__ import annotations

from sftree.agents.prompts import (
    failed_turn_prompt,
    next_turn_prompt,
    nudge_prompt,
    render,
    start_prompt,
    world_for,
    write_agents_md,
)
from sftree.config import REPO_ROOT
from sftree.world.counters import CoralCounters

TASK = {
    "name": "circle_packing",
    "coral_task": str(REPO_ROOT / "examples" / "circle_packing"),
    "coral": {"mode": "stand-in"},
}
COMMIT = "ab" * 20
EV = {
    "number": 10,
    "score": 2.5,
    "commit": COMMIT,
    "status": "improved",
    "feedback": "fine",
    "message": "raise MARGIN",
}


def test_start_prompt_and_agents_md(tmp_path):
    w = world_for(TASK)
    assert start_prompt(TASK) == w.start_prompt() and "coral eval" in start_prompt(TASK)
    (tmp_path / "AGENTS.md").symlink_to(tmp_path / "elsewhere")
    write_agents_md(tmp_path, TASK)
    text = (tmp_path / "AGENTS.md").read_text()
    assert not (tmp_path / "AGENTS.md").is_symlink() and not (tmp_path / "elsewhere").exists()
    assert text == w.instructions() and "26 non-overlapping circles" in text and "higher is better" in text


def test_turn_prompt_from_the_hosts_record(tmp_path):
    last = {"eval": EV, "ended": "eval"}
    p = next_turn_prompt(last, tmp_path, TASK)
    assert p.startswith("## Eval #10 Results\n\nScore: 2.5000000000\nCommit: ababababab")
    assert "What you did: raise MARGIN" in p and "Feedback: fine" in p
    assert "consolidate" in p.lower()  # global eval 10
    # with the host's counters: the manager's own count and the plateau heartbeat
    c = CoralCounters("agent-1", global_evals=9, agent_evals=3, real_best=3.0, since_improvement=4)
    p2 = next_turn_prompt(last, None, TASK, counters=c)
    assert p2.startswith("## Eval #4 Results") and "pivot" in p2.lower()


def test_failed_turns_and_nudge():
    w = world_for(TASK)
    for last in (
        {"eval": None, "ended": "no_eval"},
        {"eval": {"number": None, "status": "nothing_to_commit"}, "ended": "eval"},
        None,
    ):
        assert next_turn_prompt(last, None, TASK) == w.start_prompt(
            resume=True
        )  # no attempt yet: the resume prompt
    c = CoralCounters(
        "agent-1", global_evals=12, latest={"commit_hash": COMMIT, "title": "t", "score": 1.0, "feedback": ""}
    )
    p = failed_turn_prompt(w, c)
    assert p.startswith("Eval #12: score=1.0000000000 (commit ababababab") and "coral eval" in p
    assert nudge_prompt() and nudge_prompt() != p and nudge_prompt() == nudge_prompt(world=w, counters=c)


def test_system_template_and_override(tmp_path):
    assert "AGENTS.md" in render("system", agents_md="X") and "X" in render("system", agents_md="X")
    t = tmp_path / "s.md"
    t.write_text("sys ${agents_md} {braces}")
    assert render("system", {"system": str(t)}, agents_md="A") == "sys A {braces}"
