"""The tree form's file (`sft.tree.jsonl`, one per task and the merged one) and its stats file
(`sft.tree.stats.json` beside it): the line's type, the one writer, the one reader, the format check.

Written by `export-sft` (per task, `export.tree_packed`) and `merge-sft` (all tasks); read by `merge-sft` and the
trainers (docs/outputs.md, "The tree form"). One line per part: `input_ids`, `position_ids`, `parent`,
`loss_weight` (one entry per token, in depth-first order) and `metadata`. The stats file holds the tree form's
figures (`dataset.tree_packed.TreeStats`, which counts them) under `tree`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sftree.errors import InputError
from sftree.fileio import AtomicLines, iter_jsonl, read_json, write_json_atomic

TREE_NAME = (
    "sft.tree.jsonl"  # the merged file in the results folder (per task: results/<task>/sft.tree.jsonl)
)
STATS_VERSION = 1
TOKEN_FIELDS = ("input_ids", "position_ids", "parent", "loss_weight")  # one entry per token, in this order
# `export.teacher_tokens`: one entry per trained token (loss weight > 0), in line order
TEACHER_FIELDS = ("teacher_logprobs", "teacher_top_ids", "teacher_top_logprobs")
# the Teacher's logprob of a trained token (None where it sampled none), its top-K ids and their logprobs
# (shared with the step records' lists: the tree form holds a reply's once, whatever paths train it)
TeacherColumn = tuple[float | None, Sequence[int], Sequence[float]]


@dataclass(frozen=True)
class TreeLine:
    """One part of the tree form: its tokens depth-first (a parent before its children), each token's parent
    (-1: a branch's first token), position in its own path and loss weight (the paths that train it), and where
    the part comes from (task, roots, paths, edges, part number)."""

    input_ids: tuple[int, ...]
    position_ids: tuple[int, ...]
    parent: tuple[int, ...]
    loss_weight: tuple[int, ...]
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    teacher: tuple[TeacherColumn, ...] | None = (
        None  # export.teacher_tokens: per trained token, in line order
    )

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def trained(self) -> int:
        """Tokens with a weight: each trained token once."""
        return sum(w > 0 for w in self.loss_weight)

    @property
    def objective(self) -> int:
        """The sum of the weights: the path form's trained tokens (a token counted once per path that trains it)."""
        return sum(self.loss_weight)

    def to_dict(self) -> dict[str, Any]:
        """The line as written (its fields in the documented order)."""
        doc = {k: list(getattr(self, k)) for k in TOKEN_FIELDS}
        if self.teacher is not None:
            doc |= {
                "teacher_logprobs": [c[0] for c in self.teacher],
                "teacher_top_ids": [list(c[1]) for c in self.teacher],
                "teacher_top_logprobs": [list(c[2]) for c in self.teacher],
            }
        return doc | {"metadata": self.metadata}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TreeLine:
        """A line from its JSON object; ValueError with `line_problem`'s reason when it breaks the format."""
        problem = line_problem(d)
        if problem:
            raise ValueError(problem)
        ids, positions, parents, weights = (tuple(d[k]) for k in TOKEN_FIELDS)
        teacher = None
        if "teacher_logprobs" in d:
            cols = zip(*(d[k] for k in TEACHER_FIELDS), strict=True)
            teacher = tuple((lp, tuple(ids_), tuple(lps)) for lp, ids_, lps in cols)
        return cls(ids, positions, parents, weights, dict(d.get("metadata") or {}), teacher)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def line_problem(line: Any) -> str | None:
    """The first way a tree-form line breaks the format (docs/outputs.md, "The tree form"), or None: lists of one
    length, each parent an earlier token or -1, each position its parent's + 1, no two children of one parent with
    the same id (a prefix processed twice), weights non-negative integers and 0 on a branch's first token."""
    if not isinstance(line, dict) or any(not isinstance(line.get(k), list) for k in TOKEN_FIELDS):
        return f"not an object with the lists {', '.join(TOKEN_FIELDS)}"
    if not isinstance(line.get("metadata", {}), dict):
        return "metadata is not an object"
    n = len(line["input_ids"])
    if any(len(line[k]) != n for k in TOKEN_FIELDS):
        return "lists of different lengths"
    seen = set()
    for i, (tok, pos, par, w) in enumerate(zip(*(line[k] for k in TOKEN_FIELDS), strict=True)):
        if not (_is_int(tok) and tok >= 0):
            return f"token {i}: id {tok!r} is not a non-negative integer"
        if not (_is_int(par) and -1 <= par < i):
            return f"token {i}: parent {par!r} is not an earlier token or -1"
        if pos != (0 if par < 0 else line["position_ids"][par] + 1) or not _is_int(pos):
            return f"token {i}: position {pos!r} is not its parent's + 1"
        if (par, tok) in seen:
            return f"token {i}: a second child of {par} with id {tok} (a prefix processed twice)"
        if not _is_int(w) or w < 0 or (par < 0 and w):
            return f"token {i}: loss weight {w!r} (a branch's first token is never predicted)"
        seen.add((par, tok))
    return _teacher_problem(line)


def _teacher_problem(line: dict[str, Any]) -> str | None:
    """The Teacher's columns (`export.teacher_tokens`): all three or none, one entry per trained token."""
    present = [k for k in TEACHER_FIELDS if k in line]
    if not present:
        return None
    if len(present) != len(TEACHER_FIELDS) or any(not isinstance(line[k], list) for k in TEACHER_FIELDS):
        return f"the lists {', '.join(TEACHER_FIELDS)} go together"
    n = sum(w > 0 for w in line["loss_weight"])
    if any(len(line[k]) != n for k in TEACHER_FIELDS):
        return f"{', '.join(TEACHER_FIELDS)}: one entry per trained token ({n})"
    for i, (lp, ids, lps) in enumerate(zip(*(line[k] for k in TEACHER_FIELDS), strict=True)):
        if lp is not None and not (isinstance(lp, int | float) and not isinstance(lp, bool) and lp <= 0):
            return f"trained token {i}: teacher logprob {lp!r} is not a number <= 0 or null"
        if not isinstance(ids, list) or not isinstance(lps, list) or len(ids) != len(lps):
            return f"trained token {i}: teacher top ids and logprobs are not two lists of one length"
        if not all(_is_int(t) and t >= 0 for t in ids):
            return f"trained token {i}: a teacher top id is not a non-negative integer"
    return None


# --- the lines ------------------------------------------------------------------------------------------


def merged_tree_path(results: str | Path) -> Path:
    """The merged tree-form file of a results folder."""
    return Path(results) / TREE_NAME


def tree_form_path(sft: str | Path) -> Path:
    """The tree form beside an SFT file (`export.tree_packed`): `sft.jsonl` -> `sft.tree.jsonl`."""
    sft = Path(sft)
    return sft.with_name(sft.name.removesuffix(".jsonl") + ".tree.jsonl")


def iter_tree_lines(path: str | Path) -> Iterator[TreeLine]:
    """The lines of a tree-form file, one at a time, each checked (`line_problem`): an InputError names the file,
    the line and what is wrong."""
    for n, d in enumerate(iter_jsonl(path, "tree-form file"), 1):
        try:
            yield TreeLine.from_dict(d)
        except ValueError as exc:
            raise InputError(f"tree-form file {path} line {n}: {exc}") from None


def write_tree_lines(path: str | Path, lines: Iterable[TreeLine]) -> int:
    """Write a tree-form file atomically (renamed into place once every line is written); the lines written."""
    with AtomicLines(path) as out:
        for line in lines:
            out.write(json.dumps(line.to_dict(), ensure_ascii=False))
    return out.count


# --- the stats file -------------------------------------------------------------------------------------


def tree_stats_path(out: str | Path) -> Path:
    """Where the figures of a tree-form file are written: `sft.tree.jsonl` -> `sft.tree.stats.json` beside it."""
    out = Path(out)
    return out.with_name(out.name.removesuffix(".jsonl") + ".stats.json")


def write_tree_stats(out: str | Path, figures: dict[str, Any]) -> None:
    """Write the figures of the tree-form file `out` beside it (`TreeStats.to_dict()`)."""
    write_json_atomic(tree_stats_path(out), {"version": STATS_VERSION, "tree": figures})


def read_tree_stats(out: str | Path) -> dict[str, Any]:
    """The figures of the tree-form file `out` (the `tree` object of its stats file); an InputError naming the
    stats file when it is not one of this version."""
    path = tree_stats_path(out)
    doc = read_json(path, "tree-form stats file")
    if (
        not isinstance(doc, dict)
        or doc.get("version") != STATS_VERSION
        or not isinstance(doc.get("tree"), dict)
    ):
        raise InputError(f"{path}: not a tree-form stats file of version {STATS_VERSION} (a `tree` object)")
    return dict(doc["tree"])
