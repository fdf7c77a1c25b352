"""Duplicates of what is trained (dataset/dedupe.py): counted per trained message in every form, so the merged form
finds the step form's duplicates; `export.dedupe` removes them (a merged record keeps its new messages trained and
its duplicates as context; a pre-tokenized record's mask follows). The tree has two selected paths sharing an edge
(helpers.export: e1 -> e2 and e1 -> e3)."""

from __future__ import annotations

import json

import pytest
from helpers.export import make_results
from helpers.student import make_student
from test_export_student import paths_of

from sftree.dataset.export import export_task
from sftree.dataset.merge import merge
from sftree.dataset.pretokenize import pretokenize
from sftree.dataset.student import load_student
from sftree.records.sft import message_target, record_from_doc


def typed(doc):
    """A record as written, typed (records/sft.py's checking reader)."""
    return record_from_doc(doc, "a record")


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def trained_targets(records):
    return [message_target(t.messages[k]) for t in map(typed, records) for k in t.trained]


@pytest.fixture
def pf(tmp_path):
    pf = paths_of(make_results(tmp_path / "results", reasoning=False))
    selected = [p for p in json.loads(pf.read_text())["paths"] if p["selected"]]
    assert [p["edges"][0] for p in selected] == ["e1", "e1"]  # two selected paths share e1
    return pf


def read(path):
    return [json.loads(x) for x in open(path)]


def test_every_form_finds_the_same_duplicates_and_dedupe_removes_them(pf, tmp_path):
    found = {}
    for form in ("step", "merged"):
        records, _ = export_task([pf], form)
        src = write(tmp_path / f"{form}.jsonl", records)
        targets = trained_targets(records)
        kept = merge([src], str(tmp_path / f"all_{form}.jsonl"), None, None)
        found[form] = kept.duplicates
        assert kept.duplicates == len(targets) - len(set(targets)) > 0
        out = tmp_path / f"dedup_{form}.jsonl"
        stats = merge([src], str(out), None, str(tmp_path / f"card_{form}.md"), dedupe=True)
        after = trained_targets(read(out))
        assert sorted(after) == sorted(set(targets))  # each trained message once
        assert "removed (`export.dedupe: true`)" in (tmp_path / f"card_{form}.md").read_text()
        if form == "merged":
            assert stats.untrained > 0 and any("untrained_duplicates" in r["metadata"] for r in read(out))
    assert found["step"] == found["merged"]


def test_path_records_sharing_an_edge_train_it_twice_and_are_counted(pf, tmp_path):
    records, _ = export_task([pf], "path")
    assert len(records) == 2
    shared = [m for m in records[0]["messages"] if m in records[1]["messages"] and m["role"] == "assistant"]
    assert shared
    stats = merge(
        [write(tmp_path / "p.jsonl", records)], str(tmp_path / "out.jsonl"), None, None, dedupe=True
    )
    # helpers.export repeats its calls: the first path record trains some twice (kept: a path record trains every
    # turn), the second trains nothing new (left out)
    assert stats.duplicates >= len(shared) and stats.kept_in_path_records > 0
    assert (stats.records, stats.dropped) == (1, 1)


def test_dedupe_keeps_a_pretokenized_mask_true(pf, tmp_path):
    student = load_student(make_student(tmp_path / "student"), 100_000)
    records, _ = export_task([pf], "merged", student=student, pretokenized=True)
    out = tmp_path / "out.jsonl"
    stats = merge([write(tmp_path / "m.jsonl", records)], str(out), None, None, dedupe=True)
    assert stats.untrained > 0
    for r in read(out):
        assert pretokenize(student, r).row() == {
            "input_ids": r["input_ids"],
            "completion_mask": r["completion_mask"],
        }
        assert sum(r["completion_mask"]) == r["metadata"]["student_tokens"]["completion_tokens"]
