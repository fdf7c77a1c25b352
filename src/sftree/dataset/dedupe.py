"""Duplicates of what is trained (`export.dedupe`, counted at merge whatever the setting).

The unit is the trained message, in every form: a step record's completion, each of a merged record's
`metadata.trained`, each assistant message of a path record. Its key is `records.sft.message_target` (content,
reasoning, tool names and arguments; tool-call ids aside): a trained message whose key an earlier written record
already trains is a duplicate. The step form and the merged form of one export hold the same trained messages, so
they find the same duplicates.

With `dedupe`: a record all of whose trained messages are duplicates is left out; a merged record with some is
kept with those messages untrained (removed from `metadata.trained` and `metadata.steps`, listed in
`metadata.untrained_duplicates`; in a pre-tokenized record their span of `completion_mask` is zeroed and
`student_tokens` lowered by it). A path record trains every assistant turn, so one with some duplicates is kept
whole (counted as `kept_in_path_records`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sftree.records.sft import message_target, record_messages, trained_positions


@dataclass
class Dedupe:
    drop: bool = False  # export.dedupe
    seen: set | None = None
    duplicates: int = 0  # trained messages that an earlier written record already trains
    dropped: int = 0  # records left out (every trained message a duplicate)
    untrained: int = 0  # duplicate messages untrained inside a kept merged record
    kept_in_path_records: int = 0  # duplicate messages inside kept path records (trained again)

    def __post_init__(self) -> None:
        self.seen = set() if self.seen is None else self.seen

    def check(self, rec: dict) -> tuple[dict | None, int]:
        """(the record to write, or None; how many of its trained messages are duplicates)."""
        msgs = record_messages(rec)
        positions = trained_positions(rec)
        keys = [message_target(msgs[k]) for k in positions]
        dup = []
        for key in keys:  # a merged record may train the same message twice: the second is a duplicate
            dup.append(key in self.seen)
            self.seen.add(key)
        n = sum(dup)
        self.duplicates += n
        if not self.drop or not n:
            return rec, n
        if n == len(keys):
            self.dropped += 1
            return None, n
        meta = rec.get("metadata") or {}
        if meta.get("granularity") != "merged":
            self.kept_in_path_records += n
            return rec, n
        self.untrained += n
        return untrain(rec, [i for i, d in enumerate(dup) if d]), n


def untrain(rec: dict, which: list[int]) -> dict:
    """A merged record with its `which`-th trained messages untrained (see the module)."""
    meta = dict(rec["metadata"])
    rec = dict(rec, metadata=meta)
    meta["untrained_duplicates"] = [meta["steps"][i] for i in which]
    meta["trained"] = [t for i, t in enumerate(meta["trained"]) if i not in which]
    meta["steps"] = [s for i, s in enumerate(meta["steps"]) if i not in which]
    if "completion_mask" in rec:
        spans = _runs(rec["completion_mask"])
        mask = list(rec["completion_mask"])
        if len(spans) == len(meta["trained"]) + len(which):
            for i in which:
                a, b = spans[i]
                mask[a:b] = [0] * (b - a)
            rec["completion_mask"] = mask
            if isinstance(meta.get("student_tokens"), dict):
                meta["student_tokens"] = dict(meta["student_tokens"], completion_tokens=sum(mask))
                meta["student_tokens"]["prompt_tokens"] = len(mask) - sum(mask)
    return rec


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """The [start, end) spans of consecutive 1s: one per trained message."""
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out
