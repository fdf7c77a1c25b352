"""The HTML report: self-contained, one drawing per tree with selected paths, failures and node details."""

from __future__ import annotations

import html
import json
import re

from helpers.export import ROOT, make_results, run_report

from sftree.dataset.export import export_task
from sftree.dataset.merge import merge
from sftree.dataset.select_paths import select_paths
from sftree.fileio import write_jsonl_atomic
from sftree.records.paths import write_paths
from sftree.records.stages import StageRow, StageTable, write_stages
from sftree.records.tree import Tree
from sftree.report.html import color_scale
from sftree.settings import SelectPathsSettings, schema_defaults


def stages_tsv(path, chosen):
    """Ten snapshots (early 1-2, middle 3-6, late 7-10; eval 4 failed), `chosen` the roots, as select-roots
    writes them."""
    rows = []
    for i in range(1, 11):
        stage = "early" if i <= 2 else "middle" if i <= 6 else "late"
        ok = i != 4
        score = 1 + 0.1 * i
        rows.append(
            StageRow(
                snapshot=ROOT if i == 5 else f"eval-{i:06d}-agent-1-{i:012x}",
                global_index=i,
                agent_id="agent-1",
                commit_hash="abc",
                eval_count=i,
                eval_ok=ok,
                status="done",
                score=score if ok else None,
                score_for_stage=score,
                smooth_score=score,
                gain_ratio=0.5,
                stage=stage,
                stage_method="gain",
                selected=i in chosen,
                selection_reason="quota" if i in chosen else None,
            )
        )
    write_stages(path, StageTable.from_rows(rows))


def build(tmp_path):
    base = tmp_path / "results"
    tree_dir = make_results(base, "circle_packing", "maximize", "middle")
    tree = json.loads((tree_dir / "tree.json").read_text())
    tree["edges"].append(
        {
            "id": "e5",
            "parent": "n1",
            "child": None,
            "attempt": 1,
            "pruned": True,
            "prune_reason": "no_score",
            "score": None,
        }
    )
    tree["edges"][2]["turns"] = [{"turn": 1, "score": 1.5}, {"turn": 2, "score": None}]  # e3: kept, exempt
    (tree_dir / "tree.json").write_text(json.dumps(tree))
    write_paths(
        tree_dir / "paths.json", select_paths(Tree.from_doc(tree), schema_defaults(SelectPathsSettings).top_k)
    )
    stages_tsv(base / "circle_packing" / "stages.tsv", chosen={5, 8})
    records, _ = export_task([tree_dir / "paths.json"], "step")
    write_jsonl_atomic(base / "circle_packing" / "sft.jsonl", records)
    merge([str(base / "circle_packing" / "sft.jsonl")], str(base / "sft.jsonl"), None, None)
    return base


def test_report_cli(tmp_path):
    base = build(tmp_path)
    out = tmp_path / "report.html"
    page = run_report(base, out)
    # self-contained: no external scripts, styles or images
    assert not re.search(r"""(src|href)=["']https?:""", page) and "<link" not in page
    assert page.count("Student learning curve (maximize)") == 1 and page.count('<svg class="tree"') == 1
    # stage bands early/middle/late, two chosen roots ringed, one failed eval drawn hollow
    assert len(re.findall(r'<rect [^>]*fill="#(1f77b4|2ca02c|ff7f0e)" fill-opacity="0.16"', page)) == 3
    assert len(re.findall(r'<circle [^>]*r="6.0" fill="none" stroke="#f59e0b"', page)) == 2
    assert len(re.findall(r'<path [^>]*stroke="#dc2626" stroke-width="1.6"', page)) == 2  # + legend
    # selected paths n1->n2 (rank 1) and n1->n3 (rank 2): edges e1, e2, e3 highlighted, e4 not
    assert len(re.findall(r'<line [^>]*stroke="#f59e0b" stroke-width="5"', page)) == 3
    # the failed attempt e5 is drawn as a cross with its prune reason
    assert "pruned: no_score" in page and page.count('<g class="fail">') == 1
    # e3 kept despite a failed turn: dashed (and still highlighted as selected)
    assert len(re.findall(r'<line [^>]*stroke="#f59e0b" stroke-width="5" stroke-dasharray="6 4"', page)) == 1
    # every node carries its details; n0's holds the Select breakdown of its dispatches (e1, e4)
    infos = [json.loads(html.unescape(m)) for m in re.findall(r'data-info="([^"]*)"', page)]
    assert sorted(i["node"] for i in infos) == ["n0", "n1", "n2", "n3", "n4"]
    n0 = next(i for i in infos if i["node"] == "n0")
    assert [d["edge"] for d in n0["Select breakdown of dispatches from this node"]] == ["e1", "e4"]
    n2 = next(i for i in infos if i["node"] == "n2")
    assert n2["score"] == 3.0 and n2["tokens (max_token_total)"] == 2000 and n2["on selected path"] is True
    assert n2["made by edge"]["cleanliness"] == 0.8
    # dataset statistics: 11 records (the malformed step is never trained), all middle
    assert (
        "11 records" in page
        and '<td class="l">circle_packing</td><td class="">0</td><td class="">11</td>' in page
    )


def test_color_scale_ends():
    assert color_scale(0.0) == "#440154" and color_scale(1.0) == "#fde725" and color_scale(None) == "#9ca3af"
    assert color_scale(0.5) == "#21918c"


def test_report_without_sft_or_paths(tmp_path):
    base = tmp_path / "results"
    make_results(base)
    out = tmp_path / "r.html"
    page = run_report(base, out)
    assert "No sft.jsonl yet" in page and "No paths.json yet" in page


def test_report_reads_the_figures_the_merge_wrote_not_the_records(tmp_path):
    """The card's figures are counted once, at merge (`sft.figures.json`); the report shows those, so it cannot
    disagree with the card and never reads the records again: the page is the same with the records gone."""
    base = build(tmp_path)
    before = run_report(base, tmp_path / "a.html")
    (base / "sft.jsonl").unlink()
    assert run_report(base, tmp_path / "b.html") == before
    figures = json.loads((base / "sft.figures.json").read_text())
    assert (
        figures["records"] == 11 and f"{figures['records']} records, {figures['messages']} messages" in before
    )
