"""What the export and the merge counted: `ExportStats` (per task, written beside its SFT file, summed at merge)
and `MergeStats` (the merge's own counts). The file is `records/sft.py`'s (`write_stats`, `read_stats`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sftree.dataset.special_text import SpecialTextStats
from sftree.dataset.student import StudentStats
from sftree.dataset.tree_packed import TreeStats
from sftree.errors import InputError
from sftree.records.sft import EXCLUSION_REASONS, STATS_VERSION, TEACHER_TOKEN_OUTCOMES
from sftree.records.tree import SchemaDoc


@dataclass
class ExportStats:
    """What one export did; written to `<out>.stats.json` (`to_dict`) and summed at merge (`add`)."""

    paths: int = 0
    records: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # steps that cannot be a record, by why
    excluded: Counter[str] = field(
        default_factory=Counter
    )  # ill-formed steps, never trained, by `exclusion` reason
    paths_cut: int = 0  # path records cut before an ill-formed step (path granularity)
    refused: Counter[str] = field(default_factory=Counter)  # records left out by --refuse-native, by backend
    backends: Counter[str] = field(default_factory=Counter)  # records written, by backend
    malformed_arguments: int = 0
    tampered: int = 0  # edges of the exported trees that ended `tampered` (agents/chain.py): never trained
    turn_ends: Counter[str] = field(
        default_factory=Counter
    )  # turns of the exported trees, by `ended` (turn_end.py)
    granularity: str | None = None
    refuse_native: bool = False
    tasks: list[str] = field(default_factory=list)
    student: StudentStats | None = None  # the figures under `export.student`; None: not measured
    special_text: SpecialTextStats | None = (
        None  # records holding control-token text (dataset/special_text.py)
    )
    pretokenized: bool = False  # records carry `input_ids` and `completion_mask` (dataset/pretokenize.py)
    # replies on the selected paths by what their step records keep of the Teacher's tokens (`teacher.logprobs`):
    # kept, absent, misaligned, malformed, not_asked (dataset/export.py `logprobs_kind`)
    teacher_logprobs: Counter[str] = field(default_factory=Counter)
    # `export.teacher_tokens`: trained messages by outcome (same, substituted, rendered, no_tokens, no_ids,
    # misaligned: dataset/teacher_tokens.py); empty when off
    teacher_tokens: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> SchemaDoc:
        return {
            "version": STATS_VERSION,
            "tasks": list(self.tasks),
            "granularity": self.granularity,
            "refuse_native": self.refuse_native,
            "paths": self.paths,
            "records": self.records,
            "excluded": {k: self.excluded[k] for k in EXCLUSION_REASONS if self.excluded[k]}
            | {k: v for k, v in sorted(self.excluded.items()) if k not in EXCLUSION_REASONS},
            "paths_cut": self.paths_cut,
            "skipped": dict(sorted(self.skipped.items())),
            "refused": dict(sorted(self.refused.items())),
            "backends": dict(sorted(self.backends.items())),
            "malformed_arguments": self.malformed_arguments,
            "tampered": self.tampered,
            "turn_ends": dict(sorted(self.turn_ends.items())),
            "student": self.student.to_dict() if self.student else None,
            "special_text": self.special_text.to_dict() if self.special_text else None,
            "pretokenized": self.pretokenized,
            "teacher_logprobs": dict(sorted(self.teacher_logprobs.items())),
            "teacher_tokens": {
                k: self.teacher_tokens[k] for k in TEACHER_TOKEN_OUTCOMES if self.teacher_tokens[k]
            },
        }

    @classmethod
    def from_dict(cls, d: object, source: str = "stats") -> ExportStats:
        if not isinstance(d, dict) or d.get("version") != STATS_VERSION:
            raise InputError(f"{source}: not an export stats file of version {STATS_VERSION}")
        return cls(
            paths=int(d.get("paths") or 0),
            records=int(d.get("records") or 0),
            skipped=Counter(d.get("skipped") or {}),
            excluded=Counter(d.get("excluded") or {}),
            paths_cut=int(d.get("paths_cut") or 0),
            refused=Counter(d.get("refused") or {}),
            backends=Counter(d.get("backends") or {}),
            malformed_arguments=int(d.get("malformed_arguments") or 0),
            tampered=int(d.get("tampered") or 0),
            turn_ends=Counter(d.get("turn_ends") or {}),
            granularity=d.get("granularity"),
            refuse_native=bool(d.get("refuse_native")),
            tasks=list(d.get("tasks") or []),
            student=StudentStats.from_dict(d["student"]) if isinstance(d.get("student"), dict) else None,
            special_text=SpecialTextStats.from_dict(d.get("special_text")),
            pretokenized=bool(d.get("pretokenized")),
            teacher_logprobs=Counter(d.get("teacher_logprobs") or {}),
            teacher_tokens=Counter(d.get("teacher_tokens") or {}),
        )

    def add(self, other: ExportStats) -> None:
        self.paths += other.paths
        self.records += other.records
        self.paths_cut += other.paths_cut
        self.malformed_arguments += other.malformed_arguments
        self.tampered += other.tampered
        for mine, theirs in (
            (self.skipped, other.skipped),
            (self.excluded, other.excluded),
            (self.refused, other.refused),
            (self.backends, other.backends),
            (self.turn_ends, other.turn_ends),
            (self.teacher_logprobs, other.teacher_logprobs),
            (self.teacher_tokens, other.teacher_tokens),
        ):
            mine.update(theirs)
        self.tasks += [t for t in other.tasks if t not in self.tasks]
        if (self.student is None) != (other.student is None):
            raise InputError(
                "export stats of tasks exported with and without export.student cannot be merged"
            )
        if self.student and other.student:
            self.student.add(other.student)
        if self.special_text is None:
            self.special_text = other.special_text
        else:
            self.special_text.add(other.special_text)
        self.pretokenized = self.pretokenized and other.pretokenized
        self.granularity = self.granularity or other.granularity
        self.refuse_native = self.refuse_native or other.refuse_native


@dataclass
class MergeStats:
    records: int = 0  # written
    duplicates: int = 0  # trained messages that an earlier record trains (dataset/dedupe.py)
    dropped: int = 0  # records left out by export.dedupe (every trained message a duplicate)
    untrained: int = 0  # duplicate messages untrained in kept merged records (export.dedupe)
    kept_in_path_records: int = (
        0  # duplicate messages in kept path records (export.dedupe cannot untrain them)
    )
    boundaries: int = 0  # tool -> user boundaries in the written records (moved in the LLaMA-Factory copy)
    boundary_records: int = 0  # written records holding at least one
    export: ExportStats | None = None  # the per-task export stats, summed (None when no input had any)
    missing_stats: list[str] = field(default_factory=list)  # inputs without a stats file
    # merged-form records left out of the LLaMA-Factory copy: its converter would train every assistant turn of
    # them, the context's too (they train through `tokenized_path`: docs/outputs.md)
    llamafactory_left_out: int = 0
    tree: TreeStats | None = None  # the tree form's figures, summed (None: not written)
