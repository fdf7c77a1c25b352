"""SFT export: record format, pairing of tool calls, dedupe of shared edges, metadata, merge outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
from helpers.export import RECORD_META, ROOT, llamafactory_alternates, make_results, paths_file

from sftree.dataset.export import export_task, tree_backend, tree_coral
from sftree.dataset.llamafactory import llamafactory_record, turn_boundaries
from sftree.dataset.messages import exclusion, name_tool_messages, normalize_message, parse_arguments
from sftree.dataset.stats import ExportStats
from sftree.errors import InputError
from sftree.records.sft import record_from_doc, schema_problem, stats_path
from sftree.records.steplog import read_steps
from sftree.records.tree import Tree
from sftree.search.explore import record_backend

SCHEMA = json.loads((Path(__file__).parents[1] / "workflow/schemas/sft_record.schema.json").read_text())


def typed(doc):
    """A record as written, typed (records/sft.py's checking reader)."""
    return record_from_doc(doc, "a record")


def check_record(rec):
    jsonschema.validate(rec, SCHEMA)
    msgs = list(typed(rec).messages)
    # the step form's completion is trained alone: its calls are answered in the next step, not here
    history = rec["prompt"] if "prompt" in rec else msgs
    asked = [tc["id"] for m in history if m["role"] == "assistant" for tc in m.get("tool_calls", [])]
    answers = Counter(m["tool_call_id"] for m in history if m["role"] == "tool")
    assert len(asked) == len(set(asked))
    assert all(answers[i] == 1 for i in asked) and set(answers) == set(asked)
    if "prompt" in rec:
        assert rec["prompt"][-1]["role"] in ("user", "tool") and len(rec["completion"]) == 1
    for m in msgs:
        assert isinstance(m["content"], str)
        for tc in m.get("tool_calls", []):
            assert isinstance(tc["function"]["arguments"], dict)


@pytest.fixture
def tree_dir(tmp_path):
    return make_results(tmp_path / "results")


def test_step_records(tree_dir):
    records, stats = export_task([paths_file(tree_dir)], "step")
    # 3 edges x 4 agent steps, no title, less e2's turn 2 step 1 (malformed arguments: never trained)
    assert len(records) == 11 and stats.records == 11 and stats.paths == 2
    assert stats.excluded == {"malformed_arguments": 1} and not stats.skipped
    for r in records:
        check_record(r)
    ids = [r["metadata"]["id"] for r in records]
    assert len(set(ids)) == 11
    edges = [r["metadata"]["edge"] for r in records]
    assert edges == ["e1"] * 4 + ["e2"] * 3 + ["e3"] * 4  # shared e1 once, under the best path
    m = records[0]["metadata"]
    assert (m["task"], m["root"], m["stage"], m["path_rank"], m["path_ranks"]) == (
        "circle_packing",
        ROOT,
        "middle",
        1,
        [1, 2],
    )
    assert (
        m["path_score"] == pytest.approx(0.83)
        and m["max_score"] == 3.0
        and m["avg_score"] == pytest.approx(2.5)
    )
    assert m["avg_cleanliness"] == pytest.approx(0.9) and m["avg_score_rank"] == pytest.approx(0.75)
    assert (m["turn"], m["step"], m["kind"]) == (1, 1, "agent") and m["transcript"].endswith(
        "edges/e1/steps.jsonl"
    )
    assert m["usage"] == {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
    e3 = records[8]["metadata"]
    assert (e3["path_rank"], e3["path_ranks"], e3["path_score"]) == (2, [2], pytest.approx(0.51))
    # e1 turn 1 step 1: prompt system, user; completion the assistant's tool call (its result is not trained)
    assert [x["role"] for x in records[0]["prompt"]] == ["system", "user"]
    (target,) = records[0]["completion"]
    assert target["role"] == "assistant" and target["content"] == ""
    assert target["tool_calls"][0]["function"]["arguments"] == {"filePath": ".opencode/notes/a.md"}
    # the next step's prompt is this prompt + this completion + its tool result, named after the call it answers
    assert records[1]["prompt"] == records[0]["prompt"] + records[0]["completion"] + [
        {"role": "tool", "tool_call_id": "call_e1_1_1", "content": "out call_e1_1_1", "name": "read"}
    ]
    assert (m["backend"], m["coral"], m["history_excluded"]) == ("unknown", "stand-in", 0)
    # the malformed step is no record's completion, but the next step's prompt holds it as sent (kept raw)
    assert [r["metadata"]["id"].rsplit("/", 1)[1] for r in records[4:7]] == ["t1s1", "t1s2", "t2s2"]
    e2t2s2 = records[6]
    bad = e2t2s2["prompt"][-2]
    assert bad["reasoning_content"] == "think first"
    assert bad["tool_calls"][0]["function"]["arguments"] == {"_raw": '{"command": "ls'}
    assert e2t2s2["prompt"][-1] == {
        "role": "tool",
        "tool_call_id": "call_e2_2_1",
        "content": "out call_e2_2_1",
        "name": "read",
    }
    assert [r["metadata"]["malformed_arguments"] for r in records[4:7]] == [0, 0, 1]
    assert [r["metadata"]["history_excluded"] for r in records[4:7]] == [0, 0, 1]
    assert stats.malformed_arguments == 1
    assert all("_raw" not in json.dumps(r["completion"]) for r in records)


def test_path_records(tree_dir):
    records, stats = export_task([paths_file(tree_dir)], "path")
    assert len(records) == 2 and stats.paths_cut == 1 and stats.excluded == {"malformed_arguments": 1}
    for r in records:
        check_record(r)
    best, second = records
    assert best["metadata"]["granularity"] == "path" and best["metadata"]["edge"] == "e2"
    # every assistant turn is trained: the record ends before e2's malformed turn 2 step 1
    assert (best["metadata"]["turn"], best["metadata"]["step"]) == (1, 2)
    assert best["metadata"]["cut"] == {"edge": "e2", "turn": 2, "step": 1, "reason": "malformed_arguments"}
    # system + 3 turns x (user + 2 x (assistant + tool))
    assert len(best["messages"]) == 1 + 3 * 5
    assert best["messages"][-1]["content"] == "out call_e2_1_2"
    assert all("_raw" not in json.dumps(m) for m in best["messages"])
    # the other path (e1, e3) is clean: its last step, the whole session
    assert second["metadata"]["leaf"] == "n3" and second["metadata"]["path_rank"] == 2
    assert second["metadata"]["cut"] is None and len(second["messages"]) == 1 + 4 * 5
    assert all(m["name"] for r in records for m in r["messages"] if m["role"] == "tool")


def test_top_k_limits_export(tree_dir):
    records, stats = export_task([paths_file(tree_dir, top_k=1)], "step")
    assert stats.paths == 1 and [r["metadata"]["edge"] for r in records] == ["e1"] * 4 + ["e2"] * 3


def test_unanswered_tool_call_and_failed_request_are_skipped(tree_dir):
    f = tree_dir / "edges" / "e3" / "steps.jsonl"
    lines = [json.loads(x) for x in f.read_text().splitlines()]
    lines[-1]["tool_results"] = []  # the turn's last step lost its result (cut off by a limit)
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    f = tree_dir / "edges" / "e2" / "steps.jsonl"
    lines = [json.loads(x) for x in f.read_text().splitlines()]
    lines.append(
        dict(lines[-1], step=3, response=None, tool_results=[], error="teacher unavailable after 8 retries")
    )
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    records, stats = export_task([paths_file(tree_dir)], "step")
    assert len(records) == 10 and stats.skipped == {"unpaired_tool_calls": 1, "no_response": 1}


def test_bad_step_file_names_file_and_line(tree_dir):
    f = tree_dir / "edges" / "e2" / "steps.jsonl"
    f.write_text(f.read_text() + "{oops\n")
    with pytest.raises(InputError, match=r"e2/steps.jsonl line 6"):
        export_task([paths_file(tree_dir)], "step")
    (tree_dir / "edges" / "e3" / "steps.jsonl").unlink()
    f.write_text("")
    with pytest.raises(InputError, match="step records not found"):
        export_task([paths_file(tree_dir)], "step")


def test_parse_arguments():
    assert parse_arguments('{"a": 1}') == ({"a": 1}, False)
    assert parse_arguments("") == ({}, False)
    assert parse_arguments("[1, 2]") == ({"_raw": "[1, 2]"}, True)
    assert parse_arguments({"b": 2}) == ({"b": 2}, False)


def test_cli_export_and_merge(tmp_path):
    base = tmp_path / "results"
    t1 = make_results(base, "circle_packing", "maximize", "middle")
    t2 = make_results(base, "tsp", "minimize", "late")
    exe = [sys.executable, "-m", "sftree", "export-sft", "--granularity", "step"]  # the config's: merged
    merge = [sys.executable, "-m", "sftree", "merge-sft"]
    for task, tdir in (("circle_packing", t1), ("tsp", t2)):
        pf = paths_file(tdir)
        res = subprocess.run(
            exe + ["--paths", str(pf), "--out", str(base / task / "sft.jsonl")],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
    inputs = [str(base / t / "sft.jsonl") for t in ("circle_packing", "tsp")]
    res = subprocess.run(
        merge
        + [
            *inputs,
            "--out",
            str(base / "sft.jsonl"),
            "--dataset-info",
            str(base / "dataset_info.json"),
            "--card",
            str(base / "dataset_card.md"),
            "--llamafactory-out",
            str(base / "sft_llamafactory.jsonl"),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    lines = (base / "sft.jsonl").read_text().splitlines()
    assert len(lines) == 22 and (base / "sft.jsonl").stat().st_mode & 0o777 == 0o644
    # each export writes its counts beside its file; the merge sums them
    one = json.loads((base / "tsp" / "sft.stats.json").read_text())
    assert (one["tasks"], one["records"], one["excluded"], one["granularity"]) == (
        ["tsp"],
        11,
        {"malformed_arguments": 1},
        "step",
    )
    merged = json.loads((base / "sft.stats.json").read_text())
    assert (merged["records"], merged["excluded"], merged["backends"]) == (
        22,
        {"malformed_arguments": 2},
        {"unknown": 22},
    )
    assert merged["merge"]["records"] == 22 and merged["merge"]["missing_stats"] == []
    info = json.loads((base / "dataset_info.json").read_text())
    assert (
        info["sftree"]["file_name"] == "sft_llamafactory.jsonl" and info["sftree"]["formatting"] == "openai"
    )
    assert (
        info["sftree"]["tags"]["observation_tag"] == "tool" and info["sftree"]["columns"]["tools"] == "tools"
    )
    card = (base / "dataset_card.md").read_text()
    assert "| circle_packing | 0 | 11 | 0 | 0 | 11 |" in card and "| tsp | 0 | 0 | 11 | 0 | 11 |" in card
    assert (
        "2 ill-formed steps on the selected paths are never a trained completion: truncated 0, "
        "text_tool_call 0, malformed_arguments 2, normalised 0." in card
    )
    assert "(2 such messages in the prompts written here, `metadata.history_excluded`)" in card
    assert (
        "**22 records were NOT made by OpenCode**" in card and "Agent backend: unknown: 22 records." in card
    )
    assert "Teacher's world (`metadata.coral`): stand-in: 22 records" in card
    # tool -> user boundaries per task: e1 t2s1, t2s2 one each; e2 (forked at e1's end: a second boundary)
    # t1s1, t1s2 two each, t2s2 three; e3 t1 two each, t2 three each -> 19 in 9 records
    assert "(38 times in 18 records)" in card
    # maximize: best 3.0 vs root 1.0 -> +2, other path +1; minimize: best (lowest) 2.0 and 1.5 vs 1.0 -> -1, -0.5
    assert "| circle_packing | 2 | 2 | 1.5000 | 2.0000 |" in card
    assert "| tsp | 2 | 0 | -0.7500 | -0.5000 |" in card
    assert 'load_dataset("json"' in card
    lf = [json.loads(x) for x in (base / "sft_llamafactory.jsonl").read_text().splitlines()]
    assert len(lf) == 22 and all(llamafactory_alternates(r["messages"]) for r in lf)
    # the originals do not alternate once a second rollout turn starts (tool result, then user prompt)
    originals = [json.loads(x) for x in lines]
    # per task: e1's two turn-2 steps, and e2's 3 and e3's 4 records (forked after e1's turn boundary)
    assert sum(not llamafactory_alternates(list(typed(r).messages)) for r in originals) == 2 * (2 + 3 + 4)
    t2 = lf[2]["messages"]  # e1 turn 2 step 1: turn 1's last tool result moves into the turn 2 prompt
    assert t2[-3]["role"] == "function_call" and t2[-2] == {
        "role": "user",
        "content": "<tool_response>\nout call_e1_1_2\n</tool_response>\n\ne1 turn 2 prompt",
    }
    assert t2[-1]["role"] == "function_call" and lf[2]["id"] == originals[2]["metadata"]["id"]
    res = subprocess.run(exe + ["--out", str(base / "x.jsonl")], capture_output=True, text=True)
    assert res.returncode == 2 and "--paths" in res.stderr


def _step(finish="tool_calls", notes=None, arguments='{"a": 1}', calls=True):
    resp = {"role": "assistant", "content": "x"}
    if calls:
        resp["tool_calls"] = [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": arguments}}
        ]
    step = {"request": {"messages": []}, "response": resp, "finish_reason": finish}
    if notes is not None:
        step["notes"] = notes
    return step


def test_exclusion_rule_by_hand():
    assert exclusion(_step()) is None
    assert exclusion(_step(finish="stop", calls=False)) is None
    assert exclusion(_step(arguments="")) is None  # empty arguments are {}
    assert exclusion(_step(arguments={"a": 1})) is None  # already an object (an OpenCode record)
    assert exclusion(_step(notes=["reasoning_field"])) is None  # a field's name, not the reply, changed
    assert exclusion(_step(finish="length")) == "truncated"  # whole call, but the reply hit max_tokens
    assert exclusion(_step(finish="length", calls=False)) == "truncated"
    assert exclusion(_step(notes=["truncated_tool_call"], arguments='{"a": ')) == "truncated"
    assert exclusion(_step(notes=["text_tool_calls:hermes"])) == "text_tool_call"
    assert exclusion(_step(notes=["text_tool_calls:json"], calls=False)) == "text_tool_call"
    assert exclusion(_step(arguments='{"a": ')) == "malformed_arguments"
    assert exclusion(_step(arguments="[1]")) == "malformed_arguments"  # JSON, but not an object
    assert exclusion(_step(notes=["legacy_function_call"])) == "normalised"
    assert exclusion(_step(notes=["lone_surrogate_replaced"])) == "normalised"
    assert exclusion(_step(notes=["something_new"])) == "normalised"
    # the first reason that holds is the one counted
    assert exclusion(_step(finish="length", notes=["text_tool_calls:hermes"], arguments="{")) == "truncated"
    assert exclusion(_step(notes=["text_tool_calls:hermes", "legacy_function_call"], arguments="{")) == (
        "text_tool_call"
    )
    assert exclusion(_step(notes=["legacy_function_call"], arguments="{")) == "malformed_arguments"


FAULTS = {"e1": {(1, 2): "length"}, "e2": {(1, 1): "text", (2, 1): "malformed"}}


def test_each_ill_formed_kind_stays_in_the_history_and_is_never_trained(tmp_path):
    tree_dir = make_results(tmp_path / "results", faults=FAULTS)
    pf = paths_file(tree_dir)
    records, stats = export_task([pf], "step")
    for r in records:
        check_record(r)
    assert stats.excluded == {"truncated": 1, "text_tool_call": 1, "malformed_arguments": 1}
    trained = {r["metadata"]["id"].split("/", 2)[2] for r in records}
    bad = {"e1/t1s2", "e2/t1s1", "e2/t2s1"}
    assert len(records) == 12 - 3 and trained.isdisjoint(bad)
    by_id = {r["metadata"]["id"].split("/", 2)[2]: r for r in records}
    steps = {e: read_steps(tree_dir / "edges" / e / "steps.jsonl") for e in ("e1", "e2")}
    for sid in sorted(bad):
        edge, ts = sid.split("/")
        turn, step = int(ts[1]), int(ts[3])
        (s,) = [x for x in steps[edge] if (x.get("turn"), x.get("step"), x["kind"]) == (turn, step, "agent")]
        assert exclusion(s)  # in steps.jsonl, as recorded
        sent, _ = normalize_message(s["response"])
        # the next step of the session holds it exactly as the agent sent it, then its tool result
        later = by_id[f"{edge}/t{turn}s{step + 1}" if step == 1 else f"{edge}/t{turn + 1}s1"]
        assert sent in later["prompt"]
        i = later["prompt"].index(sent)
        assert later["prompt"][i + 1]["tool_call_id"] == sent["tool_calls"][0]["id"]
        assert all(sent not in r["completion"] for r in records)
    # the e1 cut reply is in every later record's history (e1 is everyone's first edge), the others in e2's only
    assert [
        by_id[k]["metadata"]["history_excluded"] for k in ("e1/t2s1", "e2/t1s2", "e2/t2s2", "e3/t2s2")
    ] == [
        1,
        2,
        3,
        1,
    ]
    # path records: both selected paths start with e1, cut before its truncated t1s2: one record, both ranks
    paths, pstats = export_task([pf], "path")
    assert pstats.paths_cut == 2 and pstats.excluded == stats.excluded
    (rec,) = paths
    check_record(rec)
    assert rec["metadata"]["id"].endswith("/e1/t1s1") and rec["metadata"]["path_ranks"] == [1, 2]
    assert rec["metadata"]["cut"] == {"edge": "e1", "turn": 1, "step": 2, "reason": "truncated"}
    assert [m["role"] for m in rec["messages"]] == ["system", "user", "assistant", "tool"]


def test_a_path_that_starts_ill_formed_has_no_record(tmp_path):
    tree_dir = make_results(tmp_path / "results", faults={"e1": {(1, 1): "text"}})
    records, stats = export_task([paths_file(tree_dir)], "path")
    assert records == [] and stats.paths_cut == 2 and stats.skipped == {"no_wellformed_prefix": 2}
    records, stats = export_task([paths_file(tree_dir)], "step")
    assert len(records) == 11 and stats.excluded == {"text_tool_call": 1}


def test_backend_and_coral_in_metadata_and_refuse_native(tmp_path):
    native = make_results(tmp_path / "a", tree_extra={"backend": "native", "coral": {"mode": "installed"}})
    records, stats = export_task([paths_file(native)], "step")
    assert {(r["metadata"]["backend"], r["metadata"]["coral"]) for r in records} == {("native", "installed")}
    assert stats.backends == {"native": 11} and not stats.refused
    records, stats = export_task([paths_file(native)], "step", refuse_native=True)
    assert records == [] and stats.refused == {"native": 11} and stats.records == 0
    assert stats.excluded == {"malformed_arguments": 1}  # still counted
    oc = make_results(
        tmp_path / "b", "tsp", "minimize", tree_extra={"backend": "opencode", "coral": "stand-in"}
    )
    records, stats = export_task([paths_file(oc)], "step", refuse_native=True)
    assert len(records) == 11 and stats.backends == {"opencode": 11} and not stats.refused
    assert {r["metadata"]["coral"] for r in records} == {"stand-in"}
    # an old tree without the field: unknown, refused too (it cannot be shown to be OpenCode's)
    old = {"nodes": [], "edges": []}
    assert (
        tree_backend(Tree.from_doc(old)) == "unknown"
        and tree_coral(Tree.from_doc(old)) == "stand-in"
        and tree_coral(Tree.from_doc({**old, "coral": {}})) == "stand-in"
    )


def test_record_backend_of_a_resumed_tree():
    assert record_backend(None, "native") == "native"
    assert record_backend("opencode", "opencode") == "opencode"
    assert record_backend("native", "opencode") == "mixed"
    assert record_backend("mixed", "native") == "mixed"
    assert record_backend("native", None) == "native"


def test_a_record_breaking_the_schema_is_skipped_and_counted(tree_dir):
    f = tree_dir / "edges" / "e3" / "steps.jsonl"
    lines = [json.loads(x) for x in f.read_text().splitlines()]
    lines[1]["request"]["messages"].insert(1, {"role": "developer", "content": "not a role the schema knows"})
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    records, stats = export_task([paths_file(tree_dir)], "step")
    assert len(records) == 10 and stats.skipped == {"invalid_record": 1}
    assert schema_problem({"prompt": []}).startswith("<top>:")


def test_tool_messages_are_named_after_their_call():
    msgs = [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "function": {"name": "read"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "a", "name": "as-sent", "content": "2"},
        {"role": "tool", "tool_call_id": "zz", "content": "3"},
    ]
    name_tool_messages(msgs)
    assert [m.get("name") for m in msgs[1:]] == ["read", "as-sent", None]


def test_llamafactory_layout_by_hand():
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
    call2 = dict(call, id="c2")
    rec = {
        "prompt": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "P1"},
            {"role": "assistant", "content": "", "tool_calls": [call, call2]},
            {"role": "tool", "tool_call_id": "c1", "name": "bash", "content": "R1"},
            {"role": "tool", "tool_call_id": "c2", "name": "bash", "content": "R2"},
            {"role": "user", "content": "P2"},
        ],
        "completion": [{"role": "assistant", "content": "done"}],
        "tools": [],
        "metadata": RECORD_META,
    }
    lf = llamafactory_record(typed(rec))
    assert [m["role"] for m in lf["messages"]] == ["system", "user", "function_call", "user", "assistant"]
    assert lf["messages"][3]["content"] == (
        "<tool_response>\nR1\n</tool_response>\n<tool_response>\nR2\n</tool_response>\n\nP2"
    )
    assert turn_boundaries(typed(rec)) == 1 and llamafactory_alternates(lf["messages"])
    # results that do not end a rollout turn stay an observation (tool messages, merged by the converter)
    rec["prompt"][-1] = {"role": "assistant", "content": "more"}
    rec["prompt"].append({"role": "user", "content": "P3"})
    lf = llamafactory_record(typed(rec))
    assert [m["role"] for m in lf["messages"]][3:5] == ["tool", "tool"] and turn_boundaries(typed(rec)) == 0


def test_export_stats_round_trip_and_sum():
    a = ExportStats(
        paths=2, records=5, excluded=Counter(truncated=1), backends=Counter(native=5), tasks=["t"]
    )
    a.skipped["no_response"] = 1
    b = ExportStats.from_dict(a.to_dict())
    assert b.to_dict() == a.to_dict()
    b.add(ExportStats(records=3, excluded=Counter(truncated=2, normalised=1), paths_cut=1, tasks=["u"]))
    d = b.to_dict()
    assert (d["records"], d["excluded"], d["paths_cut"], d["tasks"]) == (
        8,
        {"truncated": 3, "normalised": 1},
        1,
        ["t", "u"],
    )
    assert stats_path("r/sft.jsonl") == Path("r/sft.stats.json")
    with pytest.raises(InputError, match="not an export stats file"):
        ExportStats.from_dict({"version": 99})


def test_schema_check_with_seen_messages_matches_the_full_check(tree_dir):
    records, _ = export_task([paths_file(tree_dir)], "step")
    seen: set = set()
    assert all(schema_problem(r) is None and schema_problem(r, seen) is None for r in records)
    assert seen  # the prompts' messages are remembered
    rec = records[-1]  # every message of its prompt is in `seen` now
    broken = []
    for damage in (
        lambda r: r["prompt"][1].update(role="developer"),
        lambda r: r["prompt"][3].pop("name"),  # a tool message without its name
        lambda r: r["prompt"][2].update(extra=1),
        lambda r: r["prompt"][2]["tool_calls"][0]["function"].update(arguments="s"),
        lambda r: r["prompt"][1].update(content=None),
        lambda r: r["completion"][0].update(role="user"),
        lambda r: r.update(prompt="x"),
    ):
        r = json.loads(json.dumps(rec))
        damage(r)
        broken.append(r)
    for r in broken:
        assert schema_problem(r) and schema_problem(r, seen), r["prompt"][:4]
    assert schema_problem(broken[0], seen).startswith("prompt.1.role: 'developer' is not one of")


def test_the_turns_of_an_exported_tree_are_counted_by_how_they_ended(tree_dir):
    """sft.stats.json `turn_ends` (agents/turn_end.py's reasons), summed at merge, for the card."""
    tree = json.loads((tree_dir / "tree.json").read_text())
    tree["edges"][0]["turns"] = [{"turn": 1, "score": 1.5, "ended": "eval"},
                                 {"turn": 2, "score": None, "ended": "no_tool_call"}]  # fmt: skip
    tree["edges"][1]["turns"] = [{"turn": 1, "score": None, "ended": "cut_call"}]
    (tree_dir / "tree.json").write_text(json.dumps(tree))
    _records, stats = export_task([paths_file(tree_dir)], "step")
    assert stats.turn_ends == {"eval": 1, "no_tool_call": 1, "cut_call": 1}
    again = ExportStats.from_dict(stats.to_dict())
    again.add(stats)
    assert again.turn_ends == {"eval": 2, "no_tool_call": 2, "cut_call": 2}
