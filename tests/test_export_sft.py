"""SFT export: record format, pairing of tool calls, dedupe of shared edges, metadata, merge outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
from helpers_export import ROOT, llamafactory_alternates, make_results

from sftree.dataset.export import export_task, parse_arguments, record_messages
from sftree.dataset.paths import select_paths
from sftree.errors import InputError
from sftree.fileio import write_json_atomic

SCHEMA = json.loads((Path(__file__).parents[1] / "workflow/schemas/sft_record.schema.json").read_text())


def paths_file(tree_dir: Path, top_k: int = 6) -> Path:
    doc = select_paths(json.loads((tree_dir / "tree.json").read_text()), top_k=top_k)
    write_json_atomic(tree_dir / "paths.json", doc)
    return tree_dir / "paths.json"


def check_record(rec):
    jsonschema.validate(rec, SCHEMA)
    msgs = record_messages(rec)
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
    assert (
        len(records) == 12 and stats.records == 12 and stats.paths == 2
    )  # 3 edges x 4 agent steps, no title
    for r in records:
        check_record(r)
    ids = [r["metadata"]["id"] for r in records]
    assert len(set(ids)) == 12
    edges = [r["metadata"]["edge"] for r in records]
    assert edges == ["e1"] * 4 + ["e2"] * 4 + ["e3"] * 4  # shared e1 once, under the best path
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
    # the next step's prompt is this prompt + this completion + its tool result
    assert records[1]["prompt"] == records[0]["prompt"] + records[0]["completion"] + [
        {"role": "tool", "tool_call_id": "call_e1_1_1", "content": "out call_e1_1_1"}
    ]
    # reasoning kept; malformed arguments kept raw and counted (in its own step and in the next one's history)
    (e2t2s1,) = records[6]["completion"]
    assert e2t2s1["reasoning_content"] == "think first"
    assert e2t2s1["tool_calls"][0]["function"]["arguments"] == {"_raw": '{"command": "ls'}
    assert [r["metadata"]["malformed_arguments"] for r in records[4:8]] == [0, 0, 1, 1]
    assert stats.malformed_arguments == 2


def test_path_records(tree_dir):
    records, _ = export_task([paths_file(tree_dir)], "path")
    assert len(records) == 2
    for r in records:
        check_record(r)
    best, second = records
    assert best["metadata"]["granularity"] == "path" and best["metadata"]["edge"] == "e2"
    assert (best["metadata"]["turn"], best["metadata"]["step"]) == (2, 2)
    # whole session: system + 2 edges x 2 turns x (user + 2 x (assistant + tool))
    assert len(best["messages"]) == 1 + 4 * 5
    assert best["messages"][-1]["content"] == "out call_e2_2_2"
    assert second["metadata"]["leaf"] == "n3" and second["metadata"]["path_rank"] == 2


def test_top_k_limits_export(tree_dir):
    records, stats = export_task([paths_file(tree_dir, top_k=1)], "step")
    assert stats.paths == 1 and [r["metadata"]["edge"] for r in records] == ["e1"] * 4 + ["e2"] * 4


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
    assert len(records) == 11 and stats.skipped == {"unpaired_tool_calls": 1, "no_response": 1}


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
    exe = [sys.executable, "-m", "sftree", "export-sft"]
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
        exe
        + [
            "--merge",
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
    assert len(lines) == 24 and (base / "sft.jsonl").stat().st_mode & 0o777 == 0o644
    info = json.loads((base / "dataset_info.json").read_text())
    assert (
        info["sftree"]["file_name"] == "sft_llamafactory.jsonl" and info["sftree"]["formatting"] == "openai"
    )
    assert (
        info["sftree"]["tags"]["observation_tag"] == "tool" and info["sftree"]["columns"]["tools"] == "tools"
    )
    card = (base / "dataset_card.md").read_text()
    assert "| circle_packing | 0 | 12 | 0 | 0 | 12 |" in card and "| tsp | 0 | 0 | 12 | 0 | 12 |" in card
    # maximize: best 3.0 vs root 1.0 -> +2, other path +1; minimize: best (lowest) 2.0 and 1.5 vs 1.0 -> -1, -0.5
    assert "| circle_packing | 2 | 2 | 1.5000 | 2.0000 |" in card
    assert "| tsp | 2 | 0 | -0.7500 | -0.5000 |" in card
    assert 'load_dataset("json"' in card
    lf = [json.loads(x) for x in (base / "sft_llamafactory.jsonl").read_text().splitlines()]
    assert len(lf) == 24 and all(llamafactory_alternates(r["messages"]) for r in lf)
    # the originals do not alternate once a second rollout turn starts (tool result, then user prompt)
    originals = [json.loads(x) for x in lines]
    # per task: e1's two turn-2 steps, and all 4 steps of e2 and e3 (forked after e1's turn boundary)
    assert sum(not llamafactory_alternates(record_messages(r)) for r in originals) == 2 * (2 + 4 + 4)
    t2 = lf[2]["messages"]  # e1 turn 2 step 1: the turn prompt rides on turn 1's last tool result
    assert t2[-2]["role"] == "tool" and t2[-2]["content"].endswith("out call_e1_1_2\n\ne1 turn 2 prompt")
    assert t2[-1]["role"] == "function_call" and lf[2]["id"] == originals[2]["metadata"]["id"]
    res = subprocess.run(exe + ["--out", str(base / "x.jsonl")], capture_output=True, text=True)
    assert res.returncode == 2 and "--paths" in res.stderr
