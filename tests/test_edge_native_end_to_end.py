"""Logical edges end to end: the native agent against teacher-sim over HTTP, on the example tasks."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers.runtime import config, example_task, grade_dir, make_root, read_steps

from sftree.records.scores import regressed_rate
from sftree.search.edge import EdgeContext, run_edge
from sftree.settings import settings_of

FAULTS = [
    {"match": {"edge": "e3", "turn": "1"}, "fault": "no_eval"},
    {"match": {"edge": "e4"}, "fault": "tool_errors", "count": 2},
    {"match": {"edge": "e4", "turn": "2"}, "fault": "unknown_tool", "count": 1},
    {"match": {"edge": "e5", "turn": "2"}, "fault": "broken_code"},
    {"match": {"edge": "e6", "turn": "2"}, "fault": "http_500"},
    {"match": {"edge": "e7"}, "fault": "malformed_args", "count": 1},
]


@pytest.fixture(scope="module")
def cp(tmp_path_factory):
    """One circle_packing tree with a scripted teacher-sim, asked for the Teacher's tokens; edges e1..e7."""
    tmp = tmp_path_factory.mktemp("edge")
    cfg = config(teacher={"sim": {"seed": 3, "script": FAULTS}, "logprobs": 5})
    ctx = EdgeContext.create(tmp / "tree", make_root(tmp), settings_of(cfg), example_task(cfg))
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def e1(cp):
    return run_edge(cp, cp.root_state, "e1", 1.0, depth=1, attempt=1, eval_count=5)


def test_every_answered_step_record_keeps_the_teachers_tokens(cp, e1):
    """`teacher.logprobs: 5` through the native agent: each answered model call's step record (written and read
    back through the message store) keeps the sampled ids and the top-5, aligned with the reply's usage."""
    steps = [s for s in read_steps(cp.tree_dir, "e1") if s.get("response") is not None]
    assert steps and all("logprobs_dropped" not in s for s in steps)
    for s in steps:
        lp = s["logprobs"]
        assert lp["k"] == 5 and len(lp["ids"]) == len(lp["top_ids"]) == s["usage"]["completion_tokens"]
        assert all(len(top) == 5 for top in lp["top_ids"])


def grade(ctx, commit, tmp_path):
    """Grade a commit with the task's grader directly (independently of coral)."""
    out = tmp_path / commit
    out.mkdir()
    subprocess.run(
        f"git --git-dir {ctx.store.code_git} archive {commit} | tar -x -C {out}", shell=True, check=True
    )
    return grade_dir(ctx.task_cfg, out)


def test_edge_two_commits_real_scores_and_attempts(cp, e1, tmp_path):
    assert e1.error is None and e1.valid and [t.ended for t in e1.turns] == ["eval", "eval"]
    c1, c2 = (t.commit for t in e1.turns)
    assert len({cp.root_state.code_commit, c1, c2}) == 3 and e1.child_state.code_commit == c2
    assert [t.eval_number for t in e1.turns] == [6, 7] and e1.evals == 2
    for t in e1.turns:
        assert t.score == pytest.approx(grade(cp, t.commit, tmp_path))
    assert e1.score == max(t.score for t in e1.turns)
    kdir = cp.tree_dir / "k"
    subprocess.run(
        f"mkdir {kdir} && git --git-dir {cp.store.knowledge_git} archive "
        f"{e1.child_state.knowledge_commit} | tar -x -C {kdir}",
        shell=True,
        check=True,
    )
    for t in e1.turns:
        rec = json.loads((kdir / "attempts" / f"{t.commit}.json").read_text())
        assert rec["score"] == t.score and rec["status"] == t.eval_status
    assert "solution.py" in (cp.tree_dir / e1.code_diff).read_text()
    assert "attempts/" in (cp.tree_dir / e1.knowledge_diff).read_text()
    assert not (cp.tree_dir / "work" / "e1").exists()  # worktree removed


def test_edge_metrics_match_the_transcript(cp, e1):
    steps = read_steps(cp.tree_dir, "e1")
    assert len(steps) == e1.steps == sum(t.steps for t in e1.turns)
    results = [r for s in steps for r in s["tool_results"]]
    assert e1.tool_calls == len(results) and e1.tool_errors == sum(r["error"] for r in results) == 0
    for t in e1.turns:
        flags = [r["knowledge"] for s in steps if s["turn"] == t.turn for r in s["tool_results"]]
        assert t.knowledge == any(flags)
    assert e1.knowledge == all(t.knowledge for t in e1.turns)
    assert e1.tokens == steps[-1]["usage"]["prompt_tokens"] + steps[-1]["usage"]["completion_tokens"]
    first_sent = steps[0]["request"]["messages"]
    w = cp.world
    assert first_sent[0]["role"] == "system"
    assert "Instructions from: AGENTS.md\n" + w.instructions().strip() in first_sent[0]["content"]
    assert first_sent[1]["content"] == w.start_prompt()
    turn2_first = next(s for s in steps if s["turn"] == 2)
    assert turn2_first["request"]["messages"][-1]["content"].startswith(
        "## Eval #1 Results"
    )  # the agent's count (none at the root)


def test_fork_resends_parent_session_byte_for_byte(cp, e1):
    e2 = run_edge(cp, e1.child_state, "e2", e1.score, depth=2, attempt=1, eval_count=7)
    session = (cp.tree_dir / e1.child_state.session).read_text()
    parent = json.loads(session)
    first = read_steps(cp.tree_dir, "e2")[0]
    sent = first["request"]["messages"]
    assert json.dumps(sent[: len(parent)]) == json.dumps(parent)
    assert sent[len(parent)]["content"].startswith(
        "## Eval #2 Results"
    )  # the agent's second eval: the parent's last
    assert first["usage"]["cached_tokens"] > 0.9 * first["usage"]["prompt_tokens"]
    assert [t.eval_number for t in e2.turns] == [8, 9]


