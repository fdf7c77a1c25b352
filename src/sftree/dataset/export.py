"""Selected paths -> one task's SFT JSONL (`sftree export-sft`); the merge of all tasks is `sftree merge-sft`
(dataset/merge.py).

`--paths P1 P2 ... --out results/<task>/sft.jsonl --config C`: what is written is the config's `export` section
(`ExportSettings`: the form, the Student, the tree form; one default each, the schema's); by hand an option
(`--granularity`, `--student`, ...) overrides one key of it. The counts of the export (records, steps left out and
why: dataset/stats.py) go to `results/<task>/sft.stats.json` beside it; with `export.tree_packed` the tree form
(dataset/tree_packed.py) goes to `sft.tree.jsonl` beside it, made from the same read of each tree's steps, each path
rendered and tokenized once (`_TreeExport.path_tokens`; **choice**: a path is left out of the tree form when its
tokens there pass `max_length`). The record, its schema check and its files are records/sft.py's; the messages in it are normalised by
dataset/messages.py.

OpenAI chat messages (`workflow/schemas/sft_record.schema.json`, docs/outputs.md); every record is validated
against that schema before it is written:

- step granularity: one record per model call (`kind` agent or nudge) on the selected paths, in TRL's
  prompt-completion form `{prompt, completion, tools, metadata}`: the exact request messages, then the response
  alone, so each record trains exactly one assistant message. Its tool results are checked (every `tool_calls` id
  answered exactly once) but not included: they open the next step's prompt. **Choice**: an edge shared by several
  selected paths is exported once, attributed to the best-ranked selected path that holds it (its metadata lists
  all of them in `path_ranks`).
- path granularity: `{messages, tools, metadata}`, one record per selected path: the last such step of its last
  edge (its request already holds the whole session since the root), plus its response and tool results.
- merged granularity (the schema's default): `{messages, tools, metadata}`, one record per run of consecutive step records of one session,
  the run's completions listed in `metadata.trained` (dataset/merged.py): the step form's trained messages, each
  once in the same context, without repeating the session for every step.
- **Only well-formed steps are trained** (`messages.exclusion`): a reply cut at `max_tokens` (`finish_reason: length`), a
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
- the LLaMA-Factory copy (`llamafactory.llamafactory_record`) and duplicate trained messages (dataset/dedupe.py)
  are made at merge.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from sftree.config import REPO_ROOT
from sftree.dataset.atif import trajectories, tree_folder, with_logprobs
from sftree.dataset.fit import FIT_MODES, fit_record
from sftree.dataset.fit import count as count_adaptations
from sftree.dataset.merged import merged_record, runs
from sftree.dataset.messages import (
    Step,
    exclusion,
    message_key,
    name_tool_messages,
    normalize_message,
    pairing_problems,
    tool_message,
)
from sftree.dataset.pretokenize import Pretokenized, pretokenize
from sftree.dataset.rendering import Student, StudentError, Unfit
from sftree.dataset.special_text import MODES, SpecialText, SpecialTextStats, builtin_strings, student_strings
from sftree.dataset.stats import ExportStats
from sftree.dataset.student import Measure, StudentStats, load_student, measure
from sftree.dataset.teacher_tokens import Sampled, refit, sampled_of, teacher_tokens
from sftree.dataset.trainer_labels import trained_indices
from sftree.dataset.tree_packed import PathTokens, pack_paths, write_tree_file
from sftree.errors import InputError
from sftree.progress import Progress
from sftree.records import steplog
from sftree.records.atif import atif_path, trajectory_writer
from sftree.records.paths import Paths, RankedPath, read_paths
from sftree.records.root import meta_path, read_root_meta
from sftree.records.scores import signed_gain
from sftree.records.sft import (
    GRANULARITIES,
    OPENCODE,
    Granularity,
    Message,
    SftRecord,
    record_from_doc,
    record_writer,
    schema_problem,
    write_stats,
)
from sftree.records.steplog import TokenLogprobs
from sftree.records.tree import Edge, SchemaDoc, Tree, final_path, read_tree
from sftree.records.tree_packed import tree_form_path
from sftree.settings import ExportSettings, load_settings, section_settings
from sftree.teacher.vocabulary import vocabulary_sha256

log = logging.getLogger("sftree.dataset.export")

EXPORTED_KINDS = ("agent", "nudge")


def tree_backend(tree: Tree) -> str:
    """The agent backend that made the tree's steps (tree.json `backend`: native | opencode | mixed)."""
    return str(tree.backend or "unknown")


def tree_coral(tree: Tree) -> str:
    """Whether the Teacher's world was the installed Coral: tree.json `coral.mode` (or a plain string `coral`);
    trees that do not say are from before sftree drove an installed Coral: `stand-in`."""
    coral = tree.coral
    mode = coral.get("mode") if isinstance(coral, dict) else coral
    return str(mode) if isinstance(mode, str) and mode else "stand-in"


# --- inputs ---------------------------------------------------------------------------------------------


