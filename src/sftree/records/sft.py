"""The SFT record (`sft.jsonl`, one per task and the merged one) and its stats file (`sft.stats.json` beside it):
the typed record of each form (`StepRecord`, `PathRecord`, `MergedRecord`: frozen, their `metadata` a
`RecordMeta`), the one checking reader (`iter_records`, `record_from_doc`), the one writer (`record_writer`), the
schema check, and what a record trains. The tree form's line is records/tree_packed.py's (`TreeLine`).

Written by `export-sft` (per task) and `merge-sft` (all tasks); read by `merge-sft` and the trainers. The report
reads only the stats and the figures the merge writes beside the merged file (`figures_path`), never the records.
Records are OpenAI chat messages (`workflow/schemas/sft_record.schema.json`, docs/outputs.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import jsonschema

from sftree.config import SCHEMA_DIR
from sftree.errors import InputError
from sftree.fileio import AtomicLines, iter_jsonl, read_json, write_json_atomic
from sftree.records.fields import (
    Fields,
    is_int,
    is_ints,
    is_num,
    is_object,
    is_objects,
    is_str,
    is_strs,
    optional,
)
from sftree.records.paths import PathScores
from sftree.records.tree import DIRECTIONS, Direction, SchemaDoc

SFT_NAME = "sft.jsonl"  # the merged file in the results folder (per task: results/<task>/sft.jsonl)
RECORD_SCHEMA = SCHEMA_DIR / "sft_record.schema.json"
STATS_VERSION = 1
FIGURES_VERSION = 1
# Why a step is never a trained completion (`dataset.messages.exclusion`), in the order the reasons are tested and
# reported: the keys of the stats' `excluded`.
EXCLUSION_REASONS = ("truncated", "text_tool_call", "malformed_arguments", "normalised")
# What became of each trained message under `export.teacher_tokens` (dataset/teacher_tokens.py): the values of
# `metadata.teacher_tokens` and the keys of the stats' `teacher_tokens`.
TEACHER_TOKEN_OUTCOMES = ("same", "substituted", "rendered", "no_tokens", "no_ids", "misaligned")
# The backend whose prompts are OpenCode's own context (`metadata.backend`); any other is flagged.
OPENCODE = "opencode"


# --- the records ----------------------------------------------------------------------------------------

Granularity = Literal["step", "path", "merged"]
# Record forms (`export.granularity`; docs/outputs.md): one per step, one per selected path, one per run of steps.
GRANULARITIES: tuple[Granularity, ...] = get_args(Granularity)
# An OpenAI chat message or a tool's schema, JSON as written (the record schema checks it; nothing changes it).
Message = dict[str, Any]


@dataclass(frozen=True)
class TokenCounts:
    """`metadata.usage` (the Teacher server's) or `metadata.student_tokens` (under the Student)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def from_doc(cls, d: Any, where: str) -> TokenCounts:
        f = Fields(d, where)
        return cls(*(f.get(k, _is_count, "a non-negative integer") for k in TOKEN_KEYS))

    def to_doc(self) -> SchemaDoc:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}  # fmt: skip


TOKEN_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


@dataclass(frozen=True)
class Cut:
    """`metadata.cut` of a path record: the path's first ill-formed step, where its record ends, and why."""

    edge: str
    turn: int | None
    step: int | None
    reason: str

    @classmethod
    def from_doc(cls, d: Any, where: str) -> Cut:
        f = Fields(d, where)
        return cls(
            edge=f.get("edge", is_str, "a string"),
            turn=f.get("turn", optional(is_int), "an integer or null"),
            step=f.get("step", optional(is_int), "an integer or null"),
            reason=f.get("reason", is_str, "a string"),
        )

    def to_doc(self) -> SchemaDoc:
        return {"edge": self.edge, "turn": self.turn, "step": self.step, "reason": self.reason}


