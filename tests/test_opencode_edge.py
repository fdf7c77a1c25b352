"""The opencode backend end to end: the real OpenCode CLI, teacher-sim (streaming) behind the recording proxy.

Skipped when the opencode binary is missing (install: `bash scripts/install_opencode.sh`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.explore import explore_cmd
from helpers.runtime import config, example_task, make_root, opencode_binary, read_steps

from sftree.records import steplog
from sftree.search.edge import EdgeContext, run_edge
from sftree.settings import settings_of

OPENCODE, WHY = opencode_binary()

pytestmark = [
    pytest.mark.opencode,
    pytest.mark.skipif(OPENCODE is None, reason=f"opencode binary missing: {WHY}"),
]
# OpenCode 1.18.33's tools as the agent sees them; task (subagents) and webfetch are denied by our config.
OPENCODE_TOOLS = ["bash", "edit", "glob", "grep", "read", "skill", "todowrite", "write"]
FAULTS = [
    {"match": {"edge": "e3", "turn": "1"}, "fault": "tool_errors", "count": 1},
    {"match": {"edge": "e4", "turn": "1"}, "fault": "no_eval", "count": 1},  # stops talking: nudged
    {"match": {"edge": "e4", "turn": "2"}, "fault": "http_500"},  # the Teacher stays down in e4's turn 2
    {"match": {"edge": "e5", "turn": "1"}, "fault": "http_500"},  # down from e5's first request: one turn run
]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """e1 and e4 from the root, then e2 and e3 forked from e1's node at once (e3 reads a missing file)."""
    tmp = tmp_path_factory.mktemp("oc")
    cfg = config(
        teacher={"sim": {"seed": 1, "script": FAULTS}},
        agent={"backend": "opencode", "max_steps_per_turn": 12, "turn_timeout": 240},
    )
    ctx = EdgeContext.create(tmp / "tree", make_root(tmp), settings_of(cfg), example_task(cfg))
    with ThreadPoolExecutor(2) as pool:
        firsts = [
            pool.submit(run_edge, ctx, ctx.root_state, e, 1.0, depth=1, attempt=1, eval_count=5)
            for e in ("e1", "e4")
        ]
        e1, e4 = (f.result() for f in firsts)
    with ThreadPoolExecutor(2) as pool:
        kids = [
            pool.submit(run_edge, ctx, e1.child_state, e, e1.score, depth=2, attempt=1, eval_count=7)
            for e in ("e2", "e3")
        ]
        e2, e3 = (f.result() for f in kids)
    yield ctx, {"e1": e1, "e2": e2, "e3": e3, "e4": e4}
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
        assert "\nCORAL Eval (#" in res["content"]
    # Turn 2's first request continues turn 1's session: turn 1's last request is its prefix.
    t2_first = next(s for s in steps if s["turn"] == 2)
    prefix = last_of_turn[0]["request"]["messages"]
    assert t2_first["request"]["messages"][: len(prefix)] == prefix
    assert t2_first["request"]["messages"][-1]["content"].startswith("## Eval #1 Results")
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
        if ctx.agent.sandbox != "bwrap":  # the system prompt names the workspace, which differs per edge
            ws = lambda e: str((ctx.tree_dir / "work" / e / "code").resolve())  # noqa: E731
            msgs = [{**msgs[0], "content": msgs[0]["content"].replace(ws(edge), ws("e1"))}] + msgs[1:]
        assert msgs[: len(parent_msgs)] == parent_msgs  # byte-identical prefix: radix-cache reuse
        assert msgs[: len(session)] == session  # the node's session file is exactly what OpenCode resends
        assert msgs[len(session)]["role"] == "user" and msgs[len(session)]["content"].startswith("## Eval #2")
        firsts.append(first)
    assert firsts[0]["request"]["messages"][1:] == firsts[1]["request"]["messages"][1:]
    assert r["e2"].valid and [t.eval_number for t in r["e2"].turns] == [8, 9]


