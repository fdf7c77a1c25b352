"""What the report reads that records/ leaves as open JSON, each through one checked reader: the merged export
stats (`sft.stats.json`), a tree's Teacher record (tree.json `teacher`) and an edge's Select breakdown (tree.json
`edges[].select`). The rendering in report/html.py reads the typed values these give, never the documents.

Each reader takes what an older or partial file may lack as its default (the report shows what it can of a
half-made results folder), and refuses a field of the wrong type with an InputError naming the file and the field
(`records.fields.Fields`) instead of drawing it wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

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
from sftree.records.tree import SchemaDoc, Select

if TYPE_CHECKING:  # the Teacher's own types for its record (the report imports no Teacher code to run)
    from sftree.teacher.client import Incident, TeacherReport, WorkerEvent


def _is_counts(x: Any) -> bool:
    return isinstance(x, dict) and all(is_int(v) for v in x.values())


@dataclass(frozen=True)
class ExportView:
    """What the report shows of the merged export stats (`sft.stats.json`). Read without its version check, so
    that the report shows what it can of any version (dataset/stats.py's `ExportStats` is the stats' full reader,
    in a stage the report may not import)."""

    excluded: dict[str, int] | None  # ill-formed steps never trained, by reason; None: the file does not say
    skipped: dict[str, int]
    refused: dict[str, int]
    missing_stats: list[str]  # inputs of the merge without a stats file
    paths_cut: int
    granularity: str | None

    @classmethod
    def from_doc(cls, doc: SchemaDoc, where: str) -> ExportView:
        """The view of a stats document read from `where`: a field it lacks (or holds null) reads as none."""
        f = Fields(doc, where, "the export stats")
        merge = Fields(f.opt("merge", optional(is_object), "an object") or {}, f.at("merge"))

        def counts(key: str) -> dict[str, int]:
            found: dict[str, int] | None = f.opt(key, optional(_is_counts), "an object of counts")
            return found or {}

        return cls(
            excluded=counts("excluded") if "excluded" in doc else None,
            skipped=counts("skipped"),
            refused=counts("refused"),
            missing_stats=merge.opt("missing_stats", optional(is_strs), "a list of strings") or [],
            paths_cut=f.opt("paths_cut", optional(is_int), "an integer") or 0,
            granularity=f.opt("granularity", optional(is_str), "a string or null"),
        )


def teacher_report(doc: object, where: str) -> TeacherReport | None:
    """tree.json `teacher` (the Teacher client's `report()`), checked; None when the tree records none. A counter
    or flag that an older tree lacks reads as 0 or false, absent incidents and worker events as none; each
    incident and event present must be whole, as the client writes it."""
    if doc is None:
        return None
    f = Fields(doc, where)

    def count(key: str) -> int:
        n: int | None = f.opt(key, is_int, "an integer")
        return n or 0

    def flag(key: str) -> bool:
        return f.opt(key, is_bool, "true or false") is True

    def items(key: str) -> list[Fields]:
        found: list[object] = f.opt(key, is_list, "a list") or []
        return [Fields(x, f"{f.at(key)}[{i}]") for i, x in enumerate(found)]

    return {
        "requests": count("requests"),
        "retries": count("retries"),
        "prompt_tokens": count("prompt_tokens"),
        "completion_tokens": count("completion_tokens"),
        "cached_tokens": count("cached_tokens"),
        "stalls": count("stalls"),
        "cut_streams": count("cut_streams"),
        "worker_down_aborts": count("worker_down_aborts"),
        "failed_attempts": count("failed_attempts"),
        "incidents": [_incident(i) for i in items("incidents")],
        "worker_events": [_worker_event(e) for e in items("worker_events")],
        "stream": flag("stream"),
        "router": flag("router"),
    }


def _incident(f: Fields) -> Incident:
    return {
        "at": f.get("at", is_str, "a string"),
        "request": f.get("request", is_int, "an integer"),
        "label": f.get("label", is_str, "a string"),
        "attempt": f.get("attempt", is_int, "an integer"),
        "kind": f.get("kind", is_str, "a string"),
        "waited_s": f.get("waited_s", is_num, "a number"),
        "detail": f.get("detail", is_str, "a string"),
    }


def _worker_event(f: Fields) -> WorkerEvent:
    return {
        "at": f.get("at", is_str, "a string"),
        "worker": f.get("worker", is_str, "a string"),
        "healthy": f.get("healthy", is_bool, "true or false"),
        "healthy_workers": f.get("healthy_workers", is_int, "an integer"),
        "workers": f.get("workers", is_int, "an integer"),
    }


SELECT_PARTS = ("score_rank", "best_rank", "process", "Q", "T", "select")  # Select's numbers (with `node`)


def select_breakdown(doc: object, where: str) -> Select | None:
    """An edge's `select` (the Select breakdown logged when it was dispatched), checked; None when the edge has
    none (an edge of a partial tree). The document itself is what comes back, its keys in the file's order: the
    report shows it as the JSON it is."""
    if doc is None:
        return None
    f = Fields(doc, where)
    f.get("node", is_str, "a string")
    for key in SELECT_PARTS:
        f.get(key, is_num, "a number")
    return cast(Select, doc)
