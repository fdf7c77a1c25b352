"""Selected paths -> SFT JSONL (`sftree export-sft`), and the merged dataset with its card.

Per task: `--paths P1 P2 ... --out results/<task>/sft.jsonl --granularity step|path|merged [--refuse-native]`; the
counts of the export (records, steps left out and why) go to `results/<task>/sft.stats.json` beside it.
Merge: `--merge T1.jsonl T2.jsonl --out results/sft.jsonl --dataset-info results/dataset_info.json
--card results/dataset_card.md --llamafactory-out results/sft_llamafactory.jsonl [--results DIR] [--dedupe]`;
it sums the per-task stats files into `results/sft.stats.json` (the card and the report read them).

OpenAI chat messages (`workflow/schemas/sft_record.schema.json`, docs/outputs.md); every record is validated
against that schema before it is written:

- step granularity (default): one record per model call (`kind` agent or nudge) on the selected paths, in TRL's
  prompt-completion form `{prompt, completion, tools, metadata}`: the exact request messages, then the response
  alone, so each record trains exactly one assistant message. Its tool results are checked (every `tool_calls` id
  answered exactly once) but not included: they open the next step's prompt. **Choice**: an edge shared by several
  selected paths is exported once, attributed to the best-ranked selected path that holds it (its metadata lists
  all of them in `path_ranks`).
- path granularity: `{messages, tools, metadata}`, one record per selected path: the last such step of its last
  edge (its request already holds the whole session since the root), plus its response and tool results.
- merged granularity: `{messages, tools, metadata}`, one record per run of consecutive step records of one session,
  the run's completions listed in `metadata.trained` (dataset/merged.py): the step form's trained messages, each
  once in the same context, without repeating the session for every step.
- **Only well-formed steps are trained** (`exclusion`): a reply cut at `max_tokens` (`finish_reason: length`), a
  tool call whose arguments the model did not send as a JSON object, or a reply that normalisation changed (a tool
  call written as text, a legacy `function_call`, a repaired character) is never a completion. It stays in the
  transcript and, exactly as the agent sent it, in the prompts of later records; each is counted by reason. A path
  record trains every assistant turn, so it is cut before the path's first ill-formed step (**choice**: the
  well-formed prefix is kept, `metadata.cut` says where and why; a path whose first step is ill-formed has none).
- `tool_calls[].function.arguments` are JSON objects. Arguments in the history that are not a JSON object are kept
  as `{"_raw": "<the string>"}` and counted in `metadata.malformed_arguments`, so nothing the Teacher did is
  silently rewritten. A record whose tool calls are not all answered exactly once (a turn cut off by a limit), or
  a request that failed (`response: null`, `error`), is skipped and counted.
- the prompt is the request as sent, with one addition: a `role: tool` message gets the `name` of the tool call it
  answers when the request left it out (the native agent and OpenCode send only `tool_call_id`).
- `metadata.backend` (`native` or `opencode`, from tree.json) and `metadata.coral` (whether the Teacher's world
  was the installed Coral) say how each record was made. **Choice**: native records are flagged (metadata, card,
  report), not refused; `--refuse-native` (`export.refuse_native`) leaves out every record not made by OpenCode.
- the LLaMA-Factory copy (`llamafactory_record`) and exact-duplicate targets (`target_key`) are made at merge.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from sftree.config import SCHEMA_DIR
from sftree.dataset.merged import merged_record, runs
from sftree.dataset.student import Measure, Student, StudentStats, load_student, measure
from sftree.errors import InputError
from sftree.fileio import AtomicLines, iter_jsonl, read_json, write_json_atomic, write_text_atomic
from sftree.progress import Progress
from sftree.records import steplog
from sftree.records.paths import read_paths
from sftree.records.root import meta_path, read_root_meta
from sftree.records.scores import oriented
from sftree.records.tree import final_path, read_tree

log = logging.getLogger("sftree.dataset.export")

EXPORTED_KINDS = ("agent", "nudge")
# Record forms (`export.granularity`; docs/outputs.md): one per step, one per selected path, one per run of steps.
GRANULARITIES = ("step", "path", "merged")
PATH_FIELDS = (
    "avg_cleanliness",
    "avg_knowledge",
    "avg_score",
    "avg_score_rank",
    "max_score",
    "max_score_rank",
    "path_score",
)
DATASET_NAME = "sftree"
RECORD_SCHEMA = SCHEMA_DIR / "sft_record.schema.json"
STATS_VERSION = 1
# Why a step is never a trained completion (`exclusion`), in the order the reasons are tested and reported.
EXCLUSION_REASONS = ("truncated", "text_tool_call", "malformed_arguments", "normalised")
# Normalisation notes (teacher/response.py) that leave what the model said unchanged: a field's name only.
HARMLESS_NOTES = frozenset({"reasoning_field"})
# The backend whose prompts are OpenCode's own context; any other (native, mixed, unknown) is flagged.
OPENCODE = "opencode"
LLAMAFACTORY_TAGS = {
    "role_tag": "role",
    "content_tag": "content",
    "user_tag": "user",
    "assistant_tag": "assistant",
    "observation_tag": "tool",
    "function_tag": "function_call",
    "system_tag": "system",
}


# --- messages -------------------------------------------------------------------------------------------


def _text(content: Any) -> str:
    """Message content as a string: null -> "", a list of content parts -> their text joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content, ensure_ascii=False)


def parse_arguments(arguments: Any) -> tuple[dict, bool]:
    """Tool-call arguments as a JSON object; (object, malformed?). Empty -> {}; non-object -> {"_raw": ...}."""
    if isinstance(arguments, dict):
        return arguments, False
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}, False
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return {"_raw": raw}, True
    if isinstance(value, dict):
        return value, False
    return {"_raw": raw}, True


def normalize_message(msg: dict) -> tuple[dict, int]:
    """One OpenAI chat message with only the fields training needs; returns (message, malformed argument count)."""
    if not isinstance(msg, dict) or "role" not in msg:
        raise ValueError(f"not a chat message: {str(msg)[:80]}")
    out: dict[str, Any] = {"role": msg["role"], "content": _text(msg.get("content"))}
    malformed = 0
    if msg["role"] == "assistant":
        reasoning = msg.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            out["reasoning_content"] = reasoning
        calls = []
        for tc in msg.get("tool_calls") or []:
            fn = tc.get("function") or {}
            args, bad = parse_arguments(fn.get("arguments"))
            malformed += bad
            calls.append(
                {
                    "id": tc.get("id"),
                    "type": "function",
                    "function": {"name": fn.get("name"), "arguments": args},
                }
            )
        if calls:
            out["tool_calls"] = calls
    elif msg["role"] == "tool":
        out["tool_call_id"] = msg.get("tool_call_id")
        if msg.get("name"):
            out["name"] = msg["name"]
    elif msg.get("name"):
        out["name"] = msg["name"]
    return out, malformed


def tool_message(result: dict) -> dict:
    msg = {
        "role": "tool",
        "tool_call_id": result.get("tool_call_id"),
        "content": _text(result.get("content")),
    }
    if result.get("name"):
        msg["name"] = result["name"]
    return msg


