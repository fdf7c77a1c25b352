"""A tree explored against teacher-sim's fault script (each backend: native, and the real OpenCode behind the
recording proxy), then exported: a reply cut at
`max_tokens`, a call whose arguments do not parse and a tool call written as text each stay in the transcript and
in the history of later records, and are never a trained completion; the dataset card counts them."""

from __future__ import annotations

import json

import pytest
from helpers.explore import explore, load_final, make_root, write_config
from helpers.runtime import opencode_binary

from sftree import cli
from sftree.dataset.messages import exclusion, normalize_message
from sftree.records import steplog

OPENCODE, WHY = opencode_binary()
NEEDS_OPENCODE = [
    pytest.mark.opencode,
    pytest.mark.skipif(OPENCODE is None, reason=f"opencode binary missing: {WHY}"),
]
SCRIPT = [
    {"match": {"edge": "e1", "turn": 2}, "fault": "malformed_args", "count": 1},  # step 1: `{..."` arguments
    {
        "match": {"edge": "e2", "turn": 1},
        "fault": "hermes_text",
        "count": 1,
    },  # step 1: <tool_call> in content
    # step 5 (after the edit): cut inside its text; the nudge that follows makes the policy eval the edit
    {"match": {"edge": "e2", "turn": 1}, "fault": "length_text", "skip": 4, "count": 1},
    {
        "match": {"edge": "e2", "turn": 2},
        "fault": "length_mid_call",
        "skip": 1,
        "count": 1,
    },  # step 2: cut call
]


# OpenCode ends its run at a reply without a call (the text call in e2 turn 1): the nudged model submits at once,
# so the cut text goes where OpenCode still works: e2 turn 2, after the edit (the nudge then evals it).
# A call cut at max_tokens ends an OpenCode turn at once (agents/turn_end.py `cut_call`; its own tests:
# test_opencode_edge.py::test_real_server_reply_shapes_through_opencode, test_proxy_recording.py), so here it
# would end e2's last turn before its eval: this variant trains around a cut text instead.
OPENCODE_SCRIPT = [f for f in SCRIPT if f["fault"] not in ("length_text", "length_mid_call")] + [
    {"match": {"edge": "e2", "turn": 2}, "fault": "length_text", "skip": 5, "count": 1}
]