def read_steps(path: Path) -> list[Step]:
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
    paths: Paths
    tree_dir: Path
    tree: Tree
    stage: str | None
    edges: dict[str, Edge] = field(default_factory=dict)

    @classmethod
    def load(cls, paths_file: str | Path) -> TreeContext:
        paths_file = Path(paths_file)
        paths = read_paths(paths_file)
        tree_dir = paths_file.parent
        tree = read_tree(
            final_path(tree_dir), check=False
        )  # reads the fields it uses, whatever else is there
        root = paths.root or tree.root or tree_dir.name
        meta_file = meta_path(tree_dir.parent.parent / "roots" / root)
        stage: str | None = None
        if meta_file.is_file():
            stage = read_root_meta(meta_file.parent).get("stage", stage)
        else:
            log.warning("%s: root metadata %s not found; stage unknown", paths_file, meta_file)
        edges = {e.id: e for e in tree.edges}
        return cls(paths_file, paths, tree_dir, tree, stage, edges)

    def transcript(self, edge_id: str) -> Path:
        return self.tree_dir / self._transcript_rel(edge_id)

    def _transcript_rel(self, edge_id: str) -> str:
        edge = self.edges.get(edge_id)
        return (edge.transcript if edge else None) or steplog.edge_steps(edge_id)

    def transcript_name(self, edge_id: str) -> str:
        """The transcript relative to the results folder (<task>/trees/<root>/edges/...): a record names no
        host path."""
        return "/".join([*self.tree_dir.parts[-3:], self._transcript_rel(edge_id)])


def _usage_tokens(step: Step) -> dict[str, int]:
    u = step.get("usage") or {}
    prompt, completion = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def build_record(
    step: Step, meta: SchemaDoc, excluded: set[str] | frozenset[str] = frozenset()
) -> tuple[SchemaDoc, None] | tuple[None, str]:
    """The SFT record of one step, or (None, why) when it cannot be one. `excluded` holds the `message_key`s of
    the ill-formed replies seen so far on the path: how many of them the record's history repeats is counted in
    `metadata.history_excluded`. The caller checks `exclusion(step)` first."""
    req = step["request"]
    if not isinstance(step.get("response"), dict) or step.get("error"):
        return None, f"no response: {str(step.get('error') or 'response is null')[:120]}"
    malformed = 0
    messages: list[Message] = []
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


def _path_meta(ctx: TreeContext, path: RankedPath) -> SchemaDoc:
    paths = ctx.paths
    meta: SchemaDoc = {
        "task": paths.task or ctx.tree.task,
        "root": paths.root or ctx.tree.root,
        "stage": ctx.stage,
        "direction": paths.direction,
        "root_score": paths.root_score,
        "sandbox": ctx.tree.sandbox,
        "backend": tree_backend(ctx.tree),
        "coral": tree_coral(ctx.tree),
        "path_rank": path.rank,
        "leaf": path.leaf,
        "leaf_reason": path.leaf_reason,
        "path_nodes": list(path.nodes),
        "path_edges": list(path.edges),
        **path.scores_doc(),
    }
    leaf = ctx.tree.node(path.leaf)
    leaf_score = leaf.score if leaf else None
    meta["leaf_score"] = leaf_score
    meta["gain"] = signed_gain(paths.root_score, leaf_score, paths.direction)
    return meta


def _exported_steps(ctx: TreeContext, edge_id: str) -> list[Step]:
    return [s for s in read_steps(ctx.transcript(edge_id)) if s.get("kind", "agent") in EXPORTED_KINDS]


def _answered(step: Step) -> bool:
    return isinstance(step.get("response"), dict) and not step.get("error")


def logprobs_kind(step: Step) -> str:
    """What a reply's step record keeps of the Teacher's tokens (`teacher.logprobs`): `kept`, why none were kept
    (`absent`, `misaligned`, `malformed`), or `not_asked`."""
    if isinstance(step.get("logprobs"), dict):
        return "kept"
    dropped = step.get("logprobs_dropped")
    return str(dropped).split(":", 1)[0] if dropped else "not_asked"


def _skip_kind(why: str) -> str:
    for prefix, kind in (("no response", "no_response"), ("bad message", "bad_message")):
        if why.startswith(prefix):
            return kind
    return "unpaired_tool_calls"


def export_tree(
    ctx: TreeContext,
    granularity: Granularity,
    stats: ExportStats,
    refuse_native: bool = False,
    student: Student | None = None,
    text: TextRule | None = None,
    tree: list[PathTokens] | None = None,
) -> Iterator[SftRecord]:
    """The records of one tree's selected paths, in the given form, counted into `stats` as they go. `tree`: the
    tree form's paths are added to it, from the same read of the tree's steps (`_TreeExport.path_tokens`)."""
    selected = list(ctx.paths.selected)
    stats.paths += len(selected)
    # A tampered edge has no child, so no path runs through it; counted for the card all the same.
    stats.tampered += sum(1 for e in ctx.tree.edges if e.fail_reason == "tampered")
    stats.turn_ends.update(t.ended or "unknown" for e in ctx.tree.edges for t in e.turns)
    task = ctx.paths.task or ctx.tree.task
    if task and task not in stats.tasks:
        stats.tasks.append(task)
    export = _TreeExport(ctx, stats, refuse_native, student, text or TextRule.of(student))
    export.sampled.by_message = granularity == "path" or tree is not None  # a path's history is looked up
    side = export.tree_side() if tree is not None else None
    if granularity == "path":
        yield from export.path_records(selected)
    elif granularity == "merged":
        yield from export.merged_records(selected)
    else:
        for rec in export.step_records(selected):
            yield from export.emit(rec)
    if side is not None and tree is not None:
        tree.extend(side.path_tokens(selected))


