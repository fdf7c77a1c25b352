"""What the report reads that records/ leaves as open JSON (sftree.report.inputs): the export stats, a tree's
Teacher record and an edge's Select breakdown, each through one checked reader. What an older file lacks reads as
its default; a field of the wrong type is an InputError naming the file and the field."""

import json

import pytest
from helpers.export import make_results

from sftree.errors import InputError
from sftree.report.html import render, teacher_section
from sftree.report.inputs import ExportView, select_breakdown, teacher_report

TEACHER = {
    "requests": 41, "retries": 3, "prompt_tokens": 10, "completion_tokens": 5, "cached_tokens": 0, "stalls": 1,
    "cut_streams": 1, "worker_down_aborts": 1, "failed_attempts": 4,
    "incidents": [{"at": "t0", "request": 3, "label": "e2 turn 1", "attempt": 1, "kind": "stall", "waited_s": 0.5,
                   "detail": "no chunk"}],
    "worker_events": [{"at": "t1", "worker": "http://w1", "healthy": False, "healthy_workers": 1, "workers": 2}],
    "stream": True, "router": False,
}  # fmt: skip


def test_a_teacher_record_is_read_whole_and_an_older_one_with_defaults():
    assert teacher_report(TEACHER, "tree.json: teacher") == TEACHER
    assert teacher_report(None, "tree.json: teacher") is None
    old = teacher_report({"requests": 7, "stalls": 1, "failed_attempts": 2}, "tree.json: teacher")
    assert old is not None
    assert (old["cut_streams"], old["incidents"], old["worker_events"], old["stream"]) == (0, [], [], False)
    assert teacher_section(old).startswith(
        '<p class="bad">Teacher: 7 requests; 2 attempt(s) sent again: 1 stalled, 0 cut, 0 abandoned when a '
        "worker went down, 1 other"
    )


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"stalls": "1"}, "tree.json: teacher.stalls: expected an integer, got '1'"),
        ({"stream": 1}, "tree.json: teacher.stream: expected true or false, got 1"),
        ({"incidents": {}}, "tree.json: teacher.incidents: expected a list, got {}"),
        ({"incidents": [{"at": "t0"}]}, "tree.json: teacher.incidents[0].request: missing"),
        ({"worker_events": [dict(TEACHER["worker_events"][0], healthy="no")]},
         "tree.json: teacher.worker_events[0].healthy: expected true or false, got 'no'"),
    ],
)  # fmt: skip
def test_a_wrong_teacher_field_is_named(change, needle):
    with pytest.raises(InputError) as err:
        teacher_report(TEACHER | change, "tree.json: teacher")
    assert str(err.value) == needle
    with pytest.raises(InputError, match="tree.json: teacher: expected a JSON object"):
        teacher_report([], "tree.json: teacher")


def test_the_export_view_reads_what_it_finds():
    view = ExportView.from_doc(
        {"excluded": None, "skipped": {"empty": 2}, "merge": {"missing_stats": ["a"]}, "granularity": "path"},
        "sft.stats.json",
    )
    assert view == ExportView({}, {"empty": 2}, {}, ["a"], 0, "path")
    assert ExportView.from_doc({}, "sft.stats.json").excluded is None  # the file does not say
    with pytest.raises(
        InputError, match=r"sft.stats.json: skipped: expected an object of counts, got \['x'\]"
    ):
        ExportView.from_doc({"skipped": ["x"]}, "sft.stats.json")
    with pytest.raises(InputError, match="sft.stats.json: merge.missing_stats: expected a list of strings"):
        ExportView.from_doc({"merge": {"missing_stats": [1]}}, "sft.stats.json")


def test_a_select_breakdown_is_the_document_itself_checked():
    doc = {
        "T": 0.5,
        "node": "n0",
        "score_rank": 0.5,
        "best_rank": 0.5,
        "process": 0.0,
        "Q": 0.35,
        "select": 0.6,
    }
    assert select_breakdown(doc, "e1") is doc  # its keys in the file's order: the report shows it as JSON
    assert select_breakdown(None, "e1") is None
    with pytest.raises(InputError, match="tree.json: edge e1: select.Q: expected a number, got 'high'"):
        select_breakdown(doc | {"Q": "high"}, "tree.json: edge e1: select")


def test_the_report_names_the_tree_whose_record_is_wrong(tmp_path):
    tree_dir = make_results(tmp_path / "results")
    tree = json.loads((tree_dir / "tree.json").read_text())
    tree["teacher"] = TEACHER | {"failed_attempts": None}
    (tree_dir / "tree.json").write_text(json.dumps(tree))
    with pytest.raises(InputError) as err:
        render(tmp_path / "results")
    assert (
        str(err.value) == f"{tree_dir / 'tree.json'}: teacher.failed_attempts: expected an integer, got None"
    )