def test_a_driver_killed_in_the_last_turn_still_leaves_its_session_to_the_forks(tmp_path, monkeypatch):
    """The driver that does not answer the abort is killed with its sandbox; the session store it left on disk
    is still saved at the node (by a new driver), and a fork continues that session."""
    from sftree.agents.opencode import OpenCodeAgent

    cfg = config(
        teacher={"sim": {"seed": 2}},
        agent={"backend": "opencode", "max_steps_per_turn": 12, "turn_timeout": 240},
    )
    ctx = EdgeContext.create(tmp_path / "tree", make_root(tmp_path), settings_of(cfg), example_task(cfg))
    real = OpenCodeAgent._one_run

    def then_killed(self, run, st, *a):
        out = real(self, run, st, *a)
        if run.workspace.edge_id == "e1" and run.turn == 2:
            self._kill(st)  # as after an abort that timed out
        return out

    monkeypatch.setattr(OpenCodeAgent, "_one_run", then_killed)
    try:
        e1 = run_edge(ctx, ctx.root_state, "e1", 1.0, depth=1, attempt=1, eval_count=5)
        assert e1.valid, e1.to_dict()
        assert (ctx.tree_dir / "sessions" / "e1.opencode.db").stat().st_size > 0
        e2 = run_edge(ctx, e1.child_state, "e2", e1.score, depth=2, attempt=1, eval_count=7)
        parent = agent_steps(ctx, "e1")[-1]["request"]["messages"]
        assert agent_steps(ctx, "e2")[0]["request"]["messages"][: len(parent)] == parent, e2.to_dict()
    finally:
        ctx.close()


def test_a_run_that_sends_too_many_events_ends_as_an_edge_error(tmp_path, monkeypatch):
    """The host takes at most RUN_EVENTS_MAX events per prompt from the sandbox (a plugin in the server may
    publish any number); past that the turn stops as an edge error and its sandbox is reaped (as for a turn over
    the disk quota, the next turn starts a new one)."""
    from sftree.agents import opencode

    monkeypatch.setattr(opencode, "RUN_EVENTS_MAX", 3)  # a real run sends more than three
    cfg = config(
        teacher={"sim": {"seed": 2}},
        agent={"backend": "opencode", "max_steps_per_turn": 12, "turn_timeout": 240},
    )
    ctx = EdgeContext.create(tmp_path / "tree", make_root(tmp_path), settings_of(cfg), example_task(cfg))
    try:
        e1 = run_edge(ctx, ctx.root_state, "e1", 1.0, depth=1, attempt=1, eval_count=5)
        assert not e1.valid and [t.ended for t in e1.turns] == ["edge_error", "edge_error"], e1.to_dict()
        assert all("sent over 3 events" in (t.error or "") for t in e1.turns), e1.to_dict()
        assert e1.evals == 0
    finally:
        ctx.close()


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


def test_nudge_then_teacher_down(tree):
    ctx, r = tree
    e4 = r["e4"]
    t1 = [s for s in read_steps(ctx.tree_dir, "e4") if s["turn"] == 1]
    assert t1[0]["kind"] == "agent" and not t1[0]["response"].get("tool_calls")  # text only, OpenCode stopped
    nudge = t1[1]
    assert nudge["kind"] == "nudge" and nudge["request"]["messages"][-1]["role"] == "user"
    assert nudge["request"]["messages"][-2] == {"role": "assistant", "content": t1[0]["response"]["content"]}
    assert "coral eval" in nudge["response"]["tool_calls"][0]["function"]["arguments"]
    assert [t.ended for t in e4.turns] == ["eval", "teacher_error"] and not e4.valid
    # The nudged model submits at once, before any edit: Coral's "Nothing to commit" (no score).
    assert e4.turns[0].eval_status == "nothing_to_commit" and e4.error.startswith("HTTP 500: ")
    failed = [s for s in read_steps(ctx.tree_dir, "e4") if s["turn"] == 2]
    # The server's own words follow the status (a context overflow says so: agents/turn_end.py)
    assert failed and failed[-1]["response"] is None and failed[-1]["error"].startswith("HTTP 500: ")


