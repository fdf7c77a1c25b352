"""Whether to trust the data: per root and selected path the signed gain over the root (paths ending below it
flagged), exact-duplicate targets and `export.dedupe`, skipped snapshots and the sandbox mode, in both the
dataset card and the report. Numbers are hand-computed from helpers.export's tree (root score 1.0, leaves n2 = 3.0
and n3 = 1.5)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest
from helpers.export import ROOT, make_results, run_report

from sftree.dataset.export import export_task
from sftree.dataset.merge import merge
from sftree.dataset.select_paths import select_paths
from sftree.fileio import write_json_atomic, write_jsonl_atomic
from sftree.records.paths import PATH_SCORES, PathCounts, Paths, RankedPath, write_paths
from sftree.records.sft import stats_path
from sftree.records.stages import StageRow, StageTable, stages_path, write_stages
from sftree.records.tree import Tree
from sftree.records.trust import read_task, root_trust
from sftree.settings import SelectPathsSettings, schema_defaults


def stage_row(snapshot, index, eval_ok, selected):
    """A middle-stage snapshot of score 1.0, as select-roots writes its row."""
    return StageRow(snapshot, index, "agent-1", "abc", index, eval_ok, "done", 1.0, 1.0, 1.0, None, "middle",
                    "time", selected, "quota" if selected else None)  # fmt: skip


def build(base, sandbox="bwrap", with_stats=False):
    """circle_packing (maximize, tree sandbox recorded, 3 pending snapshots, 2 failed evals) and tsp (minimize,
    nothing recorded): both with the same tree. `with_stats` writes each export's stats file, as export-sft does."""
    files = []
    for task, direction in (("circle_packing", "maximize"), ("tsp", "minimize")):
        tree_dir = make_results(base, task, direction, "middle")
        tree = json.loads((tree_dir / "tree.json").read_text())
        if task == "circle_packing":
            tree["sandbox"] = sandbox
            (tree_dir / "tree.json").write_text(json.dumps(tree))
            meta_file = base / task / "roots" / ROOT / "metadata.json"
            meta_file.write_text(json.dumps(json.loads(meta_file.read_text()) | {"snapshots_pending": 3}))
            rows = [
                stage_row(ROOT if i == 5 else f"eval-{i:06d}", i, i not in (2, 7), i == 5)
                for i in range(1, 9)
            ]
            write_stages(stages_path(base / task), StageTable.from_rows(rows))
        write_paths(
            tree_dir / "paths.json",
            select_paths(Tree.from_doc(tree), schema_defaults(SelectPathsSettings).top_k),
        )
        records, stats = export_task([tree_dir / "paths.json"], "step")
        write_jsonl_atomic(base / task / "sft.jsonl", records)
        if with_stats:
            write_json_atomic(stats_path(base / task / "sft.jsonl"), stats.to_dict())
        files.append(str(base / task / "sft.jsonl"))
    return files


def test_gains_flags_and_sandbox_per_root(tmp_path):
    base = tmp_path / "results"
    build(base)
    cp, tsp = read_task(base / "circle_packing"), read_task(base / "tsp")
    assert (cp.snapshots, cp.failed_evals, cp.pending, cp.sandboxes) == (8, 2, 3, ["bwrap"])
    assert (tsp.snapshots, tsp.failed_evals, tsp.pending, tsp.sandboxes) == (0, 0, None, ["unknown"])
    # maximize: n2 3.0 - 1.0 = +2 (rank 1), n3 1.5 - 1.0 = +0.5
    (r,) = cp.roots
    assert [(p.rank, p.leaf, p.leaf_score, p.gain, p.below_root) for p in r.paths] == [
        (1, "n2", 3.0, 2.0, False),
        (2, "n3", 1.5, 0.5, False),
    ]
    # minimize: lower is better, so the better path is n3 and both end below (above, in raw score) the root
    (r,) = tsp.roots
    assert [(p.rank, p.leaf, p.gain, p.below_root) for p in r.paths] == [
        (1, "n3", -0.5, True),
        (2, "n2", -2.0, True),
    ]
    assert (r.best_gain, r.below_root) == (-0.5, 2)


def test_gain_tie_and_missing_scores():
    tree = {
        "direction": "minimize",
        "nodes": [
            {"id": "n0", "parent": None, "score": 2.0},
            {"id": "n1", "parent": "n0", "score": 2.0},
            {"id": "n2", "parent": "n0", "score": None},
        ],
    }
    ranked = tuple(
        RankedPath(
            rank,
            True,
            leaf,
            "depth_limit",
            (leaf,),
            ("e" + leaf[1:],),
            **dict(zip(PATH_SCORES, (1.0, 1.0, 2.0, 0.5, 2.0, 0.5, 0.7), strict=True)),
        )
        for rank, leaf in ((1, "n1"), (2, "n2"))
    )
    paths = Paths(1, "t", "r", "minimize", 2.0, 6, PathCounts(2, 2, 0), ranked, ())
    r = root_trust("t", "r", Tree.from_doc(tree), paths)
    assert [(p.gain, p.below_root) for p in r.paths] == [(0.0, False), (None, False)]
    assert r.best_gain == 0.0 and r.sandbox == "unknown" and r.root_score == 2.0
    # the root's score unknown: no gain at all, nothing flagged
    tree["nodes"][0]["score"] = None
    unknown = dataclasses.replace(paths, root_score=None)
    assert [p.gain for p in root_trust("t", "r", Tree.from_doc(tree), unknown).paths] == [None, None]