@dataclass(frozen=True)
class RecordMeta(PathScores):
    """A record's `metadata` (workflow/schemas/sft_record.schema.json; docs/outputs.md): the path and tree it comes
    from, the step it trains, how it was made. Written in one order (`to_doc`), the form's fields where the form
    has them: `cut` a path record's (null when the path is whole), `trained` and `steps` a merged record's."""

    task: str
    root: str
    stage: str | None
    direction: Direction
    root_score: float | None
    sandbox: str | SchemaDoc | None  # the tree's `sandbox` as recorded (a mode, or an object saying why)
    backend: str
    coral: str
    path_rank: int
    leaf: str
    leaf_reason: str | None
    path_nodes: tuple[str, ...]
    path_edges: tuple[str, ...]
    leaf_score: float | None
    gain: float | None
    granularity: Granularity
    path_ranks: tuple[int, ...]
    edge: str
    transcript: str
    turn: int | None
    step: int | None
    kind: str
    usage: TokenCounts
    finish_reason: str | None
    malformed_arguments: int
    history_excluded: int
    id: str
    cut: Cut | None = None  # path form
    trained: tuple[int, ...] = ()  # merged form: the indices of the trained messages
    steps: tuple[str, ...] = ()  # merged form: the ids of the steps trained, in that order
    student_tokens: TokenCounts | None = None  # under the Student (export.student)
    untrained_duplicates: tuple[str, ...] | None = None  # merged form, export.dedupe: the steps untrained
    teacher_tokens: tuple[str, ...] | None = None  # export.teacher_tokens: each trained message's outcome

    @classmethod
    def from_doc(cls, d: Any, where: str) -> RecordMeta:
        f = Fields(d, where)
        granularity = f.get("granularity", GRANULARITIES.__contains__, f"one of {', '.join(GRANULARITIES)}")
        merged = granularity == "merged"
        student = f.opt("student_tokens", is_object, "an object")
        untrained = f.opt("untrained_duplicates", is_strs, "a list of strings")
        teacher = f.opt("teacher_tokens", _is_outcomes, f"a list of {', '.join(TEACHER_TOKEN_OUTCOMES)}")
        cut = f.get("cut", optional(is_object), "an object or null") if granularity == "path" else None
        return cls(
            task=f.get("task", is_str, "a string"),
            root=f.get("root", is_str, "a string"),
            stage=f.get("stage", optional(is_str), "a string or null"),
            direction=f.get("direction", DIRECTIONS.__contains__, " or ".join(DIRECTIONS)),
            root_score=f.get("root_score", optional(is_num), "a number or null"),
            sandbox=f.opt(
                "sandbox", lambda x: x is None or is_str(x) or is_object(x), "a string, an object or null"
            ),
            backend=f.get("backend", is_str, "a string"),
            coral=f.get("coral", is_str, "a string"),
            path_rank=f.get("path_rank", is_int, "an integer"),
            leaf=f.get("leaf", is_str, "a string"),
            leaf_reason=f.get("leaf_reason", optional(is_str), "a string or null"),
            path_nodes=tuple(f.get("path_nodes", is_strs, "a list of strings")),
            path_edges=tuple(f.get("path_edges", is_strs, "a list of strings")),
            **PathScores.read(f),
            leaf_score=f.get("leaf_score", optional(is_num), "a number or null"),
            gain=f.get("gain", optional(is_num), "a number or null"),
            granularity=granularity,
            path_ranks=tuple(f.get("path_ranks", is_ints, "a list of integers")),
            edge=f.get("edge", is_str, "a string"),
            transcript=f.get("transcript", is_str, "a string"),
            turn=f.get("turn", optional(is_int), "an integer or null"),
            step=f.get("step", optional(is_int), "an integer or null"),
            kind=f.get("kind", is_str, "a string"),
            usage=TokenCounts.from_doc(f.get("usage", is_object, "an object"), f.at("usage")),
            finish_reason=f.opt("finish_reason", optional(is_str), "a string or null"),
            malformed_arguments=f.get("malformed_arguments", _is_count, "a non-negative integer"),
            history_excluded=f.get("history_excluded", _is_count, "a non-negative integer"),
            id=f.get("id", is_str, "a string"),
            cut=None if cut is None else Cut.from_doc(cut, f.at("cut")),
            trained=tuple(f.get("trained", is_ints, "a list of integers")) if merged else (),
            steps=tuple(f.get("steps", is_strs, "a list of strings")) if merged else (),
            student_tokens=None if student is None else TokenCounts.from_doc(student, f.at("student_tokens")),
            untrained_duplicates=None if untrained is None else tuple(untrained),
            teacher_tokens=None if teacher is None else tuple(teacher),
        )

    def to_doc(self) -> SchemaDoc:
        """The metadata as written: its keys in one order (the export's, byte for byte)."""
        doc: SchemaDoc = {
            "task": self.task,
            "root": self.root,
            "stage": self.stage,
            "direction": self.direction,
            "root_score": self.root_score,
            "sandbox": self.sandbox,
            "backend": self.backend,
            "coral": self.coral,
            "path_rank": self.path_rank,
            "leaf": self.leaf,
            "leaf_reason": self.leaf_reason,
            "path_nodes": list(self.path_nodes),
            "path_edges": list(self.path_edges),
            **self.scores_doc(),
            "leaf_score": self.leaf_score,
            "gain": self.gain,
            "granularity": self.granularity,
            "path_ranks": list(self.path_ranks),
        }
        if self.granularity == "path":
            doc["cut"] = None if self.cut is None else self.cut.to_doc()
        doc |= {
            "edge": self.edge,
            "transcript": self.transcript,
            "turn": self.turn,
            "step": self.step,
            "kind": self.kind,
            "usage": self.usage.to_doc(),
            "finish_reason": self.finish_reason,
            "malformed_arguments": self.malformed_arguments,
            "history_excluded": self.history_excluded,
            "id": self.id,
        }
        if self.granularity == "merged":
            doc |= {"trained": list(self.trained), "steps": list(self.steps)}
        if self.student_tokens is not None:
            doc["student_tokens"] = self.student_tokens.to_doc()
        if self.untrained_duplicates is not None:
            doc["untrained_duplicates"] = list(self.untrained_duplicates)
        if self.teacher_tokens is not None:
            doc["teacher_tokens"] = list(self.teacher_tokens)
        return doc


