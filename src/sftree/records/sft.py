"""The SFT record (`sft.jsonl`, one per task and the merged one) and its stats file (`sft.stats.json` beside it):
the one reader, the one writer, the schema check, and what a record trains.

Written by `export-sft` (per task) and `merge-sft` (all tasks); read by `merge-sft` and the trainers. The report
reads only the stats and the figures the merge writes beside the merged file (`figures_path`), never the records.
Records are OpenAI chat messages (`workflow/schemas/sft_record.schema.json`, docs/outputs.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema

from sftree.config import SCHEMA_DIR
from sftree.errors import InputError
from sftree.fileio import AtomicLines, iter_jsonl, read_json, write_json_atomic

SFT_NAME = "sft.jsonl"  # the merged file in the results folder (per task: results/<task>/sft.jsonl)
RECORD_SCHEMA = SCHEMA_DIR / "sft_record.schema.json"
STATS_VERSION = 1
FIGURES_VERSION = 1
# Why a step is never a trained completion (`dataset.messages.exclusion`), in the order the reasons are tested and
# reported: the keys of the stats' `excluded`.
EXCLUSION_REASONS = ("truncated", "text_tool_call", "malformed_arguments", "normalised")
# The backend whose prompts are OpenCode's own context (`metadata.backend`); any other is flagged.
OPENCODE = "opencode"


# --- the records ----------------------------------------------------------------------------------------


def iter_records(path: str | Path) -> Iterator[dict]:
    """The records of an SFT file, one at a time (errors name the file and line)."""
    return iter_jsonl(path, "SFT file")


def record_writer(path: str | Path) -> AtomicLines:
    """The writer of an SFT file (or its LLaMA-Factory copy): line by line, renamed into place on success only."""
    return AtomicLines(path)


def merged_path(results: str | Path) -> Path:
    """The merged SFT file of a results folder."""
    return Path(results) / SFT_NAME


_validators: tuple | None = None
MESSAGE_KEYS = ("prompt", "messages")  # the lists whose messages repeat from record to record


def _schema_validators() -> tuple:
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
        _validators = tuple(jsonschema.Draft202012Validator(x) for x in (schema, envelope, message))
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


def schema_problem(rec: dict, seen: set | None = None) -> str | None:
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


def record_messages(rec: dict) -> list[dict]:
    """The whole conversation of a record, either form (step: prompt + completion; path: messages)."""
    if "messages" in rec:
        return rec["messages"]
    return list(rec.get("prompt") or []) + list(rec.get("completion") or [])


def target_key(rec: dict) -> str:
    """The trained message (the last assistant message; a merged record: its trained messages) as canonical JSON,
    tool-call ids left out: two records with the same key teach the same answer."""
    msgs = record_messages(rec)
    meta = rec.get("metadata") or {}
    if meta.get("granularity") == "merged":  # a run: all its trained messages
        return json.dumps([_target(msgs[k]) for k in meta["trained"]], sort_keys=True, ensure_ascii=False)
    last = next((m for m in reversed(msgs) if m.get("role") == "assistant"), {})
    return json.dumps(_target(last), sort_keys=True, ensure_ascii=False)


def trained_positions(rec: dict) -> list[int]:
    """The indices in `record_messages(rec)` of the messages the record trains: a step record's completion, a
    merged record's `metadata.trained`, every assistant message of a path record."""
    msgs = record_messages(rec)
    meta = rec.get("metadata") or {}
    if "prompt" in rec:
        return [len(rec["prompt"])]
    if meta.get("granularity") == "merged":
        return list(meta["trained"])
    return [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]


def message_target(m: dict) -> str:
    """One trained message as canonical JSON (content, reasoning, tool names and arguments; tool-call ids aside):
    the duplicate key of dataset/dedupe.py."""
    return json.dumps(_target(m), sort_keys=True, ensure_ascii=False)


def _target(m: dict) -> dict:
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


def write_stats(out: str | Path, doc: dict) -> None:
    """Write the stats of the SFT file `out` beside it."""
    write_json_atomic(stats_path(out), doc)


def read_stats(path: str | Path, check: bool = True) -> dict | None:
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


def write_figures(out: str | Path, doc: dict) -> None:
    write_json_atomic(figures_path(out), doc)


def read_figures(out: str | Path) -> dict | None:
    """The figures of the merged SFT file `out`, as written; None when there are none."""
    path = figures_path(out)
    if not path.is_file():
        return None
    doc = read_json(path, "dataset figures file")
    if not isinstance(doc, dict) or doc.get("version") != FIGURES_VERSION:
        raise InputError(f"{path}: not a dataset figures file of version {FIGURES_VERSION}")
    return doc
