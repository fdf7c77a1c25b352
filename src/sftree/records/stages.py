"""`stages.tsv`: one row per candidate snapshot of a task's Student run, as select-roots split the run into stages
and picked the roots (docs/select_roots.md, docs/outputs.md). select-roots writes it (`write_stages`) at
`results/<task>/stages.tsv`; the report and the trust figures (dataset card) read it (`read_stages`). Only this
module opens it.

Readers get a frozen, typed `StageRow` per row and read its fields. The writer takes the table column by column
(`StageTable`): a long run has 100k rows, and select-roots builds each column in C from its selection, where an
object per row would double the cost of writing the table (docs/benchmarks.md, "stages.tsv text"). The reader
checks the header and every cell, so a wrong file fails naming itself, the row and the column.

The format, as select-roots has always written it: a header of `COLUMNS`, then tab-separated cells, one row per
line, each line ending in a newline. Integers as `str` writes them, floats as `repr` (empty: none), booleans
`true`/`false`, free text with its tabs and newlines made spaces (empty: none).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

from sftree.errors import InputError
from sftree.fileio import gc_paused, write_text_atomic
from sftree.jsontypes import JSONValue

STAGES_NAME = "stages.tsv"

Stage = Literal["early", "middle", "late"]
STAGE_NAMES: tuple[Stage, ...] = get_args(Stage)  # in run order (roots/stages.py splits a run into these)


def stages_path(task_dir: str | os.PathLike[str]) -> Path:
    """results/<task>/stages.tsv."""
    return Path(task_dir) / STAGES_NAME


def task_tables(results: str | os.PathLike[str]) -> list[Path]:
    """The stages tables of a results folder, one per task (`<task>/stages.tsv`), in name order."""
    return sorted(Path(results).glob(f"*/{STAGES_NAME}"))


@dataclass(frozen=True, slots=True)
class StageRow:
    """One candidate snapshot (a row), its fields in the file's column order."""

    snapshot: str  # the snapshot folder's name (a chosen one is also its root's name)
    global_index: int  # Coral's global eval index: the run's order
    agent_id: str
    commit_hash: str
    eval_count: int | None
    eval_ok: bool  # false: a failed eval, never a root
    status: str  # the attempt record's status as text ("" when it had none)
    score: float | None  # the raw score; None: missing, null or non-finite
    score_for_stage: float  # the score, else the nearest earlier (else later) one: what the split used
    smooth_score: float  # the moving average, in the task's own units
    gain_ratio: float | None  # None when the run was split by time position
    stage: Stage
    stage_method: str  # gain | time | per-island
    selected: bool  # chosen as a root
    selection_reason: str | None  # why it was chosen (quota, refill:<stage>); None when it was not


COLUMNS = tuple(f.name for f in fields(StageRow))


@dataclass(frozen=True)
class StageTable:
    """A whole table to write, one sequence per column (each as long as the table), in `COLUMNS` order.

    Cell values are what the `StageRow` fields hold, but `status` may be any JSON value (written as text) and a
    float column may hold an int (written as `repr` writes it)."""

    snapshot: Sequence[str]
    global_index: Sequence[int]
    agent_id: Sequence[str]
    commit_hash: Sequence[str]
    eval_count: Sequence[int | None]
    eval_ok: Sequence[bool]
    status: Sequence[JSONValue]
    score: Sequence[float | None]
    score_for_stage: Sequence[float]
    smooth_score: Sequence[float]
    gain_ratio: Sequence[float | None]
    stage: Sequence[str]
    stage_method: Sequence[str]
    selected: Sequence[bool]
    selection_reason: Sequence[str | None]

    @classmethod
    def from_rows(cls, rows: Sequence[StageRow]) -> StageTable:
        """The table of some rows (a small table; select-roots builds its columns directly)."""
        return cls(*([getattr(r, c) for r in rows] for c in COLUMNS))


def _cell(value: object) -> str:
    """Free text from the input must not break the TSV."""
    if value is None:
        return ""
    text = str(value)
    return text.replace("\t", " ").replace("\n", " ") if ("\t" in text or "\n" in text) else text