def pairing_problems(messages: list[dict]) -> list[str]:
    """Every assistant tool_call id answered by exactly one later tool message, and no tool message unasked."""
    asked: dict[str, int] = {}
    answered: Counter[str] = Counter()
    problems = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            for tc in m.get("tool_calls", []):
                if tc["id"] in asked:
                    problems.append(f"tool call id {tc['id']} used twice")
                asked[tc["id"]] = i
        elif m["role"] == "tool":
            tid = m.get("tool_call_id")
            if tid not in asked:
                problems.append(f"tool message {tid} answers no earlier tool call")
            answered[tid] += 1
    for tid in asked:
        if answered[tid] != 1:
            problems.append(f"tool call {tid} answered {answered[tid]} times")
    return problems


def exclusion(step: dict) -> str | None:
    """Why this step's reply must never be a trained completion, or None when it is well-formed.

    In this order (the first that holds is the reason counted):

    - `truncated`: `finish_reason` is `length` (the reply was cut at `max_tokens`: its last tokens, a closing tag
      or the end-of-turn token, were never generated), or a `truncated_tool_call` note;
    - `text_tool_call`: a `text_tool_calls:*` note (the model wrote its call as text in `content`; trained, the
      chat template would render it as a real call the model never made in that form);
    - `malformed_arguments`: a tool call whose `arguments` are not a JSON object as the model sent them (kept as
      `{"_raw": ...}`, which the template would render as a real call); empty arguments count as `{}`;
    - `normalised`: any other normalisation note (`legacy_function_call`, `lone_surrogate_replaced`, notes added
      later) except `reasoning_field`, which only renames a field.
    """
    notes = [n for n in step.get("notes") or [] if isinstance(n, str)]
    if step.get("finish_reason") == "length" or "truncated_tool_call" in notes:
        return "truncated"
    if any(n.startswith("text_tool_calls") for n in notes):
        return "text_tool_call"
    resp = step.get("response")
    calls = resp.get("tool_calls") if isinstance(resp, dict) else None
    for tc in calls if isinstance(calls, list) else []:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or parse_arguments(fn.get("arguments"))[1]:
            return "malformed_arguments"
    if any(n not in HARMLESS_NOTES for n in notes):
        return "normalised"
    return None


def message_key(msg: dict) -> str:
    """An assistant message as later requests repeat it (content, tool-call ids, names and arguments; reasoning
    aside, which some agents do not resend): how an ill-formed reply is recognised in a record's history. A call
    whose arguments did not parse is keyed by its id and name alone: OpenCode resends it as its own `invalid` call
    (`{"tool": <name>, "error": ...}` under the same id), which is keyed the same way."""
    try:
        norm, _ = normalize_message(dict(msg, role="assistant"))
    except (ValueError, AttributeError):
        return ""
    calls = []
    for tc in norm.get("tool_calls", []):
        name, args = tc["function"]["name"], tc["function"]["arguments"]
        if name == "invalid" and isinstance(args, dict) and {"tool", "error"} <= set(args):
            name, args = str(args["tool"]), UNPARSED
        elif isinstance(args, dict) and set(args) == {"_raw"}:
            args = UNPARSED
        calls.append([tc["id"], name, args])
    return json.dumps([norm["content"], calls], sort_keys=True, ensure_ascii=False)


UNPARSED = "<arguments that did not parse>"


def name_tool_messages(messages: list[dict]) -> None:
    """Give each `role: tool` message without a `name` the name of the tool call it answers (in place)."""
    names: dict[str, str] = {}
    for m in messages:
        if m["role"] == "assistant":
            for tc in m.get("tool_calls", []):
                if tc["function"].get("name"):
                    names[tc["id"]] = tc["function"]["name"]
        elif m["role"] == "tool" and not m.get("name") and m.get("tool_call_id") in names:
            m["name"] = names[m["tool_call_id"]]


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


def tree_backend(tree: dict) -> str:
    """The agent backend that made the tree's steps (tree.json `backend`: native | opencode | mixed)."""
    return str(tree.get("backend") or "unknown")


def tree_coral(tree: dict) -> str:
    """Whether the Teacher's world was the installed Coral: tree.json `coral.mode` (or a plain string `coral`);
    trees that do not say are from before sftree drove an installed Coral: `stand-in`."""
    coral = tree.get("coral")
    mode = coral.get("mode") if isinstance(coral, dict) else coral
    return str(mode) if isinstance(mode, str) and mode else "stand-in"


# --- inputs ---------------------------------------------------------------------------------------------


def read_steps(path: Path) -> list[dict]:
    """Step records of one edge (docs/architecture.md), errors naming file and line."""
    steps = steplog.read_steps(path)  # requests rebuilt from the edge's message store
    for n, rec in enumerate(steps, 1):
        if not isinstance(rec.get("request"), dict):
            raise InputError(f"step records {path} record {n}: no `request` object")
    return steps


@dataclass
class TreeContext:
    """What one selected-paths file needs from its tree: tree.json, the root's stage, where transcripts are."""

    paths_file: Path
    doc: dict
    tree_dir: Path
    tree: dict
    stage: str | None
    edges: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def load(cls, paths_file: str | Path) -> TreeContext:
        paths_file = Path(paths_file)
        doc = read_paths(paths_file)
        tree_dir = paths_file.parent
        tree = read_tree(
            final_path(tree_dir), check=False
        )  # reads the fields it uses, whatever else is there
        root = doc.get("root") or tree.get("root") or tree_dir.name
        meta_file = meta_path(tree_dir.parent.parent / "roots" / root)
        stage = tree.get("stage")
        if meta_file.is_file():
            stage = read_root_meta(meta_file.parent).get("stage", stage)
        else:
            log.warning("%s: root metadata %s not found; stage unknown", paths_file, meta_file)
        edges = {e["id"]: e for e in tree.get("edges", [])}
        return cls(paths_file, doc, tree_dir, tree, stage, edges)

    def transcript(self, edge_id: str) -> Path:
        return self.tree_dir / self._transcript_rel(edge_id)

    def _transcript_rel(self, edge_id: str) -> str:
        return (self.edges.get(edge_id) or {}).get("transcript") or steplog.edge_steps(edge_id)

    def transcript_name(self, edge_id: str) -> str:
        """The transcript relative to the results folder (<task>/trees/<root>/edges/...): a record names no
        host path."""
        return "/".join([*self.tree_dir.parts[-3:], self._transcript_rel(edge_id)])


def signed_gain(root: float | None, score: float | None, direction: str | None) -> float | None:
    """score - root oriented so that positive is better (a minimize task gains when its score drops)."""
    if direction not in ("maximize", "minimize"):
        return None
    a, b = oriented(score, direction), oriented(root, direction)
    return None if a is None or b is None else a - b