class _TreeExport:
    """One tree's export: the steps of its edges (each read once, its ill-formed steps counted once), the records
    built from them and checked against the schema, and what is emitted."""

    def __init__(
        self,
        ctx: TreeContext,
        stats: ExportStats,
        refuse_native: bool,
        student: Student | None,
        text: TextRule,
    ):
        self.ctx, self.stats, self.refuse_native, self.student = ctx, stats, refuse_native, student
        self.text = text
        self.scanned: dict[str, list[str]] = {}  # special strings found per string (a session repeats them)
        self.cache: dict[str, list[Step]] = {}
        self.excluded: set[str] = (
            set()
        )  # message keys of this tree's ill-formed replies (for history_excluded)
        self.counted: set[str] = set()  # edges whose ill-formed steps are counted (each edge once)
        self.valid_messages: set[str] = set()  # messages found valid against the schema in this tree
        self.keep_steps = False  # the tree form reads the steps again (`tree_side`)
        self.sampled = SampledTokens()  # the replies' sampled tokens (`export.teacher_tokens`)

    def tree_side(self) -> _TreeExport:
        """The exporter of the tree form's path records on the steps this one reads (each edge read and its
        ill-formed steps found once), counting into figures of its own (the export's stats are the chosen
        form's). Its control-token counts too: `text_ok` drops a path record from the tree form as from the
        path form."""
        self.keep_steps = True
        figures = ExportStats(special_text=SpecialTextStats(self.text.mode, self.text.special.source))
        side = _TreeExport(self.ctx, figures, self.refuse_native, self.student, self.text)
        side.scanned, side.cache, side.excluded = self.scanned, self.cache, self.excluded
        side.counted, side.valid_messages, side.sampled = self.counted, self.valid_messages, self.sampled
        return side

    def steps_of(self, edge_id: str) -> list[Step]:
        if edge_id not in self.cache:
            self.cache[edge_id] = _exported_steps(self.ctx, edge_id)
            if edge_id not in self.counted:
                self.counted.add(edge_id)
                for s in self.cache[edge_id]:
                    if _answered(s):
                        self.stats.teacher_logprobs[logprobs_kind(s)] += 1
                        if self.text.teacher_tokens:
                            self.sampled.remember(s)
                    why = exclusion(s) if _answered(s) else None
                    if why:
                        self.stats.excluded[why] += 1
                        self.excluded.add(message_key(s["response"]))
                        log.info(
                            "%s: step %s/%s of %s is %s: kept in the history, never trained",
                            self.ctx.paths_file,
                            s.get("turn"),
                            s.get("step"),
                            edge_id,
                            why,
                        )
        return self.cache[edge_id]

    def build(self, step: Step, meta: SchemaDoc, edge_id: str) -> SchemaDoc | None:
        ctx, stats = self.ctx, self.stats
        meta = dict(meta, edge=edge_id, transcript=ctx.transcript_name(edge_id))
        built = build_record(step, meta, self.excluded)
        if built[0] is None:  # indexed, not unpacked: the type checker then knows the reason is there
            why = built[1]
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
        rec = built[0]
        rec["metadata"]["id"] = (
            f"{meta['task']}/{meta['root']}/{edge_id}/t{step.get('turn')}s{step.get('step')}"
        )

        if meta.get("granularity") == "path":
            rec["metadata"]["cut"] = meta.get("cut")
        if not (self.valid(rec) and self.text_ok(rec)):
            return None
        if self.text.teacher_tokens:  # until the record is emitted (`SampledTokens.forget`)
            self.sampled.of_record[rec["metadata"]["id"]] = step.get("logprobs")
        return rec

    def text_ok(self, rec: SchemaDoc) -> bool:
        """**Rule** (`export.special_text`): a record whose data holds a control-token string is counted by role
        and string, and dropped (`drop`) or kept (`split`: tokenized as plain text; `keep`). A merged record is
        checked step by step (each step record before the runs are made)."""
        hits = self.text.special.hits(rec, self.scanned)
        if not hits:
            return True
        counts = self.stats.special_text
        assert counts is not None  # set by iter_task_records (the tree form's side: by tree_side)
        counts.count(hits)
        log.warning(
            "%s: record %s holds control-token text %s (%s): %s",
            self.ctx.paths_file,
            rec["metadata"]["id"],
            sorted({s for _, s in hits})[:5],
            ", ".join(sorted({r for r, _ in hits})),
            "dropped" if self.text.mode == "drop" else self.text.mode,
        )
        return self.text.mode != "drop"

    def valid(self, rec: SchemaDoc) -> bool:
        """Whether the record meets the schema; counted and logged when it does not."""
        problem = schema_problem(rec, self.valid_messages)
        if problem:
            self.stats.skipped["invalid_record"] += 1
            log.warning("%s: skipping record %s: %s", self.ctx.paths_file, rec["metadata"]["id"], problem)
        return not problem

    def emit(self, rec: SchemaDoc, measured: Measure | None = None) -> Iterator[SftRecord]:
        stats = self.stats
        backend = rec["metadata"]["backend"]
        sampled = None
        if self.text.teacher_tokens:
            sampled = self.sampled_for(rec)  # looked up as recorded: unfitted
            self.sampled.forget(rec["metadata"])
        if self.refuse_native and backend != OPENCODE:
            stats.refused[backend] += 1
            return
        unfitted = rec
        if self.student is not None:
            if not under_student(rec, self.student, stats, measured):
                return
            rec, touched = fit_record(
                self.student.fit, rec
            )  # written as the template needs it (dataset/fit.py)
            count_adaptations(_student_stats(stats).adaptations, touched)
        if self.text.pretokenized:
            assert self.student is not None  # TextRule.of refuses export.pretokenized without a Student
            if sampled is None:
                add_tokens(rec, self.student)
            else:
                sampled = refit(unfitted, rec, sampled)
                stats.teacher_tokens.update(add_teacher_tokens(rec, self.student, sampled))
        stats.records += 1
        stats.backends[backend] += 1
        stats.malformed_arguments += rec["metadata"]["malformed_arguments"]
        yield record_from_doc(rec, f"{self.ctx.paths_file}: record {rec['metadata']['id']}")

    def path_records(self, selected: list[RankedPath]) -> Iterator[SftRecord]:
        for rec in self.path_docs(selected):
            yield from self.emit(rec)

    def path_docs(self, selected: list[RankedPath]) -> list[SchemaDoc]:
        """A path record trains every assistant turn: it ends before the path's first ill-formed step. Two paths
        cut at the same step make one record (its path_ranks lists both)."""
        out: dict[tuple[str, object, object], SchemaDoc] = {}  # (edge, turn, step) -> record
        for path in selected:
            meta = _path_meta(self.ctx, path) | {
                "granularity": "path",
                "path_ranks": [path.rank],
                "cut": None,
            }
            pick = self.path_pick(path, meta)
            if pick is None:
                continue
            key = (pick[0], pick[1].get("turn"), pick[1].get("step"))
            if key in out:
                out[key]["metadata"]["path_ranks"].append(path.rank)
                continue
            rec = self.build(pick[1], meta, pick[0])
            if rec is not None:
                out[key] = rec
        return list(out.values())

    def path_tokens(self, selected: list[RankedPath]) -> Iterator[PathTokens]:
        """The tree form's paths: the path records, built as the path form builds them from the steps this tree's
        export has read, each rendered and tokenized once (`pretokenize`); one longer than the Student's
        `max_length` is left out, as the path form drops it."""
        assert self.student is not None  # the tree form is of tokens: iter_task_records checks it
        for rec in self.path_docs(selected):
            if self.refuse_native and rec["metadata"]["backend"] != OPENCODE:
                continue
            if not self.text.teacher_tokens:
                tokens = pretokenize(self.student, rec)
                if len(tokens.input_ids) <= self.student.max_length:
                    yield PathTokens.of(tokens, rec["metadata"])
                continue
            tt = teacher_tokens(self.student, *self.teacher_view(rec))
            self.sampled.forget(rec["metadata"])
            if len(tt.input_ids) <= self.student.max_length:  # each path's outcomes: the tree form's figures
                meta = rec["metadata"] | {"teacher_tokens": tt.outcomes}
                yield PathTokens.of(Pretokenized(tt.input_ids, tt.mask), meta, tt.columns())

    def path_pick(self, path: RankedPath, meta: SchemaDoc) -> tuple[str, Step] | None:
        """(edge, step) whose request + response is the path's record: its last answered step, or the one before
        its first ill-formed step (`meta["cut"]` says where and why); None when there is none."""
        ctx, stats = self.ctx, self.stats
        chain = [(e, s) for e in path.edges for s in self.steps_of(e) if _answered(s)]
        bad = next((i for i, (_, s) in enumerate(chain) if exclusion(s)), None)
        if bad is None:
            last_edge = path.edges[-1]
            # the last model call that answered (a failed request at the end holds nothing to learn)
            pick = next(((e, s) for e, s in reversed(chain) if e == last_edge), None)
            if pick is None:
                stats.skipped["no_steps"] += 1
                log.warning("%s: path %d has no exportable step in %s", ctx.paths_file, path.rank, last_edge)
            return pick
        e, s = chain[bad]
        meta["cut"] = {"edge": e, "turn": s.get("turn"), "step": s.get("step"), "reason": exclusion(s)}
        stats.paths_cut += 1
        if bad == 0:
            stats.skipped["no_wellformed_prefix"] += 1
            log.warning(
                "%s: path %d starts with an ill-formed step (%s): no record",
                ctx.paths_file,
                path.rank,
                meta["cut"]["reason"],
            )
            return None
        return chain[bad - 1]

    def step_records(self, selected: list[RankedPath]) -> Iterator[SchemaDoc]:
        """Step granularity: each edge once, under the best-ranked selected path holding it (not yet emitted)."""
        ranks_of: dict[str, list[int]] = defaultdict(list)
        for path in selected:
            for e in path.edges:
                ranks_of[e].append(path.rank)
        done: set[str] = set()
        for path in selected:
            meta = _path_meta(self.ctx, path) | {"granularity": "step"}
            for edge_id in path.edges:
                if edge_id in done:
                    continue
                done.add(edge_id)
                for step in self.steps_of(edge_id):
                    if _answered(step) and exclusion(step):
                        continue  # counted by steps_of; its message opens the next step's prompt
                    rec = self.build(step, meta | {"path_ranks": ranks_of[edge_id]}, edge_id)
                    if rec is not None:
                        yield rec
                if not self.keep_steps:
                    self.cache.pop(edge_id, None)  # an edge's steps are needed once in step granularity

    def merged_records(self, selected: list[RankedPath]) -> Iterator[SftRecord]:
        """Merged granularity: runs of consecutive steps of one session, each run one record (dataset/merged.py)."""
        ends = self.differs if self.text.teacher_tokens else None
        for run in runs(self.step_records(selected), self.student, self.unfit, ends):
            rec = merged_record(run)
            if self.valid(rec):
                yield from self.emit(rec, run.measure() if self.student is not None else None)
            else:
                self.sampled.forget(rec["metadata"])

    def sampled_for(self, rec: SchemaDoc) -> list[Sampled]:
        """Each trained message's sampled tokens (`export.teacher_tokens`), checked against it
        (`teacher_tokens.sampled_of`), in order."""
        assert self.student is not None  # TextRule.of refuses export.teacher_tokens without a Student
        messages, trained = trained_indices(rec)
        meta = rec["metadata"]
        ids: list[str | None] = [None] * len(trained)
        if meta["granularity"] == "merged":
            ids = list(meta["steps"])
        elif trained:
            ids[-1] = meta["id"]  # a step record's completion; a path record's last reply is its own step
        return [
            sampled_of(self.student, messages[k], self.sampled.get(rid, messages[k]))
            for k, rid in zip(trained, ids, strict=True)
        ]

    def teacher_view(self, rec: SchemaDoc) -> tuple[SchemaDoc, list[Sampled]]:
        """The record as the Student's fit writes it, and its trained replies' sampled tokens for that form."""
        assert self.student is not None
        fitted = fit_record(self.student.fit, rec)[0]
        return fitted, refit(rec, fitted, self.sampled_for(rec))

    def differs(self, rec: SchemaDoc) -> bool:
        """A step record whose reply the Student renders other than the Teacher sampled it: a merged run ends
        with it, so that its sampled ids are trained (dataset/teacher_tokens.py)."""
        assert self.student is not None
        return teacher_tokens(self.student, *self.teacher_view(rec)).outcomes == ["substituted"]

    def unfit(self, rec: SchemaDoc, exc: Unfit) -> None:
        """A step record the Student's template cannot hold: excluded, counted by reason, logged."""
        self.sampled.forget(rec["metadata"])
        _student_stats(self.stats).exclude(exc.reason)
        log.warning(
            "%s: record %s excluded (%s): %s", self.ctx.paths_file, rec["metadata"]["id"], exc.reason, exc
        )