def test_an_edge_that_stops_after_turn_one_gives_back_its_uid_and_proxy_key(tree):
    """Without the per-edge release, an edge ended by a Teacher outage in turn 1 held its sandbox uid and its
    proxy channel until the whole tree closed."""
    from sftree.runtime.sandbox import UIDS

    ctx, _ = tree
    agent = ctx.agent
    held_before = set(UIDS._used)
    seen: dict = {}
    real_run_turn = agent.run_turn

    def spy(run):  # what the backend holds while the edge runs
        out = real_run_turn(run)
        st = agent._edges.get(run.workspace.edge_id)
        seen["uid"] = st.uid if st else "gone"
        seen["channel"] = run.workspace.edge_id in agent.proxy.channels
        return out

    agent.run_turn = spy
    try:
        e5 = run_edge(ctx, ctx.root_state, "e5", 1.0, depth=1, attempt=1, eval_count=5)
    finally:
        del agent.run_turn
    assert [t.ended for t in e5.turns] == ["teacher_error", "teacher_error"]
    assert seen["uid"] != "gone" and seen["channel"]  # turn 1 ended with the edge's holdings still in place
    assert "e5" not in agent._edges and "e5" not in agent.proxy.channels
    if seen["uid"] is not None:  # root: a real uid from the pool, now free again
        assert seen["uid"] not in UIDS._used
    assert set(UIDS._used) <= held_before


def test_the_worktree_holds_corals_opencode_settings_and_opencode_keeps_sftrees_denials(tree):
    """The worktree's .opencode/opencode.json is the one Coral writes (its permissions: everything allowed, web
    tools with agents.research); sftree's provider and its denials live outside the worktree, and the denials win:
    no task, webfetch, websearch or question tool is offered."""
    ctx, r = tree
    agent = ctx.agent
    seen: dict = {}
    real_run_turn = agent.run_turn

    def spy(run):
        out = real_run_turn(run)
        seen.setdefault("settings", (Path(run.workspace.root) / ".opencode" / "opencode.json").read_text())
        return out

    agent.run_turn = spy
    try:
        run_edge(ctx, ctx.root_state, "e6", 1.0, depth=1, attempt=1, eval_count=5)
    finally:
        del agent.run_turn
    assert seen["settings"] == ctx.world.opencode_json()
    settings = json.loads(seen["settings"])
    assert settings["permission"]["*"] == "allow" and "provider" not in settings
    offered = {t["function"]["name"] for s in agent_steps(ctx, "e6") for t in s["request"]["tools"]}
    assert offered and not offered & {"task", "webfetch", "websearch", "question"}, offered


