"""stages.tsv (sftree.records.stages): select-roots writes it through `write_stages`, the report and the trust
figures read typed rows through `read_stages`; a bad table is an InputError naming the file, the row and the
column."""

import dataclasses

import pytest
from helpers.roots import MISSING, make_run

from sftree.cli import main
from sftree.errors import InputError
from sftree.records import stages
from sftree.records.stages import COLUMNS, StageRow, StageTable, read_stages, stages_text, write_stages

ROWS = [
    StageRow("eval-000001-agent-1-aaaaaaaaaaaa", 1, "agent-1", "aaaa", 1, True, "improved", 1.5, 1.5, 1.25, 0.0,
             "early", "gain", False, None),
    StageRow("eval-000002-agent-2-bbbbbbbbbbbb", 2, "agent-2", "bbbb", None, False, "", None, 1.5, 2.0, 0.5,
             "middle", "gain", False, None),
    StageRow("eval-000003-agent-1-cccccccccccc", 3, "agent-1", "cccc", 2, True, "crashed", 3.0, 3.0, 2.75, 1.0,
             "late", "gain", True, "quota"),
]  # fmt: skip
TEXT = (
    "\t".join(COLUMNS) + "\n"
    "eval-000001-agent-1-aaaaaaaaaaaa\t1\tagent-1\taaaa\t1\ttrue\timproved\t1.5\t1.5\t1.25\t0.0\tearly\tgain\tfalse\t\n"
    "eval-000002-agent-2-bbbbbbbbbbbb\t2\tagent-2\tbbbb\t\tfalse\t\t\t1.5\t2.0\t0.5\tmiddle\tgain\tfalse\t\n"
    "eval-000003-agent-1-cccccccccccc\t3\tagent-1\tcccc\t2\ttrue\tcrashed\t3.0\t3.0\t2.75\t1.0\tlate\tgain\ttrue\tquota\n"
)


def test_the_columns_are_the_rows_fields_with_one_parser_each():
    assert COLUMNS == tuple(f.name for f in dataclasses.fields(StageRow))
    assert tuple(stages._PARSERS) == COLUMNS
    assert COLUMNS == tuple(f.name for f in dataclasses.fields(StageTable))


def test_round_trip_and_bytes(tmp_path):
    path = stages.stages_path(tmp_path / "circle_packing")
    path.parent.mkdir()
    write_stages(path, StageTable.from_rows(ROWS))
    assert path.read_text(encoding="utf-8") == TEXT
    assert read_stages(path) == ROWS
    assert stages.task_tables(tmp_path) == [path]
    header_only = tmp_path / "empty.tsv"
    write_stages(header_only, StageTable.from_rows([]))
    assert read_stages(header_only) == []


def test_free_text_cannot_break_the_table():
    table = dataclasses.replace(
        StageTable.from_rows(ROWS[:1]), agent_id=["a\tb"], commit_hash=["c\nd"], status=[{"x": 1}]
    )
    line = stages_text(table).splitlines()[1].split("\t")
    assert (line[2], line[3], line[6]) == ("a b", "c d", "{'x': 1}")
    assert stages_text(dataclasses.replace(table, status=[None])).splitlines()[1].split("\t")[6] == ""


def test_select_roots_writes_what_the_reader_reads(tmp_path):
    snaps = tmp_path / "run" / "circle_packing"
    make_run(snaps, [0, 1, None, 3, MISSING, 5, 6, 7, 8, 9, 10, 10], pending=(1,))
    table = tmp_path / "stages.tsv"
    argv = ["select-roots", "--snapshots", str(snaps), "--out", str(tmp_path / "roots"), "--table", str(table),
            "--direction", "maximize", "--num-roots", "3", "--smooth-window", "1"]  # fmt: skip
    assert main(argv) == 0
    rows = read_stages(table)
    assert len(rows) == 11 and [r.global_index for r in rows] == [1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert sum(r.selected for r in rows) == 3 and all(r.selection_reason for r in rows if r.selected)
    assert [r.score for r in rows[1:4]] == [None, 3, None] and not rows[1].eval_ok
    assert rows[1].score_for_stage == 0 and {r.stage for r in rows} == {"early", "middle", "late"}
    assert stages_text(StageTable.from_rows(rows)) == table.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("column", "bad", "expected"),
    [
        ("global_index", "1.5", "an integer"),
        ("eval_count", "x", "an integer or nothing"),
        ("eval_ok", "True", "true or false"),
        ("score", "high", "a number or nothing"),
        ("score_for_stage", "", "a number"),
        ("smooth_score", "-", "a number"),
        ("gain_ratio", "?", "a number or nothing"),
        ("stage", "final", "early or middle or late"),
        ("selected", "yes", "true or false"),
    ],
)
def test_a_bad_cell_names_file_row_and_column(tmp_path, column, bad, expected):
    lines = TEXT.splitlines()
    cells = lines[2].split("\t")
    cells[COLUMNS.index(column)] = bad
    lines[2] = "\t".join(cells)
    path = tmp_path / "stages.tsv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as err:
        read_stages(path)
    assert str(err.value) == (
        f"stages table {path}: row 2 (line 3), column {column}: expected {expected}, got {bad!r}"
    )


def test_a_wrong_header_or_row_length_is_named(tmp_path):
    path = tmp_path / "stages.tsv"
    path.write_text(TEXT.replace("\teval_count", "", 1))
    with pytest.raises(InputError, match=r"header is not select-roots' \(columns missing: \['eval_count'\]"):
        read_stages(path)
    path.write_text(TEXT + "eval-9\t9\n")
    with pytest.raises(InputError, match=r"row 4 \(line 5\): 2 tab-separated cells, not 15"):
        read_stages(path)
    path.write_text("")
    with pytest.raises(InputError, match="header is not select-roots'"):
        read_stages(path)
    with pytest.raises(InputError, match="cannot read stages table"):
        read_stages(tmp_path / "none.tsv")
