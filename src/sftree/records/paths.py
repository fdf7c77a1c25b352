"""`paths.json`: one tree's ranked root-to-leaf paths (docs/architecture.md, "paths.json"). select-paths writes it
beside the tree's `tree.json`; export, the trust figures and the report read it. Only this module opens it.

Readers get a frozen, typed `Paths` (`read_paths`; `Paths.from_doc` for a document already in memory) and read its
attributes; select-paths builds the same value and `write_paths` writes it (`Paths.to_doc`: the keys in the
documented order). There is no JSON Schema for it: `from_doc` checks every field a reader relies on, so a wrong
file fails naming itself and the field instead of reading as "no paths".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from sftree.errors import InputError
from sftree.fileio import read_json, write_json_atomic
from sftree.records.fields import (
    Fields,
    is_bool,
    is_int,
    is_list,
    is_num,
    is_object,
    is_str,
    is_strs,
    optional,
)
from sftree.records.tree import DIRECTIONS, LEAF_REASONS, Direction, LeafReason, SchemaDoc

PATHS_NAME = "paths.json"
PATHS_VERSION = 1


def paths_path(tree_dir: str | os.PathLike[str]) -> Path:
    """TREEDIR/paths.json."""
    return Path(tree_dir) / PATHS_NAME


@dataclass(frozen=True, kw_only=True)
class PathScores:
    """The seven figures of seed section 3.4 of one path, declared once: a ranked path (`paths[]`) and every SFT
    record made from it (records/sft.py's `RecordMeta`) hold them under these names, in this order."""

    avg_cleanliness: float
    avg_knowledge: float
    avg_score: float
    avg_score_rank: float
    max_score: float
    max_score_rank: float
    path_score: float

    @staticmethod
    def read(f: Fields) -> dict[str, float]:
        """The seven, each checked, as keyword arguments of a subclass's constructor."""
        return {name: f.get(name, is_num, "a number") for name in PATH_SCORES}

    def scores_doc(self) -> dict[str, float]:
        """The seven as written, in their order."""
        return {name: getattr(self, name) for name in PATH_SCORES}


PATH_SCORES = tuple(f.name for f in fields(PathScores))


@dataclass(frozen=True)
class RankedPath(PathScores):
    """One candidate path (`paths[]`): its rank among the tree's candidates, whether it is among the top k, its
    leaf, its logical nodes and edges (root excluded, root-to-leaf order) and the seven fields of section 3.4."""

    rank: int
    selected: bool
    leaf: str
    leaf_reason: LeafReason
    nodes: tuple[str, ...]
    edges: tuple[str, ...]

    @classmethod
    def from_doc(cls, d: Any, where: str) -> RankedPath:
        f = Fields(d, where)
        return cls(
            rank=f.get("rank", is_int, "an integer"),
            selected=f.get("selected", is_bool, "true or false"),
            leaf=f.get("leaf", is_str, "a string"),
            leaf_reason=f.get("leaf_reason", LEAF_REASONS.__contains__, f"one of {', '.join(LEAF_REASONS)}"),
            nodes=tuple(f.get("nodes", is_strs, "a list of strings")),
            edges=tuple(f.get("edges", is_strs, "a list of strings")),
            **PathScores.read(f),
        )

    def to_doc(self) -> SchemaDoc:
        return {
            "rank": self.rank,
            "selected": self.selected,
            "leaf": self.leaf,
            "leaf_reason": self.leaf_reason,
            "nodes": list(self.nodes),
            "edges": list(self.edges),
            **self.scores_doc(),
        }


@dataclass(frozen=True)
class Excluded:
    """A childless non-root node that is not a candidate, and why (`excluded[]`)."""

    leaf: str
    reason: str

    @classmethod
    def from_doc(cls, d: Any, where: str) -> Excluded:
        f = Fields(d, where)
        return cls(leaf=f.get("leaf", is_str, "a string"), reason=f.get("reason", is_str, "a string"))

    def to_doc(self) -> SchemaDoc:
        return {"leaf": self.leaf, "reason": self.reason}


@dataclass(frozen=True)
class PathCounts:
    """`counts`: candidates ranked, how many of them are selected, leaves excluded."""

    candidates: int
    selected: int
    excluded: int

    @classmethod
    def from_doc(cls, d: Any, where: str) -> PathCounts:
        f = Fields(d, where)
        return cls(
            candidates=f.get("candidates", is_int, "an integer"),
            selected=f.get("selected", is_int, "an integer"),
            excluded=f.get("excluded", is_int, "an integer"),
        )

    def to_doc(self) -> SchemaDoc:
        return {"candidates": self.candidates, "selected": self.selected, "excluded": self.excluded}


@dataclass(frozen=True)
class Paths:
    """One tree's paths.json: every candidate path ranked (`paths`, best first), the leaves excluded, and the tree
    they were ranked in (`task`, `root`, `direction`, the root's score)."""

    version: int
    task: str | None
    root: str | None
    direction: Direction
    root_score: float | None
    top_k: int
    counts: PathCounts
    paths: tuple[RankedPath, ...]
    excluded: tuple[Excluded, ...]

    @property
    def selected(self) -> tuple[RankedPath, ...]:
        """The selected paths, best rank first."""
        return tuple(sorted((p for p in self.paths if p.selected), key=lambda p: p.rank))

    @classmethod
    def from_doc(cls, doc: Any, source: str = "paths.json") -> Paths:
        """The typed form of a paths document; InputError naming `source` and the field when one is missing or
        of the wrong type, or the document is from a newer sftree."""
        f = Fields(doc, source, "the paths document")
        version = f.get("version", is_int, "an integer")
        if version > PATHS_VERSION:
            raise InputError(
                f"{source}: paths version {version} is newer than this sftree's ({PATHS_VERSION})"
            )
        return cls(
            version=version,
            task=f.get("task", optional(is_str), "a string or null"),
            root=f.get("root", optional(is_str), "a string or null"),
            direction=f.get("direction", DIRECTIONS.__contains__, " or ".join(DIRECTIONS)),
            root_score=f.get("root_score", optional(is_num), "a number or null"),
            top_k=f.get("top_k", is_int, "an integer"),
            counts=PathCounts.from_doc(f.get("counts", is_object, "an object"), f"{source}: counts"),
            paths=tuple(
                RankedPath.from_doc(p, f"{source}: paths[{i}]")
                for i, p in enumerate(f.get("paths", is_list, "a list"))
            ),
            excluded=tuple(
                Excluded.from_doc(x, f"{source}: excluded[{i}]")
                for i, x in enumerate(f.get("excluded", is_list, "a list"))
            ),
        )

    def to_doc(self) -> SchemaDoc:
        """The document written (docs/architecture.md, "paths.json": keys in that order)."""
        return {
            "version": self.version,
            "task": self.task,
            "root": self.root,
            "direction": self.direction,
            "root_score": self.root_score,
            "top_k": self.top_k,
            "counts": self.counts.to_doc(),
            "paths": [p.to_doc() for p in self.paths],
            "excluded": [x.to_doc() for x in self.excluded],
        }


def write_paths(path: str | os.PathLike[str], paths: Paths) -> None:
    """Write atomically (2-space JSON), so a reader never sees half a file."""
    write_json_atomic(path, paths.to_doc())


def read_paths(path: str | os.PathLike[str]) -> Paths:
    """The typed paths of a file; InputError naming the file (and the field) when it is not JSON or not a paths
    document."""
    return Paths.from_doc(read_json(path, "selected paths file"), f"selected paths file {path}")
