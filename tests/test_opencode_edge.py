"""The opencode backend end to end: the real OpenCode CLI, teacher-sim (streaming) behind the recording proxy.

Skipped when the opencode binary is missing (install: `bash scripts/install_opencode.sh`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from runtime_helpers import config, example_task, make_root, read_steps

from sftree.edge import EdgeContext, run_edge
from sftree.errors import InputError

try:
    from sftree.agents.opencode import find_binary

    OPENCODE = find_binary("opencode")
except InputError as exc:  # pragma: no cover - depends on the machine
    OPENCODE, WHY = None, str(exc)
else:
    WHY = ""

pytestmark = [
    pytest.mark.opencode,
    pytest.mark.skipif(OPENCODE is None, reason=f"opencode binary missing: {WHY}"),
]
# OpenCode 1.18.33's tools as the agent sees them; task (subagents) and webfetch are denied by our config.
OPENCODE_TOOLS = ["bash", "edit", "glob", "grep", "read", "skill", "todowrite", "write"]
FAULTS = [{"match": {"edge": "e3", "turn": "1"}, "fault": "tool_errors", "count": 1}]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """e1 from the root; e2 and e3 forked from e1's node at once (e3's first request reads a missing file)."""
    tmp = tmp_path_factory.mktemp("oc")
    cfg = config(
        teacher={"sim": {"seed": 3, "script": FAULTS}},
        agent={"backend": "opencode", "max_steps_per_turn": 12, "turn_timeout": 240},
    )
    ctx = EdgeContext.create(tmp / "tree", make_root(tmp), cfg, example_task(cfg))
    e1 = run_edge(ctx, ctx.root_state, "e1", 1.0, depth=1, attempt=1, eval_count=5)
    with ThreadPoolExecutor(2) as pool:
        kids = [
            pool.submit(run_edge, ctx, e1.child_state, e, e1.score, depth=2, attempt=1, eval_count=7)
            for e in ("e2", "e3")
        ]
        e2, e3 = (f.result() for f in kids)
    yield ctx, {"e1": e1, "e2": e2, "e3": e3}
    ctx.close()


def agent_steps(ctx, edge):
    return [r for r in read_steps(ctx.tree_dir, edge) if r["kind"] in ("agent", "nudge")]


def test_one_edge_two_turns_two_evals(tree):
    ctx, r = tree
    e1 = r["e1"]
    assert e1.error is None and e1.valid, e1.to_dict()
    assert [t.ended for t in e1.turns] == ["eval", "eval"] and [t.eval_number for t in e1.turns] == [6, 7]
    assert e1.score == max(t.score for t in e1.turns) and all(t.commit for t in e1.turns)
    for t in e1.turns:  # the eval really graded that commit (attempt record written by coral)
        shown = subprocess.run(
            [
                "git",
                "--git-dir",
                str(ctx.store.knowledge_git),
                "show",
                f"{e1.child_state.knowledge_commit}:attempts/{t.commit}.json",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert json.loads(shown)["score"] == pytest.approx(t.score)
    steps = agent_steps(ctx, "e1")
    assert [s["turn"] for s in steps].count(1) == e1.turns[0].steps and len(steps) == e1.steps
    for s in steps:
        assert [t["function"]["name"] for t in s["request"]["tools"]] == OPENCODE_TOOLS
        assert s["request"]["messages"][0]["role"] == "system"
        assert s["request"]["messages"][0]["content"].startswith("You are opencode")
        assert s["usage"]["prompt_tokens"] > 0 and s["response"]["role"] == "assistant"
    last_of_turn = [max((s for s in steps if s["turn"] == k), key=lambda s: s["step"]) for k in (1, 2)]
    for s in last_of_turn:  # each turn ends with its `coral eval` call and Coral's result block
        (res,) = s["tool_results"]
        assert "coral eval" in json.loads(s["response"]["tool_calls"][0]["function"]["arguments"])["command"]
        assert res["content"].startswith("CORAL Eval (#")
    # Turn 2's first request continues turn 1's session: turn 1's last request is its prefix.
    t2_first = next(s for s in steps if s["turn"] == 2)
    prefix = last_of_turn[0]["request"]["messages"]
    assert t2_first["request"]["messages"][: len(prefix)] == prefix
    assert t2_first["request"]["messages"][-1]["content"].startswith("## Eval #6 Results")
    # Tokens = the session's context length after the last step: its prompt + completion tokens.
    assert e1.tokens == steps[-1]["usage"]["prompt_tokens"] + steps[-1]["usage"]["completion_tokens"] > 0
    assert (ctx.tree_dir / "sessions" / "e1.opencode.json").is_file()


def test_fork_continues_the_parent_session(tree):
    ctx, r = tree
    parent_last = agent_steps(ctx, "e1")[-1]
    parent_msgs = parent_last["request"]["messages"]
    session = json.loads((ctx.tree_dir / "sessions" / "e1.json").read_text())
    firsts = []
    for edge in ("e2", "e3"):
        first = agent_steps(ctx, edge)[0]
        msgs = first["request"]["messages"]
        assert msgs[: len(parent_msgs)] == parent_msgs  # byte-identical prefix: radix-cache reuse
        assert msgs[: len(session)] == session  # the node's session file is exactly what OpenCode resends
        assert msgs[len(session)]["role"] == "user" and msgs[len(session)]["content"].startswith("## Eval #7")
        firsts.append(first)
    assert firsts[0]["request"]["messages"] == firsts[1]["request"]["messages"]
    assert r["e2"].valid and [t.eval_number for t in r["e2"].turns] == [8, 9]


def test_tool_error_and_knowledge_from_the_event_stream(tree):
    ctx, r = tree
    e3 = r["e3"]
    first = agent_steps(ctx, "e3")[0]
    (res,) = first["tool_results"]
    assert (
        res["error"] is True
        and res["name"] == "read"
        and "missing_" in json.loads(first["response"]["tool_calls"][0]["function"]["arguments"])["filePath"]
    )
    assert e3.turns[0].tool_errors == 1 and e3.turns[1].tool_errors == 0
    assert e3.tool_error_rate == pytest.approx(1 / e3.tool_calls)
    for e in ("e1", "e2", "e3"):  # teacher-sim reads notes/attempts (or `coral log`) first in every turn
        assert all(t.knowledge for t in r[e].turns)
    flagged = [t for s in agent_steps(ctx, "e1") for t in s["tool_results"] if t["knowledge"]]
    assert flagged and all(t["name"] in ("bash", "glob", "read", "write") for t in flagged)


def test_explore_runs_a_small_tree_with_opencode(tmp_path):
    cfg = config(
        teacher={"sim": {"seed": 5}},
        agent={"backend": "opencode", "max_steps_per_turn": 12, "turn_timeout": 240},
        search={
            "root_children": 1,
            "max_children": 1,
            "max_depth": 1,
            "max_valid_edges": 1,
            "parallel_width": 1,
        },
    )
    cfg_path = tmp_path / "cfg.json"  # YAML is a superset of JSON
    cfg_path.write_text(json.dumps(cfg))
    root = make_root(tmp_path)
    out = tmp_path / "trees" / root.name
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sftree",
            "explore",
            "--root",
            str(root),
            "--out",
            str(out),
            "--config",
            str(cfg_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = json.loads((out / "tree.json").read_text())
    assert t["status"] == "finished" and len(t["edges"]) >= 1
    e = t["edges"][0]
    assert e["score"] is not None and len(e["turns"]) == 2
    assert (out / "sessions" / f"{e['id']}.opencode.json").is_file()
    steps = [json.loads(x) for x in (out / e["transcript"]).read_text().splitlines()]
    assert steps and all(s["request"]["tools"] for s in steps if s["kind"] == "agent")
