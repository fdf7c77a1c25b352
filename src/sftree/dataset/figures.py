"""The figures of the merged dataset that the card and the report show, counted once: at merge, as each record is
written (`DatasetFigures.add`). The card renders them (dataset/card.py); the merge saves them beside the merged
file (`sft.figures.json`: `records.sft.write_figures`), and the report reads that file instead of reading the
records again.

Only `metadata` and the trained message of each record are looked at, so the merge holds the figures, never the
records, in memory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sftree.dataset.dedupe import Dedupe
from sftree.records.scores import signed_gain
from sftree.records.sft import FIGURES_VERSION, RecordMeta, SftRecord, record_from_doc


def _gain(meta: RecordMeta) -> float | None:
    """The path's best node score minus its root's, oriented so that positive is better."""
    return signed_gain(meta.root_score, meta.max_score, meta.direction)


@dataclass
class DatasetFigures:
    records: int = 0
    messages: int = 0  # every message of every record (prompt + completion, or messages)
    duplicates: int = 0  # trained messages that an earlier written record trains (dataset/dedupe.py)
    malformed: int = 0  # tool-call arguments kept as {"_raw": ...} (`metadata.malformed_arguments`)
    history_excluded: int = 0  # ill-formed replies repeated in prompts (`metadata.history_excluded`)
    granularities: Counter = field(default_factory=Counter)  # in the order first seen
    sandboxes: Counter = field(default_factory=Counter)
    backends: Counter = field(default_factory=Counter)
    corals: Counter = field(default_factory=Counter)
    tokens: Counter = field(default_factory=Counter)  # the Teacher server's `usage`, summed
    tools: Counter = field(default_factory=Counter)  # tool calls in each record's last assistant message
    by_task_stage: Counter = field(default_factory=Counter)  # (task, stage) -> records
    roots: dict = field(default_factory=dict)  # (task, root) -> {stage, records, tokens, completion}
    paths: dict = field(default_factory=dict)  # (task, root, path rank) -> {gain, path_score}, first record's

    def add(self, rec: SftRecord, duplicate: int = 0) -> None:
        """Count one written record; `duplicate`: how many of its trained messages an earlier record trains."""
        m = rec.metadata
        self.records += 1
        self.duplicates += duplicate
        messages = rec.messages
        self.messages += len(messages)
        for x in [x for x in messages if x.get("role") == "assistant"][-1:]:
            for tc in x.get("tool_calls", []):
                self.tools[tc["function"]["name"]] += 1
        self.sandboxes[str(m.sandbox or "unknown")] += 1
        self.backends[m.backend or "unknown"] += 1
        self.corals[m.coral or "stand-in"] += 1
        self.history_excluded += m.history_excluded
        self.malformed += m.malformed_arguments
        self.granularities[m.granularity] += 1
        task, root, stage = m.task, m.root, m.stage or "unknown"
        self.by_task_stage[(task, stage)] += 1
        row = self.roots.setdefault(
            (task, root), {"stage": stage, "records": 0, "tokens": 0, "completion": 0}
        )
        row["records"] += 1
        usage = m.usage.to_doc()
        row["tokens"] += m.usage.total_tokens
        row["completion"] += m.usage.completion_tokens
        for k, v in usage.items():
            self.tokens[k] += v
        if (task, root, m.path_rank) not in self.paths:
            self.paths[(task, root, m.path_rank)] = {"gain": _gain(m), "path_score": m.path_score}

    @property
    def tasks(self) -> list:
        """The tasks in the order their first record came."""
        return list(dict.fromkeys(task for task, _ in self.roots if task))

    def to_dict(self) -> dict:
        return {
            "version": FIGURES_VERSION,
            "records": self.records,
            "messages": self.messages,
            "duplicates": self.duplicates,
            "malformed": self.malformed,
            "history_excluded": self.history_excluded,
            "granularities": [[k, v] for k, v in self.granularities.items()],
            "sandboxes": dict(self.sandboxes),
            "backends": dict(self.backends),
            "corals": dict(self.corals),
            "tokens": dict(self.tokens),
            "tools": dict(self.tools),
            "by_task_stage": [[t, s, n] for (t, s), n in self.by_task_stage.items()],
            "roots": [[t, r, row] for (t, r), row in self.roots.items()],
            "paths": [[t, r, k, p] for (t, r, k), p in self.paths.items()],
        }


def figures_of(records: list[dict[str, Any]]) -> DatasetFigures:
    """The figures of records already in memory, as written (tests, and a card made without a merge)."""
    out = DatasetFigures()
    dedupe = Dedupe()
    for n, doc in enumerate(records, 1):
        rec = record_from_doc(doc, f"record {n}")
        out.add(rec, dedupe.check(rec)[1])
    return out