def _student_stats(stats: ExportStats) -> StudentStats:
    """The export's figures under the Student, which `iter_task_records` sets wherever a Student is."""
    assert stats.student is not None, "export stats without the Student's figures, under a Student"
    return stats.student


def under_student(
    rec: SchemaDoc, student: Student, stats: ExportStats, measured: Measure | None = None
) -> bool:
    """Render the record with the Student's template and count its tokens (`metadata.student_tokens`); False when
    it is longer than `max_length` (**rule**: dropped whole and counted, never cut: a cut step record loses its
    context or its answer). A template that leaves out what the record trains raises StudentError. `measured`: the
    figures already taken (a merged record, measured step by step in `merged.runs`)."""
    try:
        m = measured or measure(student, rec)
    except Unfit as exc:  # excluded with its reason (dataset/fit.py), unless `export.student.fit: strict`
        if student.strict:
            raise
        _student_stats(stats).exclude(exc.reason)
        log.warning("record %s excluded (%s): %s", rec["metadata"]["id"], exc.reason, exc)
        return False
    why = _student_stats(stats).count(m)
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


def add_tokens(rec: SchemaDoc, student: Student) -> None:
    """`export.pretokenized`: the record's `input_ids` and `completion_mask` (dataset/pretokenize.py); its trained
    tokens must be the ones counted in `metadata.student_tokens`."""
    tokens = pretokenize(student, rec)
    counted = rec["metadata"]["student_tokens"]
    if (tokens.trained, len(tokens.input_ids)) != (counted["completion_tokens"], counted["total_tokens"]):
        raise StudentError(
            f"record {rec['metadata']['id']}: pre-tokenized {len(tokens.input_ids)} tokens, {tokens.trained} "
            f"trained; counted {counted['total_tokens']}, {counted['completion_tokens']}"
        )
    rec.update(tokens.row())