@dataclass(frozen=True)
class TeacherColumns:
    """`export.teacher_tokens`: the Teacher's logprob of each trained token (None where it sampled no such token)
    and its top-K ids and logprobs (empty there), aligned with the trained tokens (`completion_mask`'s ones) in
    order (dataset/teacher_tokens.py)."""

    logprobs: tuple[float | None, ...]
    top_ids: tuple[tuple[int, ...], ...]
    top_logprobs: tuple[tuple[float, ...], ...]

    def to_doc(self) -> SchemaDoc:
        return {
            "teacher_logprobs": list(self.logprobs),
            "teacher_top_ids": [list(x) for x in self.top_ids],
            "teacher_top_logprobs": [list(x) for x in self.top_logprobs],
        }


def _is_logprobs(x: Any) -> bool:
    return isinstance(x, list) and all(v is None or is_num(v) for v in x)


def _is_num_lists(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(v, list) and all(is_num(n) for n in v) for v in x)


def _is_int_lists(x: Any) -> bool:
    return isinstance(x, list) and all(is_ints(v) for v in x)


@dataclass(frozen=True)
class Tokens:
    """`export.pretokenized`: the record's ids under the Student and 1 on each trained token (TRL reads them);
    with `export.teacher_tokens` the Teacher's columns over the trained tokens."""

    input_ids: tuple[int, ...]
    completion_mask: tuple[int, ...]
    teacher: TeacherColumns | None = None

    @classmethod
    def from_doc(cls, f: Fields) -> Tokens | None:
        ids = f.opt("input_ids", is_ints, "a list of integers")
        mask = f.opt("completion_mask", is_ints, "a list of integers")
        lps = f.opt("teacher_logprobs", _is_logprobs, "a list of numbers or nulls")
        top_ids = f.opt("teacher_top_ids", _is_int_lists, "a list of lists of integers")
        top_lps = f.opt("teacher_top_logprobs", _is_num_lists, "a list of lists of numbers")
        if ids is None and mask is None:
            if (lps, top_ids, top_lps) != (None, None, None):
                raise InputError(f"{f.where}: teacher_* columns without input_ids")
            return None
        if ids is None or mask is None or len(ids) != len(mask):
            raise InputError(f"{f.where}: input_ids and completion_mask go together, of one length")
        if (lps, top_ids, top_lps) == (None, None, None):
            return cls(tuple(ids), tuple(mask))
        n = sum(mask)
        if (
            lps is None
            or top_ids is None
            or top_lps is None
            or not len(lps) == len(top_ids) == len(top_lps) == n
        ):
            raise InputError(
                f"{f.where}: teacher_logprobs, teacher_top_ids and teacher_top_logprobs go together, one entry "
                f"per trained token ({n})"
            )
        if any(len(a) != len(b) for a, b in zip(top_ids, top_lps, strict=True)):
            raise InputError(
                f"{f.where}: teacher_top_ids and teacher_top_logprobs differ in length at a token"
            )
        columns = TeacherColumns(tuple(lps), tuple(map(tuple, top_ids)), tuple(map(tuple, top_lps)))
        return cls(tuple(ids), tuple(mask), columns)

    def to_doc(self) -> SchemaDoc:
        doc: SchemaDoc = {"input_ids": list(self.input_ids), "completion_mask": list(self.completion_mask)}
        return doc | (self.teacher.to_doc() if self.teacher else {})