def test_card_shows_gains_duplicates_and_skipped(tmp_path):
    base = tmp_path / "results"
    files = build(base)
    card_file = tmp_path / "card.md"
    stats = merge(files, str(tmp_path / "sft.jsonl"), None, str(card_file), results=str(base))
    card = card_file.read_text()
    # per task: 3 distinct targets among 11 records (helpers.export repeats its calls; its malformed step is
    # never trained); both tasks alike -> 19
    assert (stats.records, stats.duplicates, stats.dropped) == (22, 19, 0)
    assert (
        "Duplicate trained messages (the same message, tool-call ids aside, as one an earlier record trains; "
        "counted per trained message in every form): 19; kept" in card
    )
    assert "| circle_packing | 8 | 2 | 3 | bwrap |" in card and "| tsp | 0 | 0 | unknown | unknown |" in card
    assert f"| circle_packing | {ROOT} | bwrap | 1.0000 | 1 | n2 | 3.0000 | 2.0000 |  |" in card
    assert f"| tsp | {ROOT} | unknown | 1.0000 | 1 | n3 | 1.5000 | -0.5000 | below root |" in card
    assert f"| tsp | {ROOT} | unknown | 1.0000 | 2 | n2 | 3.0000 | -2.0000 | below root |" in card
    assert (
        "2 of 4 selected paths end below their root; 1 of 2 roots have all selected paths below the root"
        in card
    )
    assert "mask_history: true" in card and '.select_columns(["prompt", "completion", "tools"])' in card


def test_dedupe_keeps_the_first_of_each_target(tmp_path):
    base = tmp_path / "results"
    files = build(base)
    stats = merge(files, str(tmp_path / "sft.jsonl"), None, str(tmp_path / "card.md"), dedupe=True)
    kept = [json.loads(x)["metadata"]["id"] for x in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert (stats.records, stats.duplicates, stats.dropped) == (3, 19, 19)
    prefix = f"circle_packing/{ROOT}"
    assert kept == [f"{prefix}/e1/t1s1", f"{prefix}/e1/t1s2", f"{prefix}/e1/t2s1"]
    assert "removed (`export.dedupe: true`): 19 records left out" in (tmp_path / "card.md").read_text()


@pytest.mark.parametrize("sandbox", ["bwrap", {"mode": "none", "why": "no bwrap on this machine"}])
def test_report_shows_trust(tmp_path, sandbox):
    base = tmp_path / "results"
    files = build(base, sandbox)
    merge(files, str(base / "sft.jsonl"), None, None)
    page = run_report(base, tmp_path / "report.html")
    mode = sandbox if isinstance(sandbox, str) else sandbox["mode"]
    assert "Skipped as roots: 2 failed evals (eval_ok false), 3 pending snapshots" in page
    assert f"Sandbox: {mode}." in page  # the task paragraph (tsp has no stages.tsv, so no paragraph)
    assert f"sandbox {mode}, stop:" in page and "sandbox unknown, stop:" in page  # each tree's summary
    assert page.count("2 selected ending below the root") == 1  # tsp only
    # path rows: root score, leaf score, gain, flag; tsp's two rows are marked
    assert len(re.findall(r'<tr class="sel below">', page)) == 2
    assert (
        '<td class="l">n1 → n3</td><td class="l">depth_limit</td>'
        '<td class="">1</td><td class="">1.5</td><td class="">-0.5</td><td class="">below root</td>' in page
    )
    assert re.search(
        r"Duplicate trained messages \(one an earlier record trains, tool-call ids "
        r"aside\): 19 ",
        page,
    )


def test_cli_merge_dedupe_flag(tmp_path):
    base = tmp_path / "results"
    files = build(base)
    out = tmp_path / "sft.jsonl"
    res = subprocess.run(
        [sys.executable, "-m", "sftree", "merge-sft", *files, "--out", str(out)]
        + ["--card", str(tmp_path / "card.md"), "--results", str(base), "--dedupe"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert (
        len(out.read_text().splitlines()) == 3
        and "19 duplicate trained messages (19 records dropped)" in res.stderr
    )
    assert "| circle_packing | 8 | 2 | 3 | bwrap |" in (tmp_path / "card.md").read_text()


def test_report_and_card_count_untrained_steps_and_flag_the_backend(tmp_path):
    base = tmp_path / "results"
    page = run_report_after(build(base), base, tmp_path)
    assert "Steps never trained: unknown" in page
    card = (base / "dataset_card.md").read_text()
    assert "Unknown: no export stats file" in card and "No export stats for:" not in card
    base = tmp_path / "again" / "results"
    page = run_report_after(build(base, with_stats=True), base, tmp_path / "again")
    # helpers.export: one malformed step per task (e2 turn 2 step 1)
    assert (
        "Ill-formed steps never trained (kept in the history of later records): 2 (truncated 0, "
        "text_tool_call 0, malformed_arguments 2, normalised 0). Steps skipped: none." in page
    )
    assert (
        "<b>22 records were NOT made by OpenCode</b>" in page
        and "Teacher's world (Coral): stand-in 22" in page
    )
    card = (base / "dataset_card.md").read_text()
    assert "2 ill-formed steps on the selected paths are never a trained completion" in card


def run_report_after(files, base, tmp):
    merge(files, str(base / "sft.jsonl"), None, str(base / "dataset_card.md"), results=str(base))
    return run_report(base, tmp / "report.html")
