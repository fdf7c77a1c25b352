"""The prompts that open a turn (search/edge.py:first_prompt over the tree's World): a fresh session's start
prompt, the turn prompt from the host's record of the last turn, the restart prompt after a turn without a graded
eval; sftree's own nudge and system template (agents/prompts.py)."""

from __future__ import annotations

from types import SimpleNamespace

from sftree.agents.prompts import render
from sftree.config import REPO_ROOT
from sftree.search.edge import first_prompt
from sftree.settings import PromptSettings
from sftree.world.counters import CoralCounters
from sftree.world.standin import nudge_prompt
from sftree.world.task import load_coral_task
from sftree.world.world import World

COMMIT = "ab" * 20
RECORD = {
    "commit_hash": COMMIT,
    "agent_id": "agent-1",
    "title": "raise MARGIN",
    "score": 2.5,
    "status": "improved",
    "parent_hash": None,
    "timestamp": "",
    "feedback": "fine",
}


def world():
    task = load_coral_task(REPO_ROOT / "examples" / "circle_packing", "circle_packing")
    return World(task, agent_id="agent-1", agents=1)


def test_first_prompt_from_the_hosts_record():
    w = world()
    ctx = SimpleNamespace(world=w)
    try:
        fresh = first_prompt(ctx, [], None, CoralCounters("agent-1"))
        assert fresh == w.start_prompt() and "coral eval" in fresh
        before = CoralCounters("agent-1", global_evals=9, agent_evals=9)
        last = {
            "eval": {"number": 10, "record": RECORD, "counters_before": before.to_dict()},
            "ended": "eval",
        }
        p = first_prompt(ctx, [{"role": "user", "content": "x"}], last, before)
        assert p.startswith("## Eval #10 Results\n\nScore: 2.5000000000\nCommit: ababababab")
        assert "What you did: raise MARGIN" in p and "Feedback: fine" in p
        assert "consolidate" in p.lower()  # global eval 10
        # the host's counters before that eval set the manager's own count and the plateau heartbeat
        c = CoralCounters("agent-1", global_evals=9, agent_evals=3, real_best=3.0, since_improvement=4)
        last["eval"]["counters_before"] = c.to_dict()
        p2 = first_prompt(ctx, [{"role": "user", "content": "x"}], last, c)
        assert p2.startswith("## Eval #4 Results") and "pivot" in p2.lower()
    finally:
        w.close()


def test_failed_turns_and_nudge():
    w = world()
    ctx = SimpleNamespace(world=w)
    session = [{"role": "user", "content": "x"}]
    try:
        for last in (
            {"eval": None, "ended": "no_eval"},
            {"eval": {"number": None, "status": "nothing_to_commit"}, "ended": "eval"},
            None,
        ):  # no attempt yet: the resume prompt
            assert first_prompt(ctx, session, last, CoralCounters("agent-1")) == w.start_prompt(resume=True)
        c = CoralCounters(
            "agent-1",
            global_evals=12,
            latest={"commit_hash": COMMIT, "title": "t", "score": 1.0, "feedback": ""},
        )
        p = first_prompt(ctx, session, None, c)
        assert p.startswith("Eval #12: score=1.0000000000 (commit ababababab") and "coral eval" in p
        assert nudge_prompt() and nudge_prompt() != p and nudge_prompt() != w.start_prompt(resume=True)
    finally:
        w.close()


def test_system_template_and_override(tmp_path):
    assert "AGENTS.md" in render("system", agents_md="X") and "X" in render("system", agents_md="X")
    t = tmp_path / "s.md"
    t.write_text("sys ${agents_md} {braces}")
    assert render("system", PromptSettings(system=str(t)), agents_md="A") == "sys A {braces}"