@dataclass(frozen=True)
class StepRecord:
    """Step form: TRL's prompt-completion form, one model call; `completion` is the one message trained."""

    prompt: tuple[Message, ...]
    completion: tuple[Message, ...]
    tools: tuple[Message, ...]
    metadata: RecordMeta
    tokens: Tokens | None = None

    @property
    def messages(self) -> tuple[Message, ...]:
        """The whole conversation: prompt + completion."""
        return self.prompt + self.completion

    @property
    def trained(self) -> tuple[int, ...]:
        """The indices in `messages` of the messages trained: the completion."""
        return (len(self.prompt),)

    def to_doc(self) -> SchemaDoc:
        doc: SchemaDoc = {"prompt": list(self.prompt), "completion": list(self.completion),
                          "tools": list(self.tools), "metadata": self.metadata.to_doc()}  # fmt: skip
        return doc | (self.tokens.to_doc() if self.tokens else {})


@dataclass(frozen=True)
class PathRecord:
    """Path form: the whole session of a selected path; every assistant message is trained."""

    messages: tuple[Message, ...]
    tools: tuple[Message, ...]
    metadata: RecordMeta
    tokens: Tokens | None = None

    @property
    def trained(self) -> tuple[int, ...]:
        return tuple(i for i, m in enumerate(self.messages) if m.get("role") == "assistant")

    def to_doc(self) -> SchemaDoc:
        doc: SchemaDoc = {"messages": list(self.messages), "tools": list(self.tools),
                          "metadata": self.metadata.to_doc()}  # fmt: skip
        return doc | (self.tokens.to_doc() if self.tokens else {})


@dataclass(frozen=True)
class MergedRecord:
    """Merged form: a run of consecutive steps of one session; `metadata.trained` are the messages trained."""

    messages: tuple[Message, ...]
    tools: tuple[Message, ...]
    metadata: RecordMeta
    tokens: Tokens | None = None

    @property
    def trained(self) -> tuple[int, ...]:
        return self.metadata.trained

    def to_doc(self) -> SchemaDoc:
        doc: SchemaDoc = {"messages": list(self.messages), "tools": list(self.tools),
                          "metadata": self.metadata.to_doc()}  # fmt: skip
        return doc | (self.tokens.to_doc() if self.tokens else {})


SftRecord = StepRecord | PathRecord | MergedRecord


def _is_outcomes(x: Any) -> bool:
    return is_strs(x) and all(v in TEACHER_TOKEN_OUTCOMES for v in x)