def _usage_tokens(step: dict) -> dict:
    u = step.get("usage") or {}
    prompt, completion = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def build_record(
    step: dict, meta: dict, excluded: set[str] | frozenset = frozenset()
) -> tuple[dict | None, str | None]:
    """The SFT record of one step, or (None, why) when it cannot be one. `excluded` holds the `message_key`s of
    the ill-formed replies seen so far on the path: how many of them the record's history repeats is counted in
    `metadata.history_excluded`. The caller checks `exclusion(step)` first."""
    req = step["request"]
    if not isinstance(step.get("response"), dict) or step.get("error"):
        return None, f"no response: {str(step.get('error') or 'response is null')[:120]}"
    malformed = 0
    messages = []
    try:
        for m in req.get("messages") or []:
            msg, bad = normalize_message(m)
            messages.append(msg)
            malformed += bad
        resp = dict(step.get("response") or {})
        resp.setdefault("role", "assistant")
        msg, bad = normalize_message(resp)
    except (ValueError, AttributeError) as exc:
        return None, f"bad message: {exc}"
    n_prompt = len(messages)
    messages.append(msg)
    malformed += bad
    messages.extend(tool_message(r) for r in step.get("tool_results") or [])
    problems = pairing_problems(messages)
    if problems:
        return None, "; ".join(problems[:3])
    name_tool_messages(messages)
    metadata = dict(meta)
    metadata.update(
        turn=step.get("turn"),
        step=step.get("step"),
        kind=step.get("kind", "agent"),
        usage=_usage_tokens(step),
        finish_reason=step.get("finish_reason"),
        malformed_arguments=malformed,
        history_excluded=sum(
            m["role"] == "assistant" and message_key(m) in excluded for m in messages[:n_prompt]
        )
        if excluded
        else 0,
    )
    tools = list(req.get("tools") or [])
    if meta.get("granularity") == "path":
        return {"messages": messages, "tools": tools, "metadata": metadata}, None
    # Step form: only the last assistant message is trained. Its tool results are not part of it (they open the
    # next step's prompt), so TRL's prompt-completion form trains exactly that message and nothing else.
    return {
        "prompt": messages[:n_prompt],
        "completion": [messages[n_prompt]],
        "tools": tools,
        "metadata": metadata,
    }, None


def _path_meta(ctx: TreeContext, path: dict) -> dict:
    doc = ctx.doc
    meta = {
        "task": doc.get("task") or ctx.tree.get("task"),
        "root": doc.get("root") or ctx.tree.get("root"),
        "stage": ctx.stage,
        "direction": doc.get("direction") or ctx.tree.get("direction"),
        "root_score": doc.get("root_score"),
        "sandbox": ctx.tree.get("sandbox"),
        "backend": tree_backend(ctx.tree),
        "coral": tree_coral(ctx.tree),
        "path_rank": path["rank"],
        "leaf": path["leaf"],
        "leaf_reason": path.get("leaf_reason"),
        "path_nodes": path["nodes"],
        "path_edges": path["edges"],
    }
    meta.update({k: path.get(k) for k in PATH_FIELDS})
    leaf = next((n for n in ctx.tree.get("nodes", []) if n.get("id") == path["leaf"]), {})
    meta["leaf_score"] = leaf.get("score")
    meta["gain"] = signed_gain(meta["root_score"], meta["leaf_score"], meta["direction"])
    return meta


def _exported_steps(ctx: TreeContext, edge_id: str) -> list[dict]:
    return [s for s in read_steps(ctx.transcript(edge_id)) if s.get("kind", "agent") in EXPORTED_KINDS]


def _answered(step: dict) -> bool:
    return isinstance(step.get("response"), dict) and not step.get("error")


def _skip_kind(why: str) -> str:
    for prefix, kind in (("no response", "no_response"), ("bad message", "bad_message")):
        if why.startswith(prefix):
            return kind
    return "unpaired_tool_calls"


@dataclass
class ExportStats:
    """What one export did; written to `<out>.stats.json` (`to_dict`) and summed at merge (`add`)."""

    paths: int = 0
    records: int = 0
    skipped: Counter = field(default_factory=Counter)  # steps that cannot be a record, by why
    excluded: Counter = field(
        default_factory=Counter
    )  # ill-formed steps, never trained, by `exclusion` reason
    paths_cut: int = 0  # path records cut before an ill-formed step (path granularity)
    refused: Counter = field(default_factory=Counter)  # records left out by --refuse-native, by backend
    backends: Counter = field(default_factory=Counter)  # records written, by backend
    malformed_arguments: int = 0
    tampered: int = 0  # edges of the exported trees that ended `tampered` (agents/chain.py): never trained
    granularity: str | None = None
    refuse_native: bool = False
    tasks: list = field(default_factory=list)
    student: StudentStats | None = None  # the figures under `export.student`; None: not measured

    def to_dict(self) -> dict:
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
            "student": self.student.to_dict() if self.student else None,
        }

    @classmethod
    def from_dict(cls, d: dict, source: str = "stats") -> ExportStats:
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
            granularity=d.get("granularity"),
            refuse_native=bool(d.get("refuse_native")),
            tasks=list(d.get("tasks") or []),
            student=StudentStats.from_dict(d["student"]) if isinstance(d.get("student"), dict) else None,
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
        ):
            mine.update(theirs)
        self.tasks += [t for t in other.tasks if t not in self.tasks]
        if (self.student is None) != (other.student is None):
            raise InputError(
                "export stats of tasks exported with and without export.student cannot be merged"
            )
        if self.student and other.student:
            self.student.add(other.student)
        self.granularity = self.granularity or other.granularity
        self.refuse_native = self.refuse_native or other.refuse_native


def stats_path(out: str | Path) -> Path:
    """Where the stats of an SFT file are written: `sft.jsonl` -> `sft.stats.json` beside it."""
    out = Path(out)
    return out.with_name(out.name.removesuffix(".jsonl") + ".stats.json")


