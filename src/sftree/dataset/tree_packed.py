"""The tree form (`export.tree_packed`): the selected paths of one task packed as prefix trees of tokens, so that
every prefix the paths share (OpenCode's system prompt and tools, the root session, the first edges) is processed
once, with loss weights that make the objective exactly the path form's (docs/outputs.md, "The tree form").

Each path is the path form's record (`export.granularity: path`: the whole session, every assistant turn trained),
rendered and tokenized with the Student (`path_tokens`). The paths of a task are sorted by their token ids and
inserted into a trie over token ids; the trie is written depth-first, one line per part:

- `input_ids`: the trie's tokens in depth-first order (a parent always before its children);
- `parent`: the index in the line of the token before it on its branch, -1 for a branch's first token;
- `position_ids`: the token's position in its own path (its depth);
- `loss_weight`: the number of the part's paths in which that token is trained (0: context only).

**Sharing rule**: a trie node is shared by every path whose tokens up to it are the same ids, whatever each path
trains; a token's prediction depends only on the ids before it on its branch, so its loss is the same in every
path through it, and its weight counts the paths that train it. Hence no two tokens of a line have the same parent
and the same id.

**Objective**: the path form's, the sum over paths of the sum of each path's trained-token losses,
`L = sum_p sum_{t trained in p} -log P(t | p before t)`; a line's `sum_i w_i * -log P(id_i | ancestors of i)` is
exactly the `L` of the paths it holds (each token's loss taken from its parent's logits). Divided by `sum_i w_i`
(the paths' trained tokens) it is the token-mean loss a trainer (TRL, transformers) takes over a batch holding
those paths.

The line and its file are `records/tree_packed.py`'s (`TreeLine`, the writer, the reader, `line_problem`); this
module counts what goes in them.

**Parts** (`export.tree_max_tokens`): the paths, sorted by their ids, fill a part in that order until the next one
would pass the cap (a path costs its tokens after the longest prefix it shares with the part's previous path), then
open the next part; each part carries every ancestor its paths need. Neighbours in that order share the longest
prefixes, so a cut loses only the prefix the next part repeats (the card and docs/benchmarks.md give the reuse). A
path longer than the cap alone is dropped and counted (`too_long`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sftree.dataset.pretokenize import Pretokenized, pretokenize
from sftree.dataset.rendering import Student
from sftree.records.tree_packed import (
    TeacherColumn,
    TreeLine,
    iter_tree_lines,
    read_tree_stats,
    write_tree_lines,
    write_tree_stats,
)

DROP_TOO_LONG = "too_long"


@dataclass(frozen=True)
class PathTokens:
    """One path under the Student: its token ids, which of them are trained, and where it comes from."""

    ids: tuple[int, ...]
    trained: tuple[bool, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # export.teacher_tokens: the Teacher's column of each trained token, in order (dataset/teacher_tokens.py)
    teacher: tuple[TeacherColumn, ...] | None = field(default=None, compare=False, hash=False)

    @property
    def n_trained(self) -> int:
        return sum(self.trained)

    @property
    def task(self) -> str | None:
        return self.meta.get("task")

    @classmethod
    def of(
        cls, tokens: Pretokenized, meta: dict[str, Any], teacher: tuple[TeacherColumn, ...] | None = None
    ) -> PathTokens:
        """A path record's tokens (`pretokenize`, or `teacher_tokens` with its columns) and where it comes from
        (its metadata's ids)."""
        keep = ("id", "task", "root", "path_ranks", "path_edges", "leaf", "teacher_tokens")
        return cls(
            tuple(tokens.input_ids),
            tuple(bool(m) for m in tokens.mask),
            {k: meta.get(k) for k in keep},
            teacher,
        )


def path_tokens(student: Student, rec: dict[str, Any]) -> PathTokens:
    """The path record's token ids and trained tokens as the pre-tokenized form has them (`pretokenize`: the
    Student's template, data text as plain text, each trained turn by TRL's prompt-completion rule). The one place
    the tree form tokenizes: a template that renders a turn differently once later turns follow raises
    StudentError (that turn's context would not be the one it is trained in)."""
    return PathTokens.of(pretokenize(student, rec), rec.get("metadata") or {})


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return len(os.path.commonprefix([a, b]))


def split_parts(paths: list[PathTokens], cap: int) -> tuple[list[list[PathTokens]], list[PathTokens]]:
    """(the parts: the paths in sorted order, cut where the next path would take a part past `cap` tokens; the
    paths longer than `cap` alone, left out). A sorted path shares its longest prefix with its predecessor, so
    `len - common_prefix(previous)` is exactly what it adds to the part's trie."""
    parts: list[list[PathTokens]] = []
    too_long: list[PathTokens] = []
    size = 0
    for p in sorted(paths, key=lambda p: p.ids):
        if len(p.ids) > cap:
            too_long.append(p)
            continue
        cost = len(p.ids) - (common_prefix(parts[-1][-1].ids, p.ids) if parts else 0)
        if not parts or size + cost > cap:
            parts.append([p])
            size = len(p.ids)
        else:
            parts[-1].append(p)
            size += cost
    return parts, too_long


@dataclass
class PackedTree:
    """One part's trie, depth-first: `input_ids`, `parent`, `position_ids`, `loss_weight` (docs/outputs.md)."""

    input_ids: list[int] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    loss_weight: list[int] = field(default_factory=list)
    # export.teacher_tokens: a trained node's Teacher column, from the first path that trains it with one (the
    # paths through a node share its context, so a token they train is one reply's, with one distribution)
    teacher: dict[int, TeacherColumn] = field(default_factory=dict)

    @classmethod
    def of(cls, paths: Iterable[PathTokens]) -> PackedTree:
        """The trie of `paths` (inserted in sorted order, so that creation order is a depth-first order)."""
        tree = cls()
        children: dict[tuple[int, int], int] = {}  # (parent index, token id) -> index
        for p in sorted(paths, key=lambda p: p.ids):
            at = -1
            column = iter(p.teacher or ())
            for depth, (tok, trained) in enumerate(zip(p.ids, p.trained, strict=True)):
                node = children.get((at, tok))
                if node is None:
                    node = children[(at, tok)] = len(tree.input_ids)
                    tree.input_ids.append(tok)
                    tree.parent.append(at)
                    tree.position_ids.append(depth)
                    tree.loss_weight.append(0)
                tree.loss_weight[node] += trained and depth > 0  # the first token is never predicted
                if trained and p.teacher is not None:
                    col = next(column)
                    if node not in tree.teacher or tree.teacher[node][0] is None:
                        tree.teacher[node] = col
                at = node
        return tree

    def teacher_columns(self, with_teacher: bool) -> tuple[TeacherColumn, ...] | None:
        """The line's Teacher columns (`export.teacher_tokens`): one per trained node, in line order."""
        if not with_teacher:
            return None
        none: TeacherColumn = (None, (), ())
        return tuple(self.teacher.get(i, none) for i, w in enumerate(self.loss_weight) if w > 0)

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class TreeStats:
    """The tree form's figures (`sft.tree.stats.json`, summed at merge; the card's forms table)."""

    paths: int = 0  # path records packed
    parts: int = 0  # lines written
    processed: int = 0  # tokens of all lines: what a trainer processes
    trained: int = 0  # tokens with a weight > 0 (each trained once)
    objective: int = 0  # sum of weights: the path form's trained tokens
    path_processed: int = 0  # tokens of the path records: what the path form processes
    unsplit: int = 0  # tokens of each task's whole trie, as if no part were cut (the reuse lost to parts)
    longest: int = 0  # the longest part
    max_tokens: int = 0  # the cap (`export.tree_max_tokens`)
    dropped: dict[str, int] = field(default_factory=dict)  # paths left out, by reason
    # export.teacher_tokens: the packed paths' trained replies by outcome (dataset/teacher_tokens.py)
    teacher_tokens: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "paths": self.paths,
            "parts": self.parts,
            "tokens_processed": self.processed,
            "tokens_trained": self.trained,
            "tokens_objective": self.objective,
            "path_tokens_processed": self.path_processed,
            "tokens_unsplit": self.unsplit,
            "longest": self.longest,
            "max_tokens": self.max_tokens,
            "dropped": dict(sorted(self.dropped.items())),
        } | ({"teacher_tokens": dict(sorted(self.teacher_tokens.items()))} if self.teacher_tokens else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TreeStats:
        def n(key: str) -> int:
            return int(d.get(key) or 0)

        return cls(
            n("paths"),
            n("parts"),
            n("tokens_processed"),
            n("tokens_trained"),
            n("tokens_objective"),
            n("path_tokens_processed"),
            n("tokens_unsplit"),
            n("longest"),
            n("max_tokens"),
            {k: int(v) for k, v in (d.get("dropped") or {}).items()},
            {k: int(v) for k, v in (d.get("teacher_tokens") or {}).items()},
        )

    def add(self, o: TreeStats) -> None:
        for k in ("paths", "parts", "processed", "trained", "objective", "path_processed", "unsplit"):
            setattr(self, k, getattr(self, k) + getattr(o, k))
        self.longest, self.max_tokens = max(self.longest, o.longest), max(self.max_tokens, o.max_tokens)
        for k, v in o.dropped.items():
            self.dropped[k] = self.dropped.get(k, 0) + v
        for k, v in o.teacher_tokens.items():
            self.teacher_tokens[k] = self.teacher_tokens.get(k, 0) + v


def _part_meta(task: str | None, part: list[PathTokens], number: int, parts: int) -> dict[str, Any]:
    roots = sorted({str(p.meta.get("root")) for p in part})
    edges = sorted({f"{p.meta.get('root')}/{e}" for p in part for e in p.meta.get("path_edges") or []})
    paths = [
        {
            "id": p.meta.get("id"),
            "root": p.meta.get("root"),
            "path_ranks": p.meta.get("path_ranks"),
            "edges": p.meta.get("path_edges"),
            "tokens": len(p.ids),
            "trained": p.n_trained,
        }
        | ({"teacher_tokens": p.meta["teacher_tokens"]} if p.meta.get("teacher_tokens") is not None else {})
        for p in part
    ]
    return {"task": task, "roots": roots, "paths": paths, "edges": edges, "part": number, "parts": parts}


def pack_paths(paths: list[PathTokens], cap: int, task: str | None) -> tuple[list[TreeLine], TreeStats]:
    """The lines of one task's tree form and their figures."""
    stats = TreeStats(paths=len(paths), max_tokens=cap)
    stats.path_processed = sum(len(p.ids) for p in paths)
    parts, too_long = split_parts(paths, cap)
    if too_long:
        stats.dropped[DROP_TOO_LONG] = len(too_long)
    stats.unsplit = len(PackedTree.of(p for part in parts for p in part))
    lines = []
    for n, part in enumerate(parts, 1):
        for p in part:
            for outcome in p.meta.get("teacher_tokens") or ():
                stats.teacher_tokens[outcome] = stats.teacher_tokens.get(outcome, 0) + 1
        tree = PackedTree.of(part)
        line = TreeLine(
            tuple(tree.input_ids),
            tuple(tree.position_ids),
            tuple(tree.parent),
            tuple(tree.loss_weight),
            _part_meta(task, part, n, len(parts)),
            tree.teacher_columns(any(p.teacher is not None for p in part)),
        )
        lines.append(line)
        stats.parts += 1
        stats.processed += len(line)
        stats.trained += line.trained
        stats.objective += line.objective
        stats.longest = max(stats.longest, len(line))
    return lines, stats


def pack_records(
    records: Iterable[dict[str, Any]], student: Student, cap: int
) -> tuple[list[TreeLine], TreeStats]:
    """One task's path records (the path form's) -> the tree form's lines and figures."""
    paths = [path_tokens(student, r) for r in records]
    return pack_paths(paths, cap, next((p.meta.get("task") for p in paths), None))


# --- files ----------------------------------------------------------------------------------------------


def write_tree_file(out: str, lines: Iterable[TreeLine], stats: TreeStats) -> None:
    """One task's tree-form file and its figures beside it (`sft.tree.stats.json`)."""
    write_tree_lines(out, lines)
    write_tree_stats(out, stats.to_dict())


def merge_tree_files(inputs: list[str], out: str) -> TreeStats:
    """Concatenate the tasks' tree-form files into `out` (each line checked as it is read), their figures summed
    beside it (`sft.tree.stats.json`)."""
    total = TreeStats()
    for f in inputs:
        total.add(TreeStats.from_dict(read_tree_stats(f)))
    write_tree_file(out, (line for f in inputs for line in iter_tree_lines(f)), total)
    return total