def record_from_doc(doc: Any, where: str) -> SftRecord:
    """The typed record of one JSON object (a line of an SFT file, or a record built in memory); InputError naming
    `where` and the field when one is missing or of the wrong type. The messages' own shape is the schema's to
    check (`schema_problem`): here each is an object with a string role."""
    f = Fields(doc, where, "the SFT record")
    meta = RecordMeta.from_doc(f.get("metadata", is_object, "an object"), f.at("metadata"))
    tools = tuple(f.get("tools", is_objects, "a list of objects"))
    tokens = Tokens.from_doc(f)
    if meta.granularity == "step":
        prompt = _messages(f, "prompt")
        completion = _messages(f, "completion")
        if len(completion) != 1:
            raise InputError(f"{f.at('completion')}: expected one message, got {len(completion)}")
        return StepRecord(prompt, completion, tools, meta, tokens)
    messages = _messages(f, "messages")
    if meta.granularity == "path":
        return PathRecord(messages, tools, meta, tokens)
    if any(not 0 <= k < len(messages) for k in meta.trained):
        raise InputError(f"{f.at('metadata')}.trained: an index outside the {len(messages)} messages")
    return MergedRecord(messages, tools, meta, tokens)


def _messages(f: Fields, key: str) -> tuple[Message, ...]:
    msgs = f.get(key, is_objects, "a list of objects")
    for i, m in enumerate(msgs):
        if not isinstance(m.get("role"), str):
            raise InputError(f"{f.at(key)}.{i}.role: missing or not a string")
    return tuple(msgs)


def _is_count(x: Any) -> bool:
    return is_int(x) and x >= 0


def iter_records(path: str | Path) -> Iterator[SftRecord]:
    """The typed records of an SFT file, one at a time (errors name the file, the line and the field)."""
    for n, doc in enumerate(iter_jsonl(path, "SFT file"), 1):
        yield record_from_doc(doc, f"SFT file {path} line {n}")


class RecordWriter:
    """The writer of an SFT file: typed records, line by line, renamed into place on success only."""

    def __init__(self, path: str | Path):
        self.lines = AtomicLines(path)

    def __enter__(self) -> RecordWriter:
        self.lines.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.lines.__exit__(*exc)

    @property
    def count(self) -> int:
        return self.lines.count

    def write(self, rec: SftRecord) -> None:
        self.lines.write(rec.to_doc())


def record_writer(path: str | Path) -> RecordWriter:
    return RecordWriter(path)


def lines_writer(path: str | Path) -> AtomicLines:
    """The writer of the LLaMA-Factory copy of an SFT file (dataset/llamafactory.py shapes its lines)."""
    return AtomicLines(path)


def merged_path(results: str | Path) -> Path:
    """The merged SFT file of a results folder."""
    return Path(results) / SFT_NAME


# --- the schema check -----------------------------------------------------------------------------

_Validators = tuple[
    jsonschema.Draft202012Validator, jsonschema.Draft202012Validator, jsonschema.Draft202012Validator
]
_validators: _Validators | None = None
MESSAGE_KEYS = ("prompt", "messages")  # the lists whose messages repeat from record to record


def _schema_validators() -> _Validators:
    """(the whole record schema, the same without checking the items of `prompt` and `messages` (the completion's
    one message is checked), the message schema alone): a session's messages repeat in every later record, so
    `schema_problem` checks each distinct one once."""
    global _validators
    if _validators is None:
        schema = read_json(RECORD_SCHEMA, "SFT record schema")
        envelope = json.loads(json.dumps(schema))
        for key in MESSAGE_KEYS:
            envelope["properties"][key].pop("items")
        message = {"$defs": schema["$defs"], "$ref": "#/$defs/message"}
        check = jsonschema.Draft202012Validator
        _validators = (check(schema), check(envelope), check(message))
    return _validators


def _message_key(m: Any) -> Any:
    """What decides whether a message is valid, as a hashable value that is cheap for repeated messages (their
    strings are the same objects from record to record, whose hashes Python keeps)."""
    if not isinstance(m, dict):
        return None
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        calls = tuple(json.dumps(c, sort_keys=True, ensure_ascii=False) for c in calls)
    elif calls is not None:
        return None
    rest = tuple((k, v) for k, v in sorted(m.items()) if k != "tool_calls")
    try:
        return hash(rest), rest, calls
    except TypeError:  # a list or object where a string belongs: never cached
        return None