def add_teacher_tokens(rec: SchemaDoc, student: Student, sampled: list[Sampled]) -> list[str]:
    """`export.teacher_tokens`: the record's ids with the Teacher's sampled tokens where they can be trained, its
    trained tokens' Teacher columns and each trained message's outcome (dataset/teacher_tokens.py); its
    `metadata.student_tokens` count the ids written. Returns the outcomes."""
    tt = teacher_tokens(student, rec, sampled)
    rec.update(tt.row())
    meta = rec["metadata"]
    meta["teacher_tokens"] = tt.outcomes
    trained = sum(tt.mask)
    meta["student_tokens"] = {
        "prompt_tokens": len(tt.input_ids) - trained,
        "completion_tokens": trained,
        "total_tokens": len(tt.input_ids),
    }
    return tt.outcomes


class SampledTokens:
    """One tree's replies' sampled tokens (the step records' `logprobs`): by the record id of the step that made
    each (a step record, a merged record's steps, a path record's last reply), and by `message_key` for the
    replies a path record's history repeats (a key two replies share, with other tokens, gives none)."""

    AMBIGUOUS: TokenLogprobs = {"k": 0, "logprobs": [], "top_logprobs": []}

    def __init__(self) -> None:
        # a record's own replies, from when its step is built until it is emitted (`forget`)
        self.of_record: dict[str, TokenLogprobs | None] = {}
        self.of_message: dict[str, TokenLogprobs] = {}
        self.by_message = False  # path records (path form, tree form) look their history's replies up

    def remember(self, step: Step) -> None:
        lp = step.get("logprobs")  # a TokenLogprobs where kept (teacher/logprobs.py wrote it)
        if self.by_message and isinstance(lp, dict):
            key = message_key(step["response"])
            seen = self.of_message.setdefault(key, cast(TokenLogprobs, lp))
            if seen != lp:
                self.of_message[key] = self.AMBIGUOUS

    def forget(self, meta: SchemaDoc) -> None:
        """The record's own replies are looked up once it is emitted: the step form's memory stays one edge's."""
        for rid in meta.get("steps") or [meta["id"]]:
            self.of_record.pop(rid, None)

    def get(self, record_id: str | None, message: Message) -> TokenLogprobs | None:
        if record_id is not None and record_id in self.of_record:
            return self.of_record[record_id]
        lp = self.of_message.get(message_key(message))
        return None if lp is self.AMBIGUOUS else lp


