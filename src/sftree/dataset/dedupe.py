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

import dataclasses
from dataclasses import dataclass

from sftree.records.sft import MergedRecord, SftRecord, TeacherColumns, Tokens, message_target


@dataclass
class Dedupe:
    drop: bool = False  # export.dedupe
    seen: set[str] | None = None
    duplicates: int = 0  # trained messages that an earlier written record already trains
    dropped: int = 0  # records left out (every trained message a duplicate)
    untrained: int = 0  # duplicate messages untrained inside a kept merged record
    kept_in_path_records: int = 0  # duplicate messages inside kept path records (trained again)

    def __post_init__(self) -> None:
        self.seen = set() if self.seen is None else self.seen

    def check(self, rec: SftRecord) -> tuple[SftRecord | None, int]:
        """(the record to write, or None; how many of its trained messages are duplicates)."""
        seen = self.seen if self.seen is not None else set()
        keys = [message_target(rec.messages[k]) for k in rec.trained]
        dup = []
        for key in keys:  # a merged record may train the same message twice: the second is a duplicate
            dup.append(key in seen)
            seen.add(key)
        n = sum(dup)
        self.duplicates += n
        if not self.drop or not n:
            return rec, n
        if n == len(keys):
            self.dropped += 1
            return None, n
        if not isinstance(rec, MergedRecord):
            self.kept_in_path_records += n
            return rec, n
        self.untrained += n
        return untrain(rec, [i for i, d in enumerate(dup) if d]), n


def untrain(rec: MergedRecord, which: list[int]) -> MergedRecord:
    """A merged record with its `which`-th trained messages untrained (see the module)."""
    meta = rec.metadata
    trained = tuple(t for i, t in enumerate(meta.trained) if i not in which)
    outcomes = meta.teacher_tokens
    meta = dataclasses.replace(
        meta,
        untrained_duplicates=tuple(meta.steps[i] for i in which),
        trained=trained,
        steps=tuple(s for i, s in enumerate(meta.steps) if i not in which),
        teacher_tokens=None
        if outcomes is None
        else tuple(o for i, o in enumerate(outcomes) if i not in which),
    )
    tokens = rec.tokens
    if tokens is not None:
        spans = _runs(list(tokens.completion_mask))
        mask = list(tokens.completion_mask)
        if len(spans) == len(trained) + len(which):
            for i in which:
                a, b = spans[i]
                mask[a:b] = [0] * (b - a)
            tokens = Tokens(tokens.input_ids, tuple(mask), _kept_columns(tokens, mask))
            if meta.student_tokens is not None:
                counts = dataclasses.replace(
                    meta.student_tokens, completion_tokens=sum(mask), prompt_tokens=len(mask) - sum(mask)
                )
                meta = dataclasses.replace(meta, student_tokens=counts)
    return dataclasses.replace(rec, metadata=meta, tokens=tokens)


def _kept_columns(tokens: Tokens, mask: list[int]) -> TeacherColumns | None:
    """The Teacher's columns (`export.teacher_tokens`, one entry per trained token) of the tokens still trained."""
    cols = tokens.teacher
    if cols is None:
        return None
    was = [i for i, m in enumerate(tokens.completion_mask) if m]
    keep = [j for j, i in enumerate(was) if mask[i]]
    return TeacherColumns(
        tuple(cols.logprobs[j] for j in keep),
        tuple(cols.top_ids[j] for j in keep),
        tuple(cols.top_logprobs[j] for j in keep),
    )


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """The [start, end) spans of consecutive 1s: one per trained message."""
    out: list[tuple[int, int]] = []
    start: int | None = None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out