def test_explore_grows_a_small_tree_with_opencode(tmp_path):
    """`sftree explore` with backend opencode: two root children at once, then one fork below them."""
    cfg = config(
        teacher={"sim": {"seed": 1}},
        agent={"backend": "opencode", "max_steps_per_turn": 12, "turn_timeout": 240},
        search={
            "root_children": 2,
            "max_children": 1,
            "max_depth": 2,
            "max_valid_edges": 3,
            "target_good_leaves": 4,
            "parallel_width": 2,
        },
    )
    cfg_path = tmp_path / "cfg.json"  # YAML is a superset of JSON
    cfg_path.write_text(json.dumps(cfg))
    root = make_root(tmp_path)
    out = tmp_path / "trees" / root.name
    proc = subprocess.run(
        explore_cmd(root, out, cfg_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = json.loads((out / "tree.json").read_text())
    # The budget stops dispatching at 3 valid edges; an expansion already running still finishes (async).
    assert t["status"] == "finished" and 3 <= len(t["edges"]) <= 4, [e["id"] for e in t["edges"]]
    nodes = {n["id"]: n for n in t["nodes"]}
    deep = [e for e in t["edges"] if e["depth"] == 2]
    assert len(deep) >= 1 and nodes[deep[0]["parent"]]["depth"] == 1
    for e in t["edges"]:
        assert e["score"] is not None and len(e["turns"]) == 2 and e["knowledge"] is True
        assert (out / "sessions" / f"{e['id']}.opencode.json").is_file()
        steps = steplog.read_steps(out / e["transcript"])
        assert steps and all(s["request"]["tools"] for s in steps if s["kind"] == "agent")
    # The depth-2 edge continued its parent's OpenCode session.
    parent_edge = next(e for e in t["edges"] if e["child"] == deep[0]["parent"])
    parent_last = steplog.read_steps(out / parent_edge["transcript"])[-1]
    child_first = steplog.read_steps(out / deep[0]["transcript"])[0]
    n = len(parent_last["request"]["messages"])
    assert child_first["request"]["messages"][1:n] == parent_last["request"]["messages"][1:]


def test_sandbox_reaches_the_proxy_and_nothing_else(tree, tmp_path):
    """Under bwrap, OpenCode's server sees the proxy (through the driver's bridge) but no other port, and no
    grader."""
    from sftree.agents.base import TurnRun
    from sftree.agents.opencode import _Edge

    ctx, _ = tree
    agent = ctx.agent
    if agent.sandbox != "bwrap":
        pytest.skip("bubblewrap is not usable here (agent.sandbox resolved to none)")
    from sftree.runtime.sandbox import UIDS
    from sftree.search.edge import open_world

    uid = UIDS.acquire()
    ws, runtime, server, box = open_world(ctx, ctx.root_state, "probe", uid)
    try:
        st = _Edge(home=ws.paths.edge / "opencode", uid=uid)
        st.home.mkdir()
        run = TurnRun(ws, box, runtime, [], "", 1, {}, None)
        agent.proxy.channel("probe")
        teacher_port = int(ctx.teacher.base_url.rsplit(":", 1)[1].split("/")[0])
        probe = f"""
import os, socket, urllib.request
ok = urllib.request.urlopen("{agent.proxy.base_url("probe")}/models", timeout=10).status
try:
    socket.create_connection(("127.0.0.1", {teacher_port}), timeout=3); direct = "open"
except OSError:
    direct = "refused"
print(ok, direct, os.path.exists({ctx.task_cfg["coral_task"] + "/eval/grader.py"!r}), os.getcwd())
"""
        # In place of `opencode serve`: the probe, started by the driver where the server would run (same
        # sandbox, environment and bridge); it reports on stderr and exits before it listens.
        fake = tmp_path / "fake-opencode"
        fake.write_text(f"#!{sys.executable} -I\nimport sys\nsys.stdout = sys.stderr\n" + probe)
        fake.chmod(0o755)
        agent_binary, agent.binary = agent.binary, str(fake)
        try:
            with pytest.raises(RuntimeError, match="did not start") as err:
                agent._start(run, st)
        finally:
            agent.binary = agent_binary
            agent._kill(st)
        report = next((ln for ln in str(err.value).splitlines() if ln.startswith("200 ")), str(err.value))
        assert report.split() == ["200", "refused", "False", box.worktree], str(err.value)
        assert box.worktree == f"{ctx.run_dir}/agents/{ctx.agent_id}"  # Coral's shape, no host path
    finally:
        server.stop()
        ws.close()
        UIDS.release(uid)


def test_compaction_when_allowed_is_detected_and_marked(tmp_path):
    """With autocompaction allowed and a tiny context limit OpenCode compacts; the turn is marked as such."""
    from sftree.agents.base import TurnRun
    from sftree.records.steplog import StepRecorder
    from sftree.runtime.sandbox import UIDS
    from sftree.search.edge import open_world

    cfg = config(
        teacher={"sim": {"seed": 3}},
        agent={
            "backend": "opencode",
            "max_steps_per_turn": 8,
            "turn_timeout": 60,
            "nudges": 0,
            "opencode": {"disable_autocompact": False, "context_limit": 10000},
        },
    )
    ctx = EdgeContext.create(tmp_path / "tree", make_root(tmp_path), settings_of(cfg), example_task(cfg))
    uid = UIDS.acquire() if ctx.mode == "bwrap" else None
    ws, runtime, server, box = open_world(ctx, ctx.root_state, "c1", uid)
    text = ctx.world.instructions()
    recorder = StepRecorder(tmp_path / "steps.jsonl", "c1")
    try:
        run = TurnRun(
            ws, box, runtime, [], ctx.world.start_prompt(), 1, {"X-Sftree-Edge": "c1"}, recorder,
            instructions=text,
        )  # fmt: skip
        out = ctx.agent.run_turn(run)
    finally:
        recorder.close()
        server.stop()
        ws.close()
        UIDS.release(uid)
        ctx.close()
    assert out.compacted is True
    recs = steplog.read_steps(tmp_path / "steps.jsonl")
    kinds = [r["kind"] for r in recs]
    assert kinds[0] == "agent" and "compaction" in kinds and all(r["compacted"] for r in recs)
    first_compaction = recs[kinds.index("compaction")]
    system = first_compaction["request"]["messages"][0]
    assert first_compaction["request"]["tools"] == [] and "structured summary" in system["content"]


SHAPE_FAULTS = [
    {"match": {"edge": "s1", "turn": "1"}, "fault": "bad_usage", "count": 1},
    {"match": {"edge": "s1", "turn": "2"}, "fault": "lone_surrogate", "count": 1},
    {"match": {"edge": "s1", "turn": "2"}, "fault": "reasoning", "count": 1},
    {"match": {"edge": "s1", "turn": "2"}, "fault": "length_mid_call", "count": 1},
]


@pytest.mark.slow
def test_real_server_reply_shapes_through_opencode(tmp_path):
    """teacher-sim's reply-shape faults reach the real OpenCode through the proxy; the edge finishes, and the
    records read them as the native client does (docs/opencode.md, "What OpenCode receives")."""
    cfg = config(
        teacher={"sim": {"seed": 1, "script": SHAPE_FAULTS}},
        agent={"backend": "opencode", "max_steps_per_turn": 12, "turn_timeout": 240},
    )
    ctx = EdgeContext.create(tmp_path / "tree", make_root(tmp_path), settings_of(cfg), example_task(cfg))
    try:
        r = run_edge(ctx, ctx.root_state, "s1", 1.0, depth=1, attempt=1, eval_count=5)
        recs = read_steps(ctx.tree_dir, "s1")  # written and read back as UTF-8
    finally:
        ctx.close()
    assert r.error is None and len(r.turns) == 2, r.to_dict()
    # Turn 1's first reply had a string usage count: one failed step, as `native` records it.
    bad = [s for s in recs if s.get("error")]
    assert len(bad) == 1 and bad[0]["turn"] == 1 and bad[0]["response"] is None, bad
    assert bad[0]["error"].startswith("malformed reply: usage.prompt_tokens") and bad[0]["raw_response"]
    # Turn 2's first reply: reasoning kept, the lone surrogate replaced, the cut call noted and failed.
    first2 = next(s for s in recs if s["turn"] == 2 and s["kind"] in ("agent", "nudge"))
    assert first2["notes"] == ["truncated_tool_call", "lone_surrogate_replaced"], first2
    assert first2["response"]["reasoning_content"] and first2["response"]["content"].endswith("\ufffd")
    assert first2["finish_reason"] == "length" and first2["response"].get("tool_calls"), first2
    # A call cut at max_tokens ends the turn at that reply (agents/turn_end.py): the proxy stopped the channel before
    # OpenCode saw the reply's end, so no later request of the turn carries the cut arguments.
    assert r.turns[1].ended == "cut_call", r.turns[1]
    assert not [
        s for s in recs if s["turn"] == 2 and s["step"] > first2["step"] and s["kind"] in ("agent", "nudge")
    ]
    assert all(s["usage"]["prompt_tokens"] > 0 for s in recs if s.get("response"))


def test_teacher_logprobs_reach_the_steps_through_opencode(tmp_path):
    """`teacher.logprobs: 5` with the real OpenCode: the proxy asks teacher-sim for the sampled tokens on the way
    out, OpenCode reads the replies (logprobs and all) and works as without them, and every agent step keeps
    them aligned with the reply's usage, the chain check passed (nothing tampered)."""
    cfg = config(
        teacher={"sim": {"seed": 1}, "logprobs": 5},
        agent={"backend": "opencode", "max_steps_per_turn": 12, "turn_timeout": 240},
    )
    ctx = EdgeContext.create(tmp_path / "tree", make_root(tmp_path), settings_of(cfg), example_task(cfg))
    try:
        res = run_edge(ctx, ctx.root_state, "e1", 1.0, depth=1, attempt=1, eval_count=5)
    finally:
        ctx.close()
    assert res.score is not None, res
    steps = agent_steps(ctx, "e1")
    assert steps and all(s.get("tampered") is None for s in steps)
    for s in steps:
        lp = s["logprobs"]
        assert lp["k"] == 5 and len(lp["ids"]) == len(lp["top_ids"]) == s["usage"]["completion_tokens"] > 0
        assert s["request"]["params"]["top_logprobs"] == 5
