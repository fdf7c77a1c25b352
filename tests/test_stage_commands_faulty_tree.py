"""The stage commands by hand on a tree grown under injected Teacher faults: failed attempts, a malformed tool
call and a failed turn must flow through select-paths, export-sft and the report without breaking the format."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
import yaml
from helpers.tree_rules import check_paths, check_tree

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "workflow/schemas/sft_record.schema.json").read_text())
SFTREE = [sys.executable, "-m", "sftree"]

FAULTS = [
    {"match": {"edge": "e1", "turn": 1}, "fault": "malformed_args", "count": 1},  # one bad JSON string
    {"match": {"edge": "e2"}, "fault": "no_eval"},  # depth-1 direction fails, retried once from the root
    {"match": {"edge": "e3"}, "fault": "no_eval"},
]


def sftree(*args: str, cwd: Path) -> None:
    res = subprocess.run([*SFTREE, *args], capture_output=True, text=True, cwd=cwd, timeout=300)
    assert res.returncode == 0, f"sftree {args[0]} failed:\n{res.stderr[-3000:]}"


@pytest.mark.slow
def test_faulty_tree_exports_cleanly(tmp_path, example_snapshots_dir):
    config = yaml.safe_load((REPO / "examples/demo.yaml").read_text())
    for task in config["tasks"].values():
        task["coral_task"] = str(REPO / task["coral_task"])
    config["teacher"]["sim"] = {"seed": 0, "script": FAULTS}
    config["agent"]["backend"] = "native"  # the workflow's handling of faults is under test: the fast backend
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    res = tmp_path / "results" / "circle_packing"
    sftree(
        "select-roots", "--snapshots", str(example_snapshots_dir / "circle_packing"), "--out", str(res / "roots"),
        "--table", str(res / "stages.tsv"), "--plot", str(res / "report" / "stages.svg"), "--task", "circle_packing",
        "--direction", "maximize", "--num-roots", "1", "--smooth-window", "5", "--link", "copy", cwd=tmp_path,
    )  # fmt: skip
    (root,) = [p for p in (res / "roots").iterdir() if (p / "metadata.json").is_file()]
    tree_dir = res / "trees" / root.name
    sftree(
        "explore",
        "--root",
        str(root),
        "--out",
        str(tree_dir),
        "--config",
        str(tmp_path / "config.yaml"),
        cwd=tmp_path,
    )
    sftree(
        "select-paths",
        "--tree",
        str(tree_dir / "tree.json"),
        "--out",
        str(tree_dir / "paths.json"),
        cwd=tmp_path,
    )
    sftree(
        "export-sft",
        "--paths",
        str(tree_dir / "paths.json"),
        "--out",
        str(res / "sft.jsonl"),
        "--granularity",
        "step",
        cwd=tmp_path,
    )
    sftree(
        "merge-sft", str(res / "sft.jsonl"), "--out", str(tmp_path / "results" / "sft.jsonl"),
        "--dataset-info", str(tmp_path / "results" / "dataset_info.json"), cwd=tmp_path,
    )  # fmt: skip
    sftree(
        "report", "--results", str(tmp_path / "results"), "--out", str(tmp_path / "report.html"), cwd=tmp_path
    )

    tree = json.loads((tree_dir / "tree.json").read_text())
    assert check_tree(tree) + check_paths(tree, json.loads((tree_dir / "paths.json").read_text())) == []
    edges = {e["id"]: e for e in tree["edges"]}
    nodeless = [e for e in tree["edges"] if not e.get("child")]
    assert edges["e2"]["child"] is None and nodeless, (
        "the no_eval fault should leave an attempt without a node"
    )
    # the root's fallback retry is kept even though it failed: its node has no score, so paths through it are out
    kept = [e for e in tree["edges"] if e.get("child") and any(t.get("score") is None for t in e["turns"])]
    no_score = {n["id"] for n in tree["nodes"] if n["parent"] is not None and n.get("score") is None}
    doc = json.loads((tree_dir / "paths.json").read_text())
    assert (
        no_score
        and doc["excluded"]
        and all(any(f"missing score on {n}" in x["reason"] for n in no_score) for x in doc["excluded"])
    )
    assert doc["paths"] and all(set(p["edges"]).isdisjoint(e["id"] for e in nodeless) for p in doc["paths"])

    records = [json.loads(x) for x in (tmp_path / "results" / "sft.jsonl").read_text().splitlines()]
    assert records
    for r in records:
        jsonschema.validate(r, SCHEMA)
        asked = [tc["id"] for m in r["prompt"] if m["role"] == "assistant" for tc in m.get("tool_calls", [])]
        assert Counter(m["tool_call_id"] for m in r["prompt"] if m["role"] == "tool") == Counter(asked)
        assert [m["role"] for m in r["completion"]] == ["assistant"]
    exported_edges = {r["metadata"]["edge"] for r in records}
    assert exported_edges.isdisjoint(e["id"] for e in nodeless)
    assert "e1" in exported_edges  # seed 0: e1 is on the selected paths
    # the malformed call is never trained, but kept raw and flagged in the history of the steps after it
    e1t1 = [r for r in records if r["metadata"]["edge"] == "e1" and r["metadata"]["turn"] == 1]
    assert e1t1 and all("_raw" not in json.dumps(r["completion"]) for r in records)
    raw = [
        tc
        for r in e1t1
        for m in r["prompt"]
        for tc in m.get("tool_calls", [])
        if "_raw" in tc["function"]["arguments"]
    ]
    assert raw and sum(r["metadata"]["malformed_arguments"] > 0 for r in e1t1) >= 1
    assert all(r["metadata"]["history_excluded"] >= 1 for r in e1t1 if r["metadata"]["malformed_arguments"])
    stats = json.loads((res / "sft.stats.json").read_text())
    assert stats["excluded"] == {"malformed_arguments": 1}

    page = (tmp_path / "report.html").read_text()
    assert page.count('<g class="fail">') == len(nodeless)
    assert len(re.findall(r'<line [^>]*stroke-dasharray="6 4"', page)) == len(kept)
    assert len(re.findall(r'data-info="', page)) == len(tree["nodes"])