def test_turn_without_eval_fails_after_nudges(cp):
    r = run_edge(cp, cp.root_state, "e3", 1.0, depth=1, attempt=1, eval_count=5)
    t1, t2 = r.turns
    assert t1.ended == "no_eval" and t1.steps == 3 and t1.score is None and t1.tool_calls == 0
    kinds = [s["kind"] for s in read_steps(cp.tree_dir, "e3") if s["turn"] == 1]
    assert kinds == ["agent", "nudge", "nudge"]
    assert t2.ended == "eval" and t2.score is not None and not r.valid and r.score == t2.score
    assert r.regressed_rate == 0.5  # turn 1 no score (regressed); turn 2 starts from None (not regressed)
    assert not r.knowledge and t2.knowledge


def test_tool_errors_counted_exactly(cp):
    r = run_edge(cp, cp.root_state, "e4", 1.0, depth=1, attempt=1, eval_count=5)
    results = [x for s in read_steps(cp.tree_dir, "e4") for x in s["tool_results"]]
    errors = [x for x in results if x["error"]]
    assert r.tool_errors == 3 == len(errors) and r.valid  # 2 missing-file reads + 1 unknown tool
    assert sum("file not found" in x["content"] for x in errors) == 2
    assert sum("unknown tool" in x["content"] for x in errors) == 1
    assert r.tool_error_rate == pytest.approx(3 / len(results))


def test_broken_code_crashes_the_eval(cp):
    r = run_edge(cp, cp.root_state, "e5", 1.0, depth=1, attempt=1, eval_count=5)
    t2 = r.turns[1]
    assert t2.ended == "eval" and t2.score is None and t2.eval_status == "crashed" and not r.valid
    assert "SyntaxError" in t2.feedback or "invalid syntax" in t2.feedback or "error" in t2.feedback.lower()
    assert r.child_state.code_commit == t2.commit  # the crashed commit is the child's state


def test_teacher_down_mid_edge_is_recorded_not_raised(cp):
    r = run_edge(cp, cp.root_state, "e6", 1.0, depth=1, attempt=1, eval_count=5)
    assert r.turns[0].ended == "eval" and r.turns[1].ended == "teacher_error"
    assert "HTTP 500" in r.error and not r.valid and r.child_state is not None
    steps = read_steps(cp.tree_dir, "e6")
    assert steps[-1]["response"] is None and "HTTP 500" in steps[-1]["error"]


def test_malformed_arguments_are_tool_errors(cp):
    r = run_edge(cp, cp.root_state, "e7", 1.0, depth=1, attempt=1, eval_count=5)
    errors = [x for s in read_steps(cp.tree_dir, "e7") for x in s["tool_results"] if x["error"]]
    assert r.tool_errors == 1 and "not valid JSON" in errors[0]["content"] and r.valid


def test_tsp_minimize_and_determinism(tmp_path):
    cfg = config(teacher={"sim": {"seed": 1}}, agent={"max_steps_per_turn": 12})
    runs = []
    for name in ("a", "b"):
        ctx = EdgeContext.create(
            tmp_path / name, make_root(tmp_path / name, "tsp"), settings_of(cfg), example_task(cfg, "tsp")
        )
        try:
            runs.append(run_edge(ctx, ctx.root_state, "e1", 100.0, depth=1, attempt=1, eval_count=0))
        finally:
            ctx.close()
    a, b = runs
    assert a.valid and [t.score for t in a.turns] == [t.score for t in b.turns]
    assert a.child_state.code_commit == b.child_state.code_commit
    assert a.score == min(t.score for t in a.turns)  # minimize: the best turn is the lowest
    s1, s2 = (t.score for t in a.turns)
    assert a.regressed_rate == regressed_rate(100.0, [s1, s2], "minimize")


def test_step_limit_fails_the_turn(tmp_path):
    cfg = config(teacher={"sim": {"seed": 0}}, agent={"max_steps_per_turn": 2})
    ctx = EdgeContext.create(tmp_path / "t", make_root(tmp_path), settings_of(cfg), example_task(cfg))
    try:
        r = run_edge(ctx, ctx.root_state, "e1", None, depth=1, attempt=1, eval_count=0)
    finally:
        ctx.close()
    assert [t.ended for t in r.turns] == ["step_limit", "step_limit"] and [t.steps for t in r.turns] == [2, 2]
    assert r.score is None and r.regressed_rate == 1.0


def test_parallel_forks_of_one_node_are_isolated(cp, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(
            lambda e: run_edge(cp, cp.root_state, e, 1.0, depth=1, attempt=1, eval_count=5), ["e8", "e9"]
        )
    assert a.valid and b.valid and a.child_state.code_commit != b.child_state.code_commit
    for r, other in ((a, b), (b, a)):
        log = subprocess.run(
            ["git", "--git-dir", str(cp.store.code_git), "log", "--format=%H", r.child_state.code_commit],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert other.turns[0].commit not in log and cp.root_state.code_commit in log
        first = read_steps(cp.tree_dir, r.edge_id)[0]["request"]["messages"][1]["content"]
        assert first == cp.world.start_prompt()  # the world's (Coral's OpenCode runtime, or the stand-in)