def export_tree(
    ctx: TreeContext,
    granularity: str,
    stats: ExportStats,
    refuse_native: bool = False,
    student: Student | None = None,
) -> Iterator[dict]:
    selected = sorted((p for p in ctx.doc["paths"] if p.get("selected")), key=lambda p: p["rank"])
    stats.paths += len(selected)
    # A tampered edge has no child, so no path runs through it; counted for the card all the same.
    stats.tampered += sum(1 for e in ctx.tree.get("edges") or [] if e.get("fail_reason") == "tampered")
    task = ctx.doc.get("task") or ctx.tree.get("task")
    if task and task not in stats.tasks:
        stats.tasks.append(task)
    cache: dict[str, list[dict]] = {}
    excluded: set[str] = set()  # message keys of this tree's ill-formed replies (for history_excluded)
    counted: set[str] = set()  # edges whose ill-formed steps are counted (each edge once)
    valid_messages: set[str] = set()  # messages found valid against the schema in this tree

    def steps_of(edge_id: str) -> list[dict]:
        if edge_id not in cache:
            cache[edge_id] = _exported_steps(ctx, edge_id)
            if edge_id not in counted:
                counted.add(edge_id)
                for s in cache[edge_id]:
                    why = exclusion(s) if _answered(s) else None
                    if why:
                        stats.excluded[why] += 1
                        excluded.add(message_key(s["response"]))
                        log.info(
                            "%s: step %s/%s of %s is %s: kept in the history, never trained",
                            ctx.paths_file,
                            s.get("turn"),
                            s.get("step"),
                            edge_id,
                            why,
                        )
        return cache[edge_id]

    def build(step: dict, meta: dict, edge_id: str) -> dict | None:
        meta = dict(meta, edge=edge_id, transcript=ctx.transcript_name(edge_id))
        rec, why = build_record(step, meta, excluded)
        if rec is None:
            stats.skipped[_skip_kind(why)] += 1
            log.warning(
                "%s: skipping step %s/%s of %s: %s",
                ctx.paths_file,
                step.get("turn"),
                step.get("step"),
                edge_id,
                why,
            )
            return None
        rec["metadata"]["id"] = (
            f"{meta['task']}/{meta['root']}/{edge_id}/t{step.get('turn')}s{step.get('step')}"
        )
        if meta.get("granularity") == "path":
            rec["metadata"]["cut"] = meta.get("cut")
        problem = schema_problem(rec, valid_messages)
        if problem:
            stats.skipped["invalid_record"] += 1
            log.warning("%s: skipping record %s: %s", ctx.paths_file, rec["metadata"]["id"], problem)
            return None
        return rec

    def emit(rec: dict, measured: Measure | None = None) -> Iterator[dict]:
        backend = rec["metadata"]["backend"]
        if refuse_native and backend != OPENCODE:
            stats.refused[backend] += 1
            return
        if student is not None and not under_student(rec, student, stats, measured):
            return
        stats.records += 1
        stats.backends[backend] += 1
        stats.malformed_arguments += rec["metadata"]["malformed_arguments"]
        yield rec

    if granularity == "path":
        # A path record trains every assistant turn: it ends before the path's first ill-formed step. Two paths
        # cut at the same step make one record (its path_ranks lists both).
        out: dict[tuple, dict] = {}
        for path in selected:
            meta = _path_meta(ctx, path) | {"granularity": "path", "path_ranks": [path["rank"]], "cut": None}
            chain = [(e, s) for e in path["edges"] for s in steps_of(e) if _answered(s)]
            bad = next((i for i, (_, s) in enumerate(chain) if exclusion(s)), None)
            if bad is None:
                last_edge = path["edges"][-1]
                # the last model call that answered (a failed request at the end holds nothing to learn)
                pick = next(((e, s) for e, s in reversed(chain) if e == last_edge), None)
                if pick is None:
                    stats.skipped["no_steps"] += 1
                    log.warning(
                        "%s: path %d has no exportable step in %s", ctx.paths_file, path["rank"], last_edge
                    )
                    continue
            else:
                e, s = chain[bad]
                meta["cut"] = {
                    "edge": e,
                    "turn": s.get("turn"),
                    "step": s.get("step"),
                    "reason": exclusion(s),
                }
                stats.paths_cut += 1
                if bad == 0:
                    stats.skipped["no_wellformed_prefix"] += 1
                    log.warning(
                        "%s: path %d starts with an ill-formed step (%s): no record",
                        ctx.paths_file,
                        path["rank"],
                        meta["cut"]["reason"],
                    )
                    continue
                pick = chain[bad - 1]
            key = (pick[0], pick[1].get("turn"), pick[1].get("step"))
            if key in out:
                out[key]["metadata"]["path_ranks"].append(path["rank"])
                continue
            rec = build(pick[1], meta, pick[0])
            if rec is not None:
                out[key] = rec
        for rec in out.values():
            yield from emit(rec)
        return

    # step granularity: each edge once, under the best-ranked selected path holding it
    ranks_of: dict[str, list[int]] = defaultdict(list)
    for path in selected:
        for e in path["edges"]:
            ranks_of[e].append(path["rank"])

    def step_records() -> Iterator[dict]:
        done: set[str] = set()
        for path in selected:
            meta = _path_meta(ctx, path) | {"granularity": "step"}
            for edge_id in path["edges"]:
                if edge_id in done:
                    continue
                done.add(edge_id)
                for step in steps_of(edge_id):
                    if _answered(step) and exclusion(step):
                        continue  # counted by steps_of; its message opens the next step's prompt
                    rec = build(step, meta | {"path_ranks": ranks_of[edge_id]}, edge_id)
                    if rec is not None:
                        yield rec
                cache.pop(edge_id, None)  # an edge's steps are needed once in step granularity

    if granularity != "merged":
        for rec in step_records():
            yield from emit(rec)
        return
    # merged granularity: runs of consecutive steps of one session, each run one record (dataset/merged.py)
    for run in runs(step_records(), student):
        rec = merged_record(run)
        problem = schema_problem(rec, valid_messages)
        if problem:
            stats.skipped["invalid_record"] += 1
            log.warning("%s: skipping record %s: %s", ctx.paths_file, rec["metadata"]["id"], problem)
            continue
        yield from emit(rec, run.measure() if student is not None else None)


def under_student(rec: dict, student: Student, stats: ExportStats, measured: Measure | None = None) -> bool:
    """Render the record with the Student's template and count its tokens (`metadata.student_tokens`); False when
    it is longer than `max_length` (**rule**: dropped whole and counted, never cut: a cut step record loses its
    context or its answer). A template that leaves out what the record trains raises StudentError. `measured`: the
    figures already taken (a merged record, measured step by step in `merged.runs`)."""
    m = measured or measure(student, rec)
    why = stats.student.count(m)
    if why:
        log.info(
            "record %s: %d tokens under the Student > max_length %d: dropped",
            rec["metadata"]["id"],
            m.processed,
            student.max_length,
        )
        return False
    rec["metadata"]["student_tokens"] = {
        "prompt_tokens": m.processed - m.trained,
        "completion_tokens": m.trained,
        "total_tokens": m.processed,
    }
    return True


def iter_task_records(
    paths_files: Iterable[str | Path],
    granularity: str,
    stats: ExportStats,
    refuse_native: bool = False,
    student: Student | None = None,
) -> Iterator[dict]:
    """Records of all selected paths of one task's trees, one tree at a time (nothing else held in memory)."""
    paths_files = list(paths_files)
    stats.granularity, stats.refuse_native = granularity, refuse_native
    if student is not None and stats.student is None:
        stats.student = StudentStats.of(student)
    progress = Progress("export-sft trees", total=len(paths_files), logger=log)
    for pf in paths_files:
        yield from export_tree(TreeContext.load(pf), granularity, stats, refuse_native, student)
        progress.update(records=stats.records)
    progress.finish(records=stats.records, paths=stats.paths)


def export_task(
    paths_files: Iterable[str | Path],
    granularity: str,
    refuse_native: bool = False,
    student: Student | None = None,
) -> tuple[list[dict], ExportStats]:
    stats = ExportStats()
    records = list(iter_task_records(paths_files, granularity, stats, refuse_native, student))
    return records, stats


# --- merge, dataset_info, card -------------------------------------------------------------------------


def iter_records(path: str | Path) -> Iterator[dict]:
    return iter_jsonl(path, "SFT file")


THINK_WORDS = ("<think>\n", "\n</think>\n\n")  # LLaMA-Factory's default thought words (qwen3 and others)
TOOL_CALL_WORDS = ("<tool_call>", "</tool_call>")  # its default tool-call words
# How its `openai` converter joins consecutive tool results into one observation (whatever the template).
TOOL_RESPONSE_WORDS = ("<tool_response>\n", "\n</tool_response>")


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


def _target(m: dict) -> dict:
    calls = [
        {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}
        for tc in m.get("tool_calls") or []
    ]
    return {k: m.get(k) for k in ("content", "reasoning_content")} | {"tool_calls": calls}