@dataclass(frozen=True)
class TextRule:
    """`export.special_text` and `export.pretokenized`, with the strings looked for (dataset/special_text.py)."""

    special: SpecialText
    mode: str = "drop"
    pretokenized: bool = False
    teacher_tokens: bool = (
        False  # the pre-tokenized forms train the Teacher's sampled ids (teacher_tokens.py)
    )

    @classmethod
    def of(
        cls,
        student: Student | None,
        mode: str = "drop",
        pretokenized: bool = False,
        teacher_tokens: bool = False,
    ) -> TextRule:
        if teacher_tokens and student is None:
            raise InputError(
                "export.teacher_tokens needs export.student (a Student with the Teacher's vocabulary)"
            )
        if mode not in MODES:
            raise InputError(f"export.special_text: {mode!r} is not one of {', '.join(MODES)}")
        if pretokenized and student is None:
            raise InputError("export.pretokenized needs export.student (the tokenizer of the ids)")
        if mode == "split" and not pretokenized:
            raise InputError(
                "export.special_text: split tokenizes data text as plain text, which only a pre-tokenized output "
                "can carry: set export.pretokenized: true (or use drop)"
            )
        if mode == "keep" and pretokenized:
            raise InputError(
                "export.pretokenized tokenizes data text as plain text: special_text keep cannot hold"
            )
        if student is not None:
            strings = SpecialText(student_strings(student.tokenizer), "student")
            return cls(strings, mode, pretokenized, teacher_tokens)
        return cls(SpecialText(builtin_strings(), "builtin"), mode, pretokenized)