def schema_problem(rec: SchemaDoc, seen: set[Any] | None = None) -> str | None:
    """The first way the record breaks workflow/schemas/sft_record.schema.json, or None. With `seen` (messages
    already found valid, updated here) each distinct message is validated once: the same verdict as validating
    the whole record, in time that grows with the new messages only."""
    full, envelope, message = _schema_validators()
    if seen is None:
        err = next(iter(full.iter_errors(rec)), None)
        return None if err is None else _where(err)
    err = next(iter(envelope.iter_errors(rec)), None)
    if err is not None:
        return _where(err)
    for key in MESSAGE_KEYS:
        for i, m in enumerate(rec.get(key) or []):  # the envelope checked that it is a list
            mk = _message_key(m)
            if mk is not None and mk in seen:
                continue
            err = next(iter(message.iter_errors(m)), None)
            if err is not None:
                return f"{key}.{i}.{_where(err)}"
            if mk is not None:
                seen.add(mk)
    return None


def _where(err: jsonschema.ValidationError) -> str:
    return f"{'.'.join(str(x) for x in err.absolute_path) or '<top>'}: {err.message[:200]}"


def record_messages(rec: SftRecord) -> tuple[Message, ...]:
    """The whole conversation of a record, any form (step: prompt + completion)."""
    return rec.messages


def target_key(rec: SftRecord) -> str:
    """The trained messages as canonical JSON, tool-call ids left out: two records with the same key teach the
    same answer (a step or path record: its last assistant message; a merged record: all it trains)."""
    msgs = rec.messages
    if isinstance(rec, MergedRecord):
        return json.dumps([_target(msgs[k]) for k in rec.trained], sort_keys=True, ensure_ascii=False)
    last = next((m for m in reversed(msgs) if m.get("role") == "assistant"), {})
    return json.dumps(_target(last), sort_keys=True, ensure_ascii=False)


def trained_positions(rec: SftRecord) -> tuple[int, ...]:
    """The indices in `rec.messages` of the messages the record trains: a step record's completion, a merged
    record's `metadata.trained`, every assistant message of a path record."""
    return rec.trained


def message_target(m: Message) -> str:
    """One trained message as canonical JSON (content, reasoning, tool names and arguments; tool-call ids aside):
    the duplicate key of dataset/dedupe.py."""
    return json.dumps(_target(m), sort_keys=True, ensure_ascii=False)


def _target(m: Message) -> SchemaDoc:
    calls = [
        {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}
        for tc in m.get("tool_calls") or []
    ]
    return {k: m.get(k) for k in ("content", "reasoning_content")} | {"tool_calls": calls}


# --- the stats file -------------------------------------------------------------------------------------


def stats_path(out: str | Path) -> Path:
    """Where the stats of an SFT file are written: `sft.jsonl` -> `sft.stats.json` beside it."""
    out = Path(out)
    return out.with_name(out.name.removesuffix(".jsonl") + ".stats.json")


def write_stats(out: str | Path, doc: SchemaDoc) -> None:
    """Write the stats of the SFT file `out` beside it."""
    write_json_atomic(stats_path(out), doc)


def read_stats(path: str | Path, check: bool = True) -> SchemaDoc | None:
    """A stats file (`stats_path`) as written; `check`: of this version, else an error (without: None when it is
    not a JSON object, for the report, which shows what it can)."""
    doc = read_json(path, "export stats file")
    if not check:
        return doc if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("version") != STATS_VERSION:
        raise InputError(f"{path}: not an export stats file of version {STATS_VERSION}")
    return doc


# --- the figures file -----------------------------------------------------------------------------------


def figures_path(out: str | Path) -> Path:
    """Where the figures of a merged SFT file are written (dataset/figures.py): `sft.jsonl` -> `sft.figures.json`."""
    out = Path(out)
    return out.with_name(out.name.removesuffix(".jsonl") + ".figures.json")


def write_figures(out: str | Path, doc: SchemaDoc) -> None:
    write_json_atomic(figures_path(out), doc)


def read_figures(out: str | Path) -> SchemaDoc | None:
    """The figures of the merged SFT file `out`, as written; None when there are none."""
    path = figures_path(out)
    if not path.is_file():
        return None
    doc = read_json(path, "dataset figures file")
    if not isinstance(doc, dict) or doc.get("version") != FIGURES_VERSION:
        raise InputError(f"{path}: not a dataset figures file of version {FIGURES_VERSION}")
    return doc