def stages_text(table: StageTable) -> str:
    """The file's text. One f-string per row, few helper calls: this runs for every snapshot of a run. Scores
    are written by `repr`; free text goes through `_cell` only when it holds a tab or a newline."""
    lines = ["\t".join(COLUMNS)]
    append = lines.append
    for snapshot, index, agent, commit, count, ok, status, score, filled, smooth, gain, stage, method, chosen, reason in zip(
        *(getattr(table, c) for c in COLUMNS), strict=True
    ):  # fmt: skip
        if "\t" in agent or "\n" in agent:
            agent = _cell(agent)
        if "\t" in commit or "\n" in commit:
            commit = _cell(commit)
        if status is None:
            status = ""
        elif type(status) is not str or "\t" in status or "\n" in status:
            status = _cell(status)
        # Float repr is the dearest part of a row; score_for_stage is usually the score itself (same object).
        score_text = "" if score is None else repr(score)
        filled_text = score_text if filled is score else repr(filled)
        append(
            f"{snapshot}\t{index}\t{agent}\t{commit}\t"
            f"{'' if count is None else count}\t{'true' if ok else 'false'}\t"
            f"{status}\t{score_text}\t{filled_text}\t{smooth!r}\t{'' if gain is None else repr(gain)}\t"
            f"{stage}\t{method}\t{'true' if chosen else 'false'}\t{reason or ''}"
        )
    append("")
    return "\n".join(lines)


def write_stages(path: str | os.PathLike[str], table: StageTable) -> None:
    """Write the table atomically (a reader sees the old table or the new one, never half of one)."""
    write_text_atomic(path, stages_text(table))


# --- the reader -----------------------------------------------------------------------------------------

_BOOLS = {"true": True, "false": False}


def _opt_int(cell: str) -> int | None:
    return None if cell == "" else int(cell)


def _opt_float(cell: str) -> float | None:
    return None if cell == "" else float(cell)


def _stage(cell: str) -> Stage:
    for s in STAGE_NAMES:
        if cell == s:
            return s
    raise ValueError(cell)


def _opt_text(cell: str) -> str | None:
    return cell or None


# column -> (its cell's parser, raising ValueError or KeyError on a bad cell; what the cell should hold), one per
# `StageRow` field in the file's order (tests/test_records_stages.py holds them to it)
_PARSERS: dict[str, tuple[Callable[[str], Any], str]] = {
    "snapshot": (str, "text"),
    "global_index": (int, "an integer"),
    "agent_id": (str, "text"),
    "commit_hash": (str, "text"),
    "eval_count": (_opt_int, "an integer or nothing"),
    "eval_ok": (_BOOLS.__getitem__, "true or false"),
    "status": (str, "text"),
    "score": (_opt_float, "a number or nothing"),
    "score_for_stage": (float, "a number"),
    "smooth_score": (float, "a number"),
    "gain_ratio": (_opt_float, "a number or nothing"),
    "stage": (_stage, " or ".join(STAGE_NAMES)),
    "stage_method": (str, "text"),
    "selected": (_BOOLS.__getitem__, "true or false"),
    "selection_reason": (_opt_text, "text"),
}


def read_stages(path: str | os.PathLike[str]) -> list[StageRow]:
    """Every row of a stages table, checked: the header must be `COLUMNS` and every cell what its column holds,
    else an InputError naming the file, the row (and its line) and the column. A run's 100k rows are parsed column
    by column (`map` over each, in C), the collector paused: nothing read here is in a cycle."""
    lines = _row_lines(path)
    if not lines:
        return []
    with gc_paused():
        cells = [line.split("\t") for line in lines]
        if set(map(len, cells)) != {len(COLUMNS)}:
            n = next(n for n, c in enumerate(cells, 1) if len(c) != len(COLUMNS))
            raise InputError(f"{_row(path, n)}: {len(cells[n - 1])} tab-separated cells, not {len(COLUMNS)}")
        columns = [
            _column(path, name, parse, expected, values)
            for (name, (parse, expected)), values in zip(
                _PARSERS.items(), zip(*cells, strict=True), strict=True
            )
        ]
        return list(map(StageRow, *columns))


def _row_lines(path: str | os.PathLike[str]) -> list[str]:
    """The lines of the table's rows, after its header is checked."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read stages table {path}: {exc}") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    header = lines[0].split("\t") if lines else []
    if header != list(COLUMNS):
        missing = [c for c in COLUMNS if c not in header]
        extra = [c for c in header if c not in COLUMNS]
        raise InputError(
            f"stages table {path}: its header is not select-roots' (columns missing: {missing or 'none'}; "
            f"not known: {extra or 'none'}; the columns, in order: {', '.join(COLUMNS)})"
        )
    return lines[1:]


def _column(
    path: str | os.PathLike[str], name: str, parse: Callable[[str], Any], expected: str, cells: Sequence[str]
) -> list[Any]:
    """One column's cells parsed, or an InputError naming the first bad one."""
    try:
        return list(map(parse, cells))
    except (ValueError, KeyError):
        pass
    for n, cell in enumerate(cells, 1):
        try:
            parse(cell)
        except (ValueError, KeyError):
            raise InputError(
                f"{_row(path, n)}, column {name}: expected {expected}, got {cell!r:.80}"
            ) from None
    raise AssertionError("not reached: the same parser failed on a cell above")


def _row(path: str | os.PathLike[str], n: int) -> str:
    return f"stages table {path}: row {n} (line {n + 1})"