def iter_task_records(
    paths_files: Iterable[str | Path],
    settings: ExportSettings,
    stats: ExportStats,
    student: Student | None,
    tree: list[PathTokens] | None = None,
) -> Iterator[SftRecord]:
    """Records of all selected paths of one task's trees in the form `settings.granularity` names, one tree at a
    time (nothing else held in memory). `tree` (`export.tree_packed`): each tree's paths for the tree form are
    added to it, tokenized once, from the same read of its steps."""
    paths_files = list(paths_files)
    if tree is not None and student is None:
        raise InputError("export.tree_packed needs export.student: the tree form is of tokens")
    if settings.teacher_tokens and not (settings.pretokenized or tree is not None):
        raise InputError(
            "export.teacher_tokens trains token ids: set export.pretokenized: true (or export.tree_packed: true)"
        )
    text = TextRule.of(student, settings.special_text, settings.pretokenized, settings.teacher_tokens)
    digest = vocabulary_sha256(student.tokenizer) if settings.teacher_tokens and student is not None else None
    if student is not None and settings.special_text == "split":
        student = dataclasses.replace(student, plain_data=True)  # counted as the pre-tokenized rows hold it
    stats.granularity, stats.refuse_native = settings.granularity, settings.refuse_native
    stats.pretokenized = settings.pretokenized
    if student is not None and stats.student is None:
        stats.student = StudentStats.of(student)
    if stats.special_text is None:
        stats.special_text = SpecialTextStats(settings.special_text, text.special.source)
    progress = Progress("export-sft trees", total=len(paths_files), logger=log)
    for pf in paths_files:
        ctx = TreeContext.load(pf)
        if digest is not None:
            check_teacher_vocabulary(ctx, digest)
        yield from export_tree(
            ctx, _granularity(settings), stats, settings.refuse_native, student, text, tree
        )
        progress.update(records=stats.records)
    progress.finish(records=stats.records, paths=stats.paths)


def check_teacher_vocabulary(ctx: TreeContext, student_sha256: str) -> None:
    """`export.teacher_tokens`: the tree's Teacher sampled under the Student's vocabulary (tree.json
    `teacher_vocab`, recorded at explore from `teacher.tokenizer`); else an InputError naming the tree and both."""
    vocab = ctx.tree.teacher_vocab
    where = final_path(ctx.tree_dir)
    if not isinstance(vocab, dict) or not vocab.get("sha256"):
        raise InputError(
            f"{where}: no teacher_vocab: the tree does not record the Teacher's vocabulary, which "
            "export.teacher_tokens needs (set teacher.tokenizer, or use teacher.launch, and explore again)"
        )
    if vocab["sha256"] != student_sha256:
        raise InputError(
            f"{where}: the Teacher's vocabulary ({vocab.get('source')}, sha256 {str(vocab['sha256'])[:12]}) is not "
            f"the Student's (sha256 {student_sha256[:12]}): export.teacher_tokens needs the Teacher's tokenizer"
        )


def _granularity(settings: ExportSettings) -> Granularity:
    if settings.granularity not in GRANULARITIES:
        raise InputError(
            f"export.granularity: {settings.granularity!r} is not one of {', '.join(GRANULARITIES)}"
        )
    return settings.granularity


def export_settings(**values: object) -> ExportSettings:
    """`export` settings with the schema's defaults for what `values` leave out (tests, benchmarks)."""
    return section_settings(ExportSettings, {k: v for k, v in values.items() if v is not None})


def export_task(
    paths_files: Iterable[str | Path],
    granularity: str,
    refuse_native: bool = False,
    student: Student | None = None,
    special_text: str | None = None,
    pretokenized: bool = False,
    teacher_tokens: bool = False,
) -> tuple[list[SchemaDoc], ExportStats]:
    """One task's records in memory, as written (tests, benchmarks); `special_text` None: the schema's."""
    settings = export_settings(
        granularity=granularity,
        refuse_native=refuse_native,
        special_text=special_text,
        pretokenized=pretokenized,
        teacher_tokens=teacher_tokens,
    )
    stats = ExportStats()
    records = [r.to_doc() for r in iter_task_records(paths_files, settings, stats, student)]
    return records, stats


# --- ATIF (export.atif) -------------------------------------------------------------------------------------


def path_sessions(
    paths_files: Iterable[str | Path],
) -> Iterator[tuple[list[tuple[str, Step]], SchemaDoc, str, str | None]]:
    """Each selected path's answered model calls ((edge id, step record) in order), its metadata (the SFT
    records' path metadata, the tree's folder and the parent path), the agent backend and the Teacher's model."""
    for pf in paths_files:
        ctx = TreeContext.load(pf)
        for path in ctx.paths.selected:
            steps = [(e, s) for e in path.edges for s in _exported_steps(ctx, e) if _answered(s)]
            meta = _path_meta(ctx, path) | {
                "tree": tree_folder(ctx.tree_dir),
                "parent_path": list(path.edges[:-1]),
                "edge_scores": {e: ctx.edges[e].score if e in ctx.edges else None for e in path.edges},
            }
            model = steps[0][1]["request"].get("model") if steps else None
            yield steps, meta, tree_backend(ctx.tree), model if isinstance(model, str) else None


def write_atif(paths_files: Iterable[str | Path], out: str | Path) -> tuple[int, int, int]:
    """The selected paths as ATIF trajectories (`export.atif`, dataset/atif.py): (trajectories, agent steps
    with the Teacher's logprobs, without). Written whole or not at all."""
    n = kept = missing = 0
    with trajectory_writer(out) as w:
        for doc in trajectories(path_sessions(paths_files)):
            w.write(doc)
            n += 1
            k, m = with_logprobs(doc)
            kept, missing = kept + k, missing + m
    log.info("ATIF: %d trajectories (%d agent steps with logprobs, %d without) -> %s", n, kept, missing, out)
    return n, kept, missing


