"""A whole `sftree explore` against a Teacher that overflows its context and answers in real-server shapes.

The tree must finish (exit 0): a context overflow fails its edge (section 1.1: a turn without a numeric score
fails the edge) and is not retried; a malformed reply is one failed step; the other shapes are handled and
recorded, and reasoning text reaches the export.
"""

from __future__ import annotations

import json

import yaml
from helpers.explore import explore, load_final, make_root, write_config

from sftree import cli
from sftree.records import steplog

SCRIPT = [
    {"match": {"edge": "e1", "turn": 2}, "fault": "context_overflow"},
    {"match": {"edge": "e2", "turn": 1}, "fault": "lone_surrogate", "count": 1},
    {"match": {"edge": "e2", "turn": 2}, "fault": "tool_calls_string", "count": 1},
    {"match": {"edge": "e2"}, "fault": "reasoning"},
    {"match": {"edge": "e3", "turn": 1}, "fault": "bad_usage", "count": 1},
    {"match": {"edge": "e3", "turn": 1}, "fault": "length_mid_call", "count": 2},
    {"match": {"edge": "e3", "turn": 2}, "fault": "hermes_text"},
    {"match": {"edge": "e4", "turn": 1}, "fault": "json_text"},
    {"match": {"edge": "e4", "turn": 2}, "fault": "function_call"},
]


def steps(out, edge):
    return steplog.read_steps(out / "edges" / edge / "steps.jsonl")


def test_overflow_and_real_server_shapes_finish_the_tree(tmp_path):
    root = make_root(tmp_path)
    search = {
        "root_children": 3,
        "max_children": 1,
        "max_depth": 1,
        "parallel_width": 3,
        "max_valid_edges": 4,
    }
    cfg = write_config(tmp_path, search, script=SCRIPT)
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 0
    tree = load_final(out)
    edges = {e.id: e for e in tree.edges}
    assert tree.status == "finished"

    # e1: turn 2 hit the 400 at once: the edge failed (no score on turn 2), nothing was retried
    e1 = edges["e1"]
    assert e1.pruned and e1.prune_reason == "no_score" and e1.error is None
    assert [t["ended"] for t in e1.turns][1] == "context_overflow"
    assert "longer than the model's context length" in e1.turns[1]["error"]
    failed = [s for s in steps(out, "e1") if s["response"] is None]
    assert len(failed) == 1 and failed[0]["turn"] == 2 and failed[0]["error"].startswith("context_overflow: ")

    # e2: two malformed replies, each one failed step with its reason; the edge still got its scores
    e2 = edges["e2"]
    assert not e2.pruned and e2.score is not None
    errors = [s["error"] for s in steps(out, "e2") if s["response"] is None]
    assert errors == [
        "malformed reply: message.content holds a lone surrogate U+D800 (not valid Unicode)",
        "malformed reply: message.tool_calls is a str, not a list",
    ]
    answered = [s for s in steps(out, "e2") if s["response"]]
    assert all(s["response"]["reasoning_content"].startswith("I should look") for s in answered)
    session = json.loads((out / "sessions" / "e2.json").read_text())
    assert any(m.get("reasoning_content") for m in session if m["role"] == "assistant")

    # e3: bad usage = a failed step; a tool call cut by finish_reason length is answered with an error, not run;
    # Hermes text calls are run as tool calls
    e3 = steps(out, "e3")
    assert e3[0]["error"].startswith("malformed reply: usage.prompt_tokens is not a non-negative number")
    cut = [s for s in e3 if "truncated_tool_call" in (s.get("notes") or [])]
    assert len(cut) == 1 and cut[0]["finish_reason"] == "length"
    assert all(
        r["error"] and r["content"].startswith("Not run: your reply was cut off")
        for r in cut[0]["tool_results"]
    )
    assert edges["e3"].tool_errors >= len(cut[0]["tool_results"])
    hermes = [s for s in e3 if s["turn"] == 2 and s["response"]]
    assert hermes and all(s["notes"] == ["text_tool_calls:hermes"] for s in hermes)
    assert all("<tool_call>" not in s["response"]["content"] for s in hermes)
    assert edges["e3"].turns[1]["ended"] == "eval"

    # e4 (the retry of e1's slot): bare JSON calls and the legacy function_call
    notes = {n for s in steps(out, "e4") for n in s.get("notes") or []}
    assert notes == {"text_tool_calls:json", "legacy_function_call"}
    assert not edges["e4"].pruned

    # generated tool call ids never repeat within a session
    for e in ("e3", "e4"):
        session = json.loads((out / "sessions" / f"{e}.json").read_text())
        ids = [c["id"] for m in session for c in m.get("tool_calls") or []]
        assert ids and len(ids) == len(set(ids))

    # reasoning text is training signal: it reaches the export
    paths = out / "paths.json"
    assert (
        cli.main(["select-paths", "--tree", str(out / "tree.json"), "--out", str(paths), "--top-k", "9"]) == 0
    )
    sft = tmp_path / "sft.jsonl"
    assert cli.main(["export-sft", "--paths", str(paths), "--out", str(sft), "--granularity", "step"]) == 0
    records = [json.loads(line) for line in sft.read_text().splitlines()]
    messages = [m for r in records for m in r["prompt"] + r["completion"]]
    assert any(m.get("reasoning_content", "").startswith("I should look") for m in messages)
    # steps whose calls came as text, as a legacy function_call or cut by finish_reason length are never trained
    # (docs/outputs.md); e3's well-formed turn 1 steps are
    trained = {(r["metadata"]["edge"], r["metadata"]["turn"], r["metadata"]["step"]) for r in records}
    odd = [
        (e, s["turn"], s["step"])
        for e in ("e3", "e4")
        for s in steps(out, e)
        if s["response"] and s.get("notes")
    ]
    assert len(odd) >= 4 and trained.isdisjoint(odd)
    assert "e3" in {r["metadata"]["edge"] for r in records if r["completion"][0].get("tool_calls")}
    stats = json.loads((tmp_path / "sft.stats.json").read_text())
    assert set(stats["excluded"]) == {"truncated", "text_tool_call", "normalised"}
    assert sum(stats["excluded"].values()) == len(odd)


def test_context_budget_stops_the_turn_before_the_server_400(tmp_path):
    root = make_root(tmp_path)
    search = {"root_children": 1, "max_depth": 1, "parallel_width": 1}
    cfg = write_config(tmp_path, search, script=[])
    data = yaml.safe_load(cfg.read_text())
    # the sim answers 400 above 5000 prompt tokens; the client must stop first from the usage it counts
    data["teacher"].update(max_tokens=500, context_tokens=5000)
    data["teacher"]["sim"]["context_tokens"] = 5000
    data["agent"]["max_steps_per_turn"] = 40
    cfg.write_text(yaml.safe_dump(data))
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 0
    tree = load_final(out)
    assert tree.status == "finished" and tree.stop_reason == "frontier_empty"
    overflowed = [t for e in tree.edges for t in e.turns if t["ended"] == "context_overflow"]
    assert overflowed and all("would reach teacher.context_tokens 5000" in t["error"] for t in overflowed)
    records = [s for e in tree.edges for s in steps(out, e.id)]
    assert all(s["response"] is not None for s in records)  # no request was sent to get the 400
    assert max(s["usage"]["prompt_tokens"] + s["usage"]["completion_tokens"] for s in records) + 500 >= 5000