def _lf_assistant(m: dict) -> dict:
    """An assistant message as one LLaMA-Factory turn whose content keeps the text beside the calls.

    Its `openai` converter would replace the content of a message with `tool_calls` by the calls alone, so calls
    are written the way its FunctionFormatter reads them back: `[thought]text<tool_call>[calls]</tool_call>`,
    role `function_call`. The calls' JSON sits inside a string, so Arrow never unifies `arguments` across tools.
    """
    text = m["content"]
    if m.get("reasoning_content"):
        text = f"{THINK_WORDS[0]}{m['reasoning_content']}{THINK_WORDS[1]}{text}"
    if not m.get("tool_calls"):
        return {"role": "assistant", "content": text}
    calls = [
        {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]} for tc in m["tool_calls"]
    ]
    body = json.dumps(calls, ensure_ascii=False)
    return {"role": "function_call", "content": f"{text}{TOOL_CALL_WORDS[0]}{body}{TOOL_CALL_WORDS[1]}"}


def llamafactory_record(rec: dict) -> dict:
    """A record in the shape LLaMA-Factory's `openai` converter takes without loss.

    Its converter requires strictly alternating turns (user or observation, then assistant or function), so the
    OpenCode order `tool` -> `user` (a rollout turn ends on the tool results of its `coral eval`, the next turn's
    prompt follows) has no place in it: an observation cannot be followed by a user turn. **Choice**: the prompt
    keeps its role: the tool results that end a rollout turn move into the user turn that follows, ahead of the
    prompt, each wrapped as LLaMA-Factory's converter wraps observations (`<tool_response>\n...\n</tool_response>`,
    joined by a newline), then a blank line, then the prompt. With the `qwen` templates the text differs from what
    the Student sees under OpenCode only in `</tool_response><|im_end|>\n<|im_start|>user\n` becoming
    `</tool_response>\n\n` at each such boundary (docs/outputs.md; tests/test_export_consumers.py checks it).

    - trailing tool results are dropped (LLaMA-Factory drops them too), so the record ends on the trained turn;
    - `tools` is a JSON string (its converter accepts one), so tool schemas are not unified across records;
    - a tool message keeps only `role` and `content`: the converter reads nothing else of it (no `name`).
    """
    out: list[dict] = []
    for m in record_messages(rec):
        if m["role"] == "user" and out and out[-1]["role"] == "tool":
            results = []
            while out and out[-1]["role"] == "tool":
                results.insert(0, out.pop()["content"])
            moved = "\n".join(f"{TOOL_RESPONSE_WORDS[0]}{r}{TOOL_RESPONSE_WORDS[1]}" for r in results)
            out.append({"role": "user", "content": f"{moved}\n\n{m['content']}"})
        elif m["role"] == "assistant":
            out.append(_lf_assistant(m))
        else:
            out.append({"role": m["role"], "content": m["content"]})
    while out and out[-1]["role"] == "tool":
        out.pop()
    meta = rec.get("metadata") or {}
    return {
        "messages": out,
        "tools": json.dumps(rec.get("tools") or [], ensure_ascii=False),
        "id": meta.get("id"),
    }


def turn_boundaries(rec: dict) -> int:
    """How many times a user message follows a tool message in the record (the layout LLaMA-Factory cannot
    keep: `llamafactory_record`)."""
    msgs = record_messages(rec)
    return sum(a["role"] == "tool" and b["role"] == "user" for a, b in zip(msgs, msgs[1:], strict=False))


def dataset_info(sft_file: str | Path, info_file: str | Path) -> dict:
    """LLaMA-Factory `dataset_info.json` entry for the merged file (file_name relative to the info file)."""
    rel = os.path.relpath(Path(sft_file).resolve(), Path(info_file).resolve().parent)
    return {
        DATASET_NAME: {
            "file_name": rel,
            "formatting": "openai",
            "columns": {"messages": "messages", "tools": "tools"},
            "tags": dict(LLAMAFACTORY_TAGS),
        }
    }


def _gain(meta: dict) -> float | None:
    return signed_gain(meta.get("root_score"), meta.get("max_score"), meta.get("direction"))


def _fmt(x: float | None, nd: int = 4) -> str:
    return "-" if x is None else f"{x:.{nd}g}" if abs(x) >= 1e4 else f"{x:.{nd}f}"


@dataclass
class MergeStats:
    records: int = 0  # written
    duplicates: int = 0  # records whose trained message equals an earlier record's (target_key)
    dropped: int = 0  # duplicates left out (export.dedupe)
    boundaries: int = 0  # tool -> user boundaries in the written records (moved in the LLaMA-Factory copy)
    boundary_records: int = 0  # written records holding at least one
    export: ExportStats | None = None  # the per-task export stats, summed (None when no input had any)
    missing_stats: list = field(default_factory=list)  # inputs without a stats file
    # merged-form records left out of the LLaMA-Factory copy: its converter would train every assistant turn of
    # them, the context's too (they train through `tokenized_path`: docs/outputs.md)
    llamafactory_left_out: int = 0


def _trust_lines(trust: list) -> list[str]:
    """Card section: per task the snapshots skipped, per root and selected path the gain over the root."""
    lines = [
        "## Can the data be trusted",
        "",
        "Gain = leaf score minus root (Student) score, signed so that positive is better in the task's direction. "
        "**below root** marks a selected path whose leaf scores worse than the snapshot it started from.",
        "",
        "| task | snapshots | failed evals (not roots) | pending skipped | sandbox |",
        "|---|---:|---:|---:|---|",
    ]
    for t in trust:
        pending = "unknown" if t.pending is None else t.pending
        lines.append(
            f"| {t.task} | {t.snapshots} | {t.failed_evals} | {pending} | {', '.join(t.sandboxes) or 'unknown'} |"
        )
    lines += [
        "",
        "| task | root | sandbox | root score | path | leaf | leaf score | gain | flag |",
        "|---|---|---|---:|---:|---|---:|---:|---|",
    ]
    for t in trust:
        for r in t.roots:
            if not r.paths:
                lines.append(
                    f"| {t.task} | {r.root} | {r.sandbox} | {_fmt(r.root_score)} | - | - | - | - | no selected path |"
                )
            for p in r.paths:
                flag = "below root" if p.below_root else ("no gain" if p.gain == 0 else "")
                lines.append(
                    f"| {t.task} | {r.root} | {r.sandbox} | {_fmt(r.root_score)} | {p.rank} | {p.leaf} "
                    f"| {_fmt(p.leaf_score)} | {_fmt(p.gain)} | {flag} |"
                )
    roots = [r for t in trust for r in t.roots]
    worse = [r for r in roots if r.paths and all(p.below_root for p in r.paths)]
    flat = [r for r in roots if r.best_gain is not None and r.best_gain <= 0]
    lines += [
        "",
        f"{sum(r.below_root for r in roots)} of {sum(len(r.paths) for r in roots)} selected paths end below their "
        f"root; {len(worse)} of {len(roots)} roots have all selected paths below the root; {len(flat)} roots have "
        "no selected path that improves on the root.",
        "",
    ]
    return lines


def _counts(c: Counter | dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in c.items() if v) or "none"