@pytest.mark.parametrize("backend", ["native", pytest.param("opencode", marks=NEEDS_OPENCODE)])
def test_ill_formed_steps_are_history_never_completions(tmp_path, backend):
    root = make_root(tmp_path)
    # seed 1: both edges score (under seed 0 e1's edit crashes the grader and the root's retry takes its place)
    cfg = write_config(
        tmp_path,
        {"root_children": 1, "max_children": 1, "max_depth": 2, "parallel_width": 1},
        script=SCRIPT if backend == "native" else OPENCODE_SCRIPT,
        seed=1,
        # OpenCode in the sandbox: the worktree at its fixed path, so teacher-sim's seeded choices (which see the
        # paths in its own calls) are the same wherever the test runs
        agent={"backend": backend, "student_model": "sglang/student"}
        | ({"sandbox": "auto"} if backend == "opencode" else {}),
    )
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 0
    tree = load_final(out)
    assert tree.backend == backend and [e.id for e in tree.edges] == ["e1", "e2"]

    # in the transcripts, as the agent recorded them
    bad = {}
    for e in ("e1", "e2"):
        for s in steplog.read_steps(out / "edges" / e / "steps.jsonl"):
            why = s["response"] is not None and exclusion(s)
            if why:
                bad[(e, s["turn"], s["step"])] = (why, s)
    cut = 2 if backend == "native" else 1  # the native variant also has a call cut at max_tokens
    assert sorted(why for why, _ in bad.values()) == [
        "malformed_arguments",
        "text_tool_call",
        *["truncated"] * cut,
    ]
    reasons = {k[:2]: why for k, (why, _) in bad.items()}
    assert reasons[("e1", 2)] == "malformed_arguments" and reasons[("e2", 1)] in (
        "text_tool_call",
        "truncated",
    )
    cut_text = [s for why, s in bad.values() if why == "truncated" and not s["response"].get("tool_calls")]
    assert len(cut_text) == 1 and cut_text[0]["finish_reason"] == "length" and cut_text[0]["kind"] == "agent"

    paths = out / "paths.json"
    assert cli.main(["select-paths", "--tree", str(out / "tree.json"), "--out", str(paths)]) == 0
    assert json.loads(paths.read_text())["paths"][0]["edges"] == ["e1", "e2"]
    sft = tmp_path / "results" / "circle_packing" / "sft.jsonl"
    # `keep`: the text tool call stays in later prompts as sent, and its `<tool_call>` text is control-token text,
    # which `drop` (the default, tests/test_export_special_text.py) would leave out with those prompts
    assert (
        cli.main(
            [
                "export-sft",
                "--paths",
                str(paths),
                "--out",
                str(sft),
                "--special-text",
                "keep",
                "--granularity",
                "step",
            ]
        )
        == 0
    )
    records = [json.loads(x) for x in sft.read_text().splitlines()]
    ids = {
        r["metadata"]["id"].rsplit("/", 2)[1] + "/" + r["metadata"]["id"].rsplit("/", 1)[1] for r in records
    }
    assert all(r["metadata"]["backend"] == backend and r["metadata"]["coral"] == "stand-in" for r in records)
    for (edge, turn, step), (why, s) in bad.items():
        assert f"{edge}/t{turn}s{step}" not in ids, f"{why} step {edge} t{turn}s{step} was trained"
        sent, _ = normalize_message(s["response"])
        assert all(sent not in r["completion"] for r in records)
        # the next model call of the session resent it: there it is history, exactly as sent (OpenCode resends a
        # call it could not run as its own `invalid` call under the same id: what the Student's OpenCode sends too)
        ids = {c["id"] for c in s["response"].get("tool_calls") or []}
        if backend == "native" or not ids:
            later = [r for r in records if sent in r["prompt"]]
        else:
            later = [
                r
                for r in records
                if ids & {c.get("id") for m in r["prompt"] for c in m.get("tool_calls") or []}
            ]
        assert later, f"{why} step {edge} t{turn}s{step} is in no later prompt"
        assert all(r["metadata"]["history_excluded"] >= 1 for r in later)
    assert len(records) == sum(
        1
        for e in ("e1", "e2")
        for s in steplog.read_steps(out / "edges" / e / "steps.jsonl")
        if s["kind"] in ("agent", "nudge") and s["response"] is not None
    ) - len(bad)
    stats = json.loads((sft.parent / "sft.stats.json").read_text())
    assert stats["excluded"] == {"truncated": cut, "text_tool_call": 1, "malformed_arguments": 1}

    # the card counts them (and flags the native backend, only it)
    res = tmp_path / "results"
    card = res / "dataset_card.md"
    args = ["merge-sft", str(sft), "--out", str(res / "sft.jsonl"), "--card", str(card)]
    assert cli.main(args) == 0
    text = card.read_text()
    assert (
        f"{2 + cut} ill-formed steps on the selected paths are never a trained completion: truncated {cut}, "
        "text_tool_call 1, malformed_arguments 1, normalised 0." in text
    )
    flagged = f"**{len(records)} records were NOT made by OpenCode**"
    assert (flagged in text) == (backend == "native") and ("NOT made by OpenCode" in text) == (
        backend == "native"
    )

    # a path record trains every assistant turn: it ends before e1's malformed turn 2 step 1
    psft = tmp_path / "path.jsonl"
    assert cli.main(["export-sft", "--paths", str(paths), "--out", str(psft), "--granularity", "path"]) == 0
    (rec,) = [json.loads(x) for x in psft.read_text().splitlines()]
    assert rec["metadata"]["cut"] == {"edge": "e1", "turn": 2, "step": 1, "reason": "malformed_arguments"}
    assert rec["metadata"]["edge"] == "e1" and rec["metadata"]["turn"] == 1
    assert all(m["name"] for m in rec["messages"] if m["role"] == "tool")