# --- CLI ------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--paths", nargs="+", required=True, help="paths.json files of one task's trees")
    parser.add_argument(
        "--out",
        required=True,
        help="JSONL to write (sft.jsonl; its stats, and with export.tree_packed the tree form, beside it)",
    )
    parser.add_argument(
        "--config",
        help="config.yaml whose `export` section says what to write (default: the repository's; a workflow run "
        "passes its effective config, results/.sftree/config.yaml)",
    )
    # Each option below overrides one key of the config's `export` section for a run by hand (validated with
    # it); left out, the config's value holds (the workflow passes none).
    parser.add_argument("--granularity", choices=GRANULARITIES, help="export.granularity")
    parser.add_argument(
        "--refuse-native",
        action="store_const",
        const=True,
        help="export.refuse_native: leave out the records of trees not made by the opencode backend (counted)",
    )
    parser.add_argument("--student", help="export.student.path: the Student's HF model folder or .gguf file")
    parser.add_argument("--student-max-length", type=int, help="export.student.max_length (with --student)")
    parser.add_argument("--student-chat-template", help="export.student.chat_template (with --student)")
    parser.add_argument(
        "--student-fit",
        choices=FIT_MODES,
        help="export.student.fit (with --student): fit (default) or strict",
    )
    parser.add_argument("--special-text", choices=MODES, help="export.special_text")
    parser.add_argument(
        "--pretokenized", action="store_const", const=True, help="export.pretokenized (with a Student)"
    )
    parser.add_argument(
        "--teacher-tokens",
        action="store_const",
        const=True,
        help="export.teacher_tokens (a Student with the Teacher's vocabulary)",
    )
    parser.add_argument(
        "--tree-packed",
        action="store_const",
        const=True,
        help="export.tree_packed: also write the tree form beside --out (sft.tree.jsonl; with a Student)",
    )
    parser.add_argument("--tree-max-tokens", type=int, help="export.tree_max_tokens")
    parser.add_argument(
        "--atif",
        action="store_const",
        const=True,
        help="export.atif: also write the selected paths as ATIF v1.8 trajectories beside --out (sft.atif.jsonl)",
    )


def cli_settings(args: argparse.Namespace) -> ExportSettings:
    """The `export` settings of `--config` with the options given on the command line (all checked by the schema).
    A Student named on the command line is a path from where the command runs."""
    export: dict[str, object] = {
        key: value
        for key, value in (
            ("granularity", args.granularity),
            ("refuse_native", args.refuse_native),
            ("special_text", args.special_text),
            ("pretokenized", args.pretokenized),
            ("teacher_tokens", args.teacher_tokens),
            ("tree_packed", args.tree_packed),
            ("tree_max_tokens", args.tree_max_tokens),
            ("atif", args.atif),
        )
        if value is not None
    }
    if args.student:
        if not args.student_max_length:
            raise InputError("--student needs --student-max-length (export.student.max_length)")
        template = args.student_chat_template
        student: dict[str, object] = {
            "path": str(Path(args.student).resolve()),
            "max_length": args.student_max_length,
            "chat_template": str(Path(template).resolve()) if template else None,
        }
        if args.student_fit:
            student["fit"] = args.student_fit
        export["student"] = student
    return load_settings(args.config, {"export": export} if export else None).export


def load_export_student(settings: ExportSettings) -> Student | None:
    """`export.student`, loaded (None when not set: the records are not measured). A relative path is taken from
    the repository root, as `teacher.launch`'s, so a run in another folder finds it."""
    student = settings.student
    if student is None:
        return None
    template = student.chat_template
    return load_student(
        _from_repo(student.path),
        student.max_length,
        _from_repo(template) if template else None,
        strict=student.fit == "strict",
    )


def _from_repo(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def run(args: argparse.Namespace) -> int:
    settings = cli_settings(args)
    student = load_export_student(settings)
    tree: list[PathTokens] | None = [] if settings.tree_packed else None
    stats = ExportStats()
    # A StudentError raised on any record leaves nothing written (the writer renames only on success).
    with record_writer(args.out) as out:
        for rec in iter_task_records(args.paths, settings, stats, student, tree):
            out.write(rec)
    write_stats(args.out, stats.to_dict())
    if settings.atif:
        write_atif(args.paths, atif_path(args.out))
    if tree is not None and student is not None:
        tree_out = tree_form_path(args.out)
        lines, tree_stats = pack_paths(tree, settings.tree_max_tokens, next((p.task for p in tree), None))
        write_tree_file(str(tree_out), lines, tree_stats)
        log.info("tree form: %d paths in %d parts -> %s", tree_stats.paths, len(lines), tree_out)
    log.info(
        "%d records (%s) from %d selected paths in %d trees -> %s; ill-formed steps never trained %s; "
        "skipped %s; refused %s; malformed arguments in histories %d",
        stats.records,
        settings.granularity,
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