def _backend_lines(backends: Counter, corals: Counter, export: ExportStats | None) -> list[str]:
    """Card: which agent backend made the records, whether the Teacher's world was the installed Coral."""
    lines = [
        f"Agent backend: {', '.join(f'{k}: {v} records' for k, v in sorted(backends.items())) or 'none'}."
        + (
            f" **{sum(v for k, v in backends.items() if k != OPENCODE)} records were NOT made by OpenCode** "
            "(`native`: sftree's Python imitation of OpenCode, for tests and the demo; its system prompt, tool "
            "descriptions and tool outputs are not OpenCode's, so these prompts are not the context the Student "
            "sees under OpenCode; `mixed`: a tree resumed with another backend; `unknown`: a tree that does not say). "
            "Filter on `metadata.backend`, or "
            "set `export.refuse_native: true` to leave them out."
            if any(k != OPENCODE for k in backends)
            else ""
        )
    ]
    if export is not None and export.refused:
        lines[0] += f" Left out by `export.refuse_native`: {_counts(dict(sorted(export.refused.items())))}."
    lines += [
        "",
        f"Teacher's world (`metadata.coral`): {', '.join(f'{k}: {v} records' for k, v in sorted(corals.items())) or 'none'}"
        + (
            " (`stand-in`: sftree's own stand-ins for Coral's prompts and CLI, not the installed Coral)."
            if "stand-in" in corals
            else "."
        ),
        "",
    ]
    return lines


def _untrained_lines(merged: MergeStats | None, history_excluded: int, step: bool) -> list[str]:
    """Card section: the ill-formed steps that are never a trained completion, and the steps skipped."""
    lines = ["## Steps never trained", ""]
    export = merged.export if merged else None
    if export is None:
        return lines + ["Unknown: no export stats file (`sft.stats.json`) beside the merged inputs.", ""]
    total = sum(export.excluded.values())
    reasons = {k: export.excluded[k] for k in EXCLUSION_REASONS} | {
        k: v for k, v in export.excluded.items() if k not in EXCLUSION_REASONS
    }
    lines += [
        f"{total} ill-formed steps on the selected paths are never a trained completion: "
        + ", ".join(f"{k} {v}" for k, v in reasons.items())
        + ". `truncated`: cut at `max_tokens` (`finish_reason: length`); `text_tool_call`: a tool call written "
        "as text in the content (normalised into a call); `malformed_arguments`: arguments the model did not send "
        'as a JSON object (`{"_raw": ...}` in the history); `normalised`: another change made while reading the '
        "reply (a legacy `function_call`, a repaired character). They stay in the transcripts and, exactly as the "
        f"agent sent them, in the history of later records ({history_excluded} such messages in the prompts "
        "written here, `metadata.history_excluded`).",
        "",
    ]
    if export.granularity == "path":
        lines += [
            f"Path records cut before their path's first ill-formed step: {export.paths_cut} "
            "(`metadata.cut`; every assistant turn of a path record is trained).",
            "",
        ]
    lines += [
        f"Steps skipped (no record could be made): {_counts(dict(sorted(export.skipped.items())))}.",
        "",
        f"Edges ended as `tampered` (a request that was not the extension of its session: docs/security.md, "
        f'"Trained records"): {export.tampered}; kept in their transcripts with the difference, never trained.',
        "",
    ]
    if merged and merged.missing_stats:
        lines += [f"No export stats for: {', '.join(merged.missing_stats)} (not counted above).", ""]
    return lines


def _llamafactory_layout_lines(merged: MergeStats | None) -> list[str]:
    """Card: exactly how the LLaMA-Factory copy differs from what the Student sees under OpenCode."""
    n = f"{merged.boundaries} times in {merged.boundary_records} records" if merged else "wherever it occurs"
    return [
        "LLaMA-Factory requires alternating turns, so one thing differs from what the Student sees under "
        f"OpenCode ({n}): where a rollout turn ends on tool results and the next turn's `user` prompt follows, "
        "the tool results move into that user turn, each as `<tool_response>\nRESULT\n</tool_response>`, then "
        "a blank line, then the prompt. With the `qwen`/`qwen3` templates the only textual difference is "
        "`</tool_response><|im_end|>\n<|im_start|>user\n` becoming `</tool_response>\n\n`; the prompt keeps "
        "its role, the moved results show as part of the user turn. With `mask_history` these turns are never "
        f"trained. `{DATASET_NAME}`'s TRL file (`sft.jsonl`) keeps `tool` and `user` as sent.",
        "",
    ]


def _student_lines(merged: MergeStats | None) -> list[str]:
    """Card section: the records under the Student's tokenizer, template and max_length (`export.student`)."""
    from sftree.dataset.student import DROP_TOO_LONG

    lines = ["## Under the Student", ""]
    st = merged.export.student if merged and merged.export else None
    if st is None:
        return lines + [
            "Not measured: `export.student` is not set, so the records were never rendered with the Student's chat "
            "template nor counted with its tokenizer. Their length under the Student is unknown, and a trainer may "
            "cut or drop records longer than its `max_length` without a word; a template that does not render "
            "tool calls would train answers without their calls.",
            "",
        ]
    ratio = f"{st.processed / st.trained:.1f}" if st.trained else "-"
    dropped = st.dropped.get(DROP_TOO_LONG, 0)
    lines += [
        f"Student: `{st.source}`, chat template `{st.template}`, `max_length` {st.max_length}. Every record was "
        "rendered with this template and the trained text checked to hold every tool call (name and arguments), "
        "the text and the reasoning it trains.",
        "",
        f"Records: {st.records}; tokens processed {st.processed}; tokens trained {st.trained}; processed per "
        f"trained token: {ratio}. Longest record: {st.longest} tokens.",
        "",
    ]
    if st.as_steps and st.as_steps != st.processed:
        lines += [
            f"As step records (one per trained message, each with its whole context) the same trained tokens would "
            f"cost {st.as_steps} tokens processed ({st.as_steps / st.trained:.1f} per trained token): the records "
            f"written process {st.processed / st.as_steps:.1%} of that.",
            "",
        ]
    lines += [
        f"Records dropped: {_counts(st.dropped)}"
        + (
            f" (`{DROP_TOO_LONG}`: the whole rendered record is longer than `max_length`; dropped, never cut, so "
            "no trainer cuts it silently)."
            if dropped
            else "."
        ),
        "",
        "| length / max_length | " + " | ".join(st.lengths) + " |",
        "|---|" + "---:|" * len(st.lengths),
        "| records | " + " | ".join(str(v) for v in st.lengths.values()) + " |",
        "",
    ]
    return lines


def dataset_card(
    records: list[dict],
    sft_name: str,
    lf_name: str | None = None,
    trust: list | None = None,
    merged: MergeStats | None = None,
    dedupe: bool = False,
) -> str:
    """Markdown card: counts by task/stage/root, tokens, trust (gains, skipped snapshots, sandbox, backend, Coral),
    the steps never trained and why, how the LLaMA-Factory copy differs, how to load."""
    by_task: Counter[str] = Counter()
    by_stage: Counter[tuple[str, str]] = Counter()
    roots: dict[tuple[str, str], dict] = {}
    paths: dict[tuple[str, str, int], dict] = {}
    tokens = Counter()
    granularities = Counter()
    malformed = history_excluded = 0
    sandboxes: Counter[str] = Counter()
    backends: Counter[str] = Counter()
    corals: Counter[str] = Counter()
    for r in records:
        m = r["metadata"]
        sandboxes[str(m.get("sandbox") or "unknown")] += 1
        backends[str(m.get("backend") or "unknown")] += 1
        corals[str(m.get("coral") or "stand-in")] += 1
        history_excluded += m.get("history_excluded", 0)
        task, root, stage = m.get("task"), m.get("root"), m.get("stage") or "unknown"
        by_task[task] += 1
        by_stage[(task, stage)] += 1
        row = roots.setdefault((task, root), {"stage": stage, "records": 0, "tokens": 0, "completion": 0})
        row["records"] += 1
        u = m.get("usage") or {}
        row["tokens"] += u.get("total_tokens", 0)
        row["completion"] += u.get("completion_tokens", 0)
        for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
            tokens[k] += u.get(k, 0)
        granularities[m.get("granularity")] += 1
        malformed += m.get("malformed_arguments", 0)
        paths.setdefault((task, root, m.get("path_rank")), m)
    step = granularities.get("step", 0) > 0
    merged_form = not step and granularities.get("merged", 0) > 0
    if step:
        form = (
            "Each line is `{prompt, completion, tools, metadata}` (TRL's conversational prompt-completion form): "
            "`completion` is the one assistant message the record trains, `prompt` every message before it."
        )
    elif merged_form:
        form = (
            "Each line is `{messages, tools, metadata}`: a run of consecutive steps of one session; only the "
            "assistant messages at `metadata.trained` are trained (each one step's completion, once, in the "
            "context it saw); every other message is context. Train it with the marked tokens "
            '(`sftree.dataset.trainer_labels.token_labels`: docs/outputs.md, "Training").'
        )
    else:
        form = (
            "Each line is `{messages, tools, metadata}`: the whole session of a selected path, every assistant "
            "turn trained."
        )
    lines = [
        "# sftree SFT dataset",
        "",
        f"`{sft_name}`: {len(records)} records ({', '.join(f'{v} {k}' for k, v in granularities.items()) or 'none'}) "
        f"from {len(paths)} selected root-to-leaf paths of {len(roots)} trees, {len(by_task)} tasks. {form} "
        "OpenAI chat messages: assistant `tool_calls` with `arguments` as JSON objects, tool results as "
        "`role: tool` messages with `tool_call_id` and `name`, `reasoning_content` kept when the Teacher produced "
        "it.",
        "",
    ]
    lines += _backend_lines(backends, corals, merged.export if merged else None)
    if sandboxes:
        note = ", ".join(f"{k}: {v} records" for k, v in sorted(sandboxes.items()))
        unsafe = (
            " **Some records were made WITHOUT a sandbox** (`agent.sandbox: none`): their scores come from "
            "code that ran unconfined."
            if "none" in sandboxes
            else ""
        )
        lines += [f"Sandbox (docs/security.md): {note}.{unsafe}", ""]
    if merged is not None:
        lines += [
            f"Exact-duplicate targets (same trained message, tool-call ids aside, as an earlier record): "
            f"{merged.duplicates}; "
            + (
                f"dropped ({merged.dropped}, `export.dedupe: true`)."
                if dedupe
                else "kept (set `export.dedupe: true` to drop them)."
            ),
            "",
        ]
    if trust:
        lines += _trust_lines(trust)
    lines += _untrained_lines(merged, history_excluded, step)
    lines += _student_lines(merged)
    lines += [
        "## Records by task and stage",
        "",
        "| task | early | middle | late | unknown | total |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for task in sorted(by_task):
        cells = [str(by_stage[(task, s)]) for s in ("early", "middle", "late", "unknown")]
        lines.append(f"| {task} | {' | '.join(cells)} | {by_task[task]} |")
    lines += [
        "",
        "## Records by root",
        "",
        "| task | root | stage | records | tokens (prompt+completion) | completion tokens |",
        "|---|---|---|---:|---:|---:|",
    ]
    for (task, root), row in sorted(roots.items()):
        lines.append(
            f"| {task} | {root} | {row['stage']} | {row['records']} | {row['tokens']} | {row['completion']} |"
        )
    lines += [
        "",
        "## Tokens",
        "",
        f"Prompt tokens {tokens['prompt_tokens']}, completion tokens {tokens['completion_tokens']}, "
        f"total {tokens['total_tokens']} (the Teacher server's `usage` of each exported model call).",
        "",
        "## Best-node gains of the selected paths",
        "",
        "Gain here = the path's best node score (not its leaf's, as above) minus its root's (Student) score, "
        "oriented so that positive is better.",
        "",
        "| task | paths | improved | mean gain | best gain | mean PathScore |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    by_task_paths: dict[str, list[dict]] = defaultdict(list)
    for (task, _, _), m in paths.items():
        by_task_paths[task].append(m)
    for task in sorted(by_task_paths):
        ms = by_task_paths[task]
        gains = [g for g in (_gain(m) for m in ms) if g is not None]
        ps = [m["path_score"] for m in ms if m.get("path_score") is not None]
        lines.append(
            f"| {task} | {len(ms)} | {sum(g > 0 for g in gains)} | {_fmt(sum(gains) / len(gains) if gains else None)}"
            f" | {_fmt(max(gains) if gains else None)} | {_fmt(sum(ps) / len(ps) if ps else None)} |"
        )
    if malformed:
        lines += [
            "",
            f"{malformed} tool-call arguments in the records' history (never in a trained message) were not JSON "
            'objects and are kept as `{"_raw": ...}`.',
        ]
    trl_cols = '"prompt", "completion", "tools"' if step else '"messages", "tools"'
    if merged_form:
        lines += [
            "",
            "## Loading",
            "",
            "TRL (`datasets>=4.7`): the trained tokens marked with the Student's own tokenizer, as a pre-tokenized "
            "dataset whose `completion_mask` TRL turns into labels:",
            "",
            "```python",
            "from datasets import load_dataset",
            "from transformers import AutoTokenizer",
            "from trl import SFTConfig, SFTTrainer",
            "from sftree.dataset.trainer_labels import token_labels  # standard library only: or copy the file",
            "",
            'tok = AutoTokenizer.from_pretrained("Qwen/Qwen3-8B")',
            f'ds = load_dataset("json", data_files="{sft_name}", split="train")',
            "ds = ds.map(lambda r: token_labels(r, tok), remove_columns=ds.column_names)",
            'trainer = SFTTrainer(model="Qwen/Qwen3-8B", processing_class=tok, train_dataset=ds, '
            "args=SFTConfig(completion_only_loss=True))",
            "trainer.train()",
            "```",
            "",
            "LLaMA-Factory: the same rows with `labels` saved by `datasets` (`save_to_disk`) and read with "
            "`tokenized_path` (its `openai` converter would train every assistant turn of a record, the context's "
            "too); docs/outputs.md.",
            "",
            "See `docs/outputs.md` for every field of `metadata`.",
            "",
        ]
        return "\n".join(lines)
    lines += [
        "",
        "## Loading",
        "",
        "TRL (`datasets>=4.7`; the `tools` column is passed to the chat template"
        + ("; only the completion is trained" if step else "; train on assistant turns")
        + "):",
        "",
        "```python",
        "from datasets import load_dataset",
        "from trl import SFTConfig, SFTTrainer",
        "",
        f'ds = load_dataset("json", data_files="{sft_name}", split="train").select_columns([{trl_cols}])',
        'trainer = SFTTrainer(model="Qwen/Qwen3-8B", train_dataset=ds, args=SFTConfig('
        + ("" if step else "assistant_only_loss=True")
        + "))",
        "trainer.train()",
        "```",
        "",
        f"LLaMA-Factory: put `dataset_info.json` and `{lf_name or sft_name}` in your `dataset_dir` and set "
        f"`dataset: {DATASET_NAME}` in the training YAML"
        + (", with `mask_history: true` so only each record's final turn is trained" if step else "")
        + f" (entry `{DATASET_NAME}`: `formatting: openai`; tool calls are `function_call` turns whose content "
        "keeps the assistant's text before `<tool_call>[...]</tool_call>`; `tools` is a JSON string).",
        "",
        *_llamafactory_layout_lines(merged),
        "See `docs/outputs.md` for every field of `metadata`.",
        "",
    ]
    return "\n".join(lines)


def merge(
    inputs: list[str],
    out: str,
    info: str | None,
    card: str | None,
    llamafactory: str | None = None,
    dedupe: bool = False,
    results: str | None = None,
) -> MergeStats:
    """Concatenate per-task files (streaming), write the LLaMA-Factory copy, dataset_info.json and the card.

    Exact-duplicate targets (`target_key`) are counted; with `dedupe` all but the first are left out. The inputs'
    stats files (`stats_path`) are summed into the merged one beside `out`, with the merge's own counts.
    """
    from sftree.dataset.provenance import read_results

    metadata: list[dict] = []  # the card needs only these, not the messages
    stats = MergeStats()
    for f in inputs:
        sp = stats_path(f)
        if not sp.is_file():
            stats.missing_stats.append(str(f))
            log.warning("%s: no export stats file %s; its left-out steps are not counted", f, sp)
            continue
        one = ExportStats.from_dict(read_json(sp, "export stats file"), str(sp))
        if stats.export is None:
            stats.export = one
        else:
            stats.export.add(one)
    seen: set[str] = set()
    with contextlib.ExitStack() as stack:
        main = stack.enter_context(AtomicLines(out))
        lf = stack.enter_context(AtomicLines(llamafactory)) if llamafactory else None
        progress = Progress("merge-sft records", logger=log)
        for f in inputs:
            for rec in iter_records(f):
                key = target_key(rec)
                if key in seen:
                    stats.duplicates += 1
                    if dedupe:
                        stats.dropped += 1
                        continue
                seen.add(key)
                main.write(rec)
                n = turn_boundaries(rec)
                stats.boundaries += n
                stats.boundary_records += n > 0
                if lf and (rec.get("metadata") or {}).get("granularity") == "merged":
                    stats.llamafactory_left_out += 1
                elif lf:
                    lf.write(llamafactory_record(rec))
                metadata.append(rec.get("metadata") or {})
                progress.update()
        progress.finish(files=len(inputs))
    stats.records = main.count
    doc = (stats.export.to_dict() if stats.export else {"version": STATS_VERSION}) | {
        "merge": {
            "inputs": len(inputs),
            "records": stats.records,
            "duplicates": stats.duplicates,
            "dropped": stats.dropped,
            "turn_boundaries": stats.boundaries,
            "turn_boundary_records": stats.boundary_records,
            "llamafactory_left_out": stats.llamafactory_left_out,
            "missing_stats": list(stats.missing_stats),
        }
    }
    write_json_atomic(stats_path(out), doc)
    if info:
        write_json_atomic(info, dataset_info(llamafactory or out, info))
    if card:
        tasks = list(dict.fromkeys(m.get("task") for m in metadata if m.get("task")))
        trust = read_results(Path(results), tasks or None) if results else None
        lf_name = Path(llamafactory).name if llamafactory else None
        text = dataset_card(
            [{"metadata": m} for m in metadata], Path(out).name, lf_name, trust, stats, dedupe
        )
        write_text_atomic(card, text)
    log.info(
        "merged %d records from %d files -> %s; %d exact-duplicate targets (%d dropped)",
        stats.records,
        len(inputs),
        out,
        stats.duplicates,
        stats.dropped,
    )
    return stats


# --- CLI ------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--paths", nargs="*", default=None, help="paths.json files of one task's trees")
    parser.add_argument("--merge", nargs="*", default=None, help="per-task sft.jsonl files to merge")
    parser.add_argument("--out", required=True, help="JSONL to write")
    parser.add_argument("--granularity", choices=GRANULARITIES, default="step")
    parser.add_argument("--dataset-info", help="merge mode: LLaMA-Factory dataset_info.json to write")
    parser.add_argument("--card", help="merge mode: dataset card (Markdown) to write")
    parser.add_argument(
        "--llamafactory-out",
        help="merge mode: the records reshaped for LLaMA-Factory (dataset_info points here)",
    )
    parser.add_argument(
        "--dedupe",
        action="store_true",
        help="merge mode: leave out records whose target duplicates an earlier one",
    )
    parser.add_argument(
        "--results",
        help="merge mode: the results folder, for the card's gains, skipped snapshots and sandbox",
    )
    parser.add_argument(
        "--refuse-native",
        action="store_true",
        help="leave out the records of trees not made by the opencode backend (counted); default: flag them",
    )
    parser.add_argument(
        "--student",
        help="the Student's HF model folder or .gguf file: every record rendered with its chat template and "
        "counted with its tokenizer (export.student)",
    )
    parser.add_argument("--student-max-length", type=int, help="with --student: records longer are dropped")
    parser.add_argument(
        "--student-chat-template", help="with --student: a Jinja file replacing its own template"
    )


def run(args: argparse.Namespace) -> int:
    if (args.paths is None) == (args.merge is None):
        raise InputError("give exactly one of --paths (per-task export) or --merge (merge per-task files)")
    if args.merge is not None:
        missing = [f for f in args.merge if not Path(f).is_file()]
        if missing:
            raise InputError(f"SFT files to merge not found: {', '.join(missing)}")
        merge(
            args.merge,
            args.out,
            args.dataset_info,
            args.card,
            args.llamafactory_out,
            dedupe=args.dedupe,
            results=args.results,
        )
        return 0
    student = None
    if args.student:
        if not args.student_max_length:
            raise InputError("--student needs --student-max-length (export.student.max_length)")
        student = load_student(args.student, args.student_max_length, args.student_chat_template)
    stats = ExportStats()
    # A StudentError raised on any record leaves nothing written (AtomicLines renames only on success).
    with AtomicLines(args.out) as out:
        for rec in iter_task_records(args.paths, args.granularity, stats, args.refuse_native, student):
            out.write(rec)
    write_json_atomic(stats_path(args.out), stats.to_dict())
    log.info(
        "%d records (%s) from %d selected paths in %d trees -> %s; ill-formed steps never trained %s; "
        "skipped %s; refused %s; malformed arguments in histories %d",
        stats.records,
        args.granularity,
        stats.paths,
        len(args.paths),
        args.out,
        dict(stats.excluded) or 0,
        dict(stats.skipped) or 0,
        dict(stats.refused) or 0,
        stats.malformed_arguments,
    )
    if any(k != OPENCODE for k in stats.backends):
        log.warning(
            "%d records were not made by the opencode backend (%s): flagged in metadata.backend and the card",
            sum(v for k, v in stats.backends.items() if k != OPENCODE),
            dict(stats.backends),
        )
    return 0
