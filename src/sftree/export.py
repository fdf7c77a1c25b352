"""Selected paths -> messages+tools JSONL for SFT (`sftree export-sft`), and the merged dataset with its card.

Per task: `--paths P1 P2 ... --out results/<task>/sft.jsonl --granularity step|path`.
Merge: `--merge T1.jsonl T2.jsonl --out results/sft.jsonl --dataset-info results/dataset_info.json
--card results/dataset_card.md`.

A record is `{"messages": [...], "tools": [...], "metadata": {...}}` in OpenAI chat format
(`workflow/schemas/sft_record.schema.json`):

- step granularity (default): one record per model call (`kind` agent or nudge) on the selected paths:
  the exact request messages + the response + that step's tool results, so every `tool_calls` id is answered by
  exactly one `tool` message. **Choice**: an edge shared by several selected paths is exported once, attributed
  to the best-ranked selected path that holds it (its metadata lists all of them in `path_ranks`).
- path granularity: one record per selected path: the last such step of its last edge (its request already holds
  the whole session since the root), plus its response and tool results.
- `tool_calls[].function.arguments` are JSON objects. **Choice**: arguments that are not a JSON object are kept
  as `{"_raw": "<the string>"}` and counted in `metadata.malformed_arguments`, so nothing the Teacher did is
  silently rewritten. A record whose tool calls are not all answered exactly once (a turn cut off by a limit), or
  a request that failed (`response: null`, `error`), is skipped and counted.
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

from sftree.errors import InputError
from sftree.fileio import AtomicLines, iter_jsonl, read_json, write_json_atomic, write_text_atomic
from sftree.progress import Progress
from sftree.scoring import oriented

log = logging.getLogger("sftree.export")

EXPORTED_KINDS = ("agent", "nudge")
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


# --- inputs ---------------------------------------------------------------------------------------------


def read_steps(path: Path) -> list[dict]:
    """Step records of one edge (docs/architecture.md), errors naming file and line."""
    steps = []
    for n, rec in enumerate(iter_jsonl(path, "step records"), 1):
        if not isinstance(rec, dict) or not isinstance(rec.get("request"), dict):
            raise InputError(f"step records {path} record {n}: no `request` object")
        steps.append(rec)
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
        doc = read_json(paths_file, "selected paths file")
        if not isinstance(doc, dict) or not isinstance(doc.get("paths"), list):
            raise InputError(f"selected paths file {paths_file}: no `paths` list")
        tree_dir = paths_file.parent
        tree = read_json(tree_dir / "tree.json", "tree file")
        root = doc.get("root") or tree.get("root") or tree_dir.name
        meta_file = tree_dir.parent.parent / "roots" / root / "metadata.json"
        stage = tree.get("stage")
        if meta_file.is_file():
            stage = read_json(meta_file, "root metadata").get("stage", stage)
        else:
            log.warning("%s: root metadata %s not found; stage unknown", paths_file, meta_file)
        edges = {e["id"]: e for e in tree.get("edges", [])}
        return cls(paths_file, doc, tree_dir, tree, stage, edges)

    def transcript(self, edge_id: str) -> Path:
        rel = (self.edges.get(edge_id) or {}).get("transcript") or f"edges/{edge_id}/steps.jsonl"
        return self.tree_dir / rel


def _usage_tokens(step: dict) -> dict:
    u = step.get("usage") or {}
    prompt, completion = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def build_record(step: dict, meta: dict) -> tuple[dict | None, str | None]:
    """The SFT record of one step, or (None, why) when it cannot be one."""
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
    messages.append(msg)
    malformed += bad
    messages.extend(tool_message(r) for r in step.get("tool_results") or [])
    problems = pairing_problems(messages)
    if problems:
        return None, "; ".join(problems[:3])
    metadata = dict(meta)
    metadata.update(
        turn=step.get("turn"),
        step=step.get("step"),
        kind=step.get("kind", "agent"),
        usage=_usage_tokens(step),
        finish_reason=step.get("finish_reason"),
        malformed_arguments=malformed,
    )
    return {"messages": messages, "tools": list(req.get("tools") or []), "metadata": metadata}, None


def _path_meta(ctx: TreeContext, path: dict) -> dict:
    doc = ctx.doc
    meta = {
        "task": doc.get("task") or ctx.tree.get("task"),
        "root": doc.get("root") or ctx.tree.get("root"),
        "stage": ctx.stage,
        "direction": doc.get("direction") or ctx.tree.get("direction"),
        "root_score": doc.get("root_score"),
        "sandbox": ctx.tree.get("sandbox"),
        "path_rank": path["rank"],
        "leaf": path["leaf"],
        "leaf_reason": path.get("leaf_reason"),
        "path_nodes": path["nodes"],
        "path_edges": path["edges"],
    }
    meta.update({k: path.get(k) for k in PATH_FIELDS})
    return meta


def _exported_steps(ctx: TreeContext, edge_id: str) -> list[dict]:
    return [s for s in read_steps(ctx.transcript(edge_id)) if s.get("kind", "agent") in EXPORTED_KINDS]


@dataclass
class ExportStats:
    paths: int = 0
    records: int = 0
    skipped: Counter = field(default_factory=Counter)
    malformed_arguments: int = 0


def export_tree(ctx: TreeContext, granularity: str, stats: ExportStats) -> Iterator[dict]:
    selected = sorted((p for p in ctx.doc["paths"] if p.get("selected")), key=lambda p: p["rank"])
    stats.paths += len(selected)

    def emit(step: dict, meta: dict, edge_id: str) -> Iterator[dict]:
        meta = dict(meta, edge=edge_id, transcript=str(ctx.transcript(edge_id)))
        rec, why = build_record(step, meta)
        if rec is None:
            kind = (
                "no_response"
                if why.startswith("no response")
                else "bad_message"
                if why.startswith("bad message")
                else "unpaired_tool_calls"
            )
            stats.skipped[kind] += 1
            log.warning(
                "%s: skipping step %s/%s of %s: %s",
                ctx.paths_file,
                step.get("turn"),
                step.get("step"),
                edge_id,
                why,
            )
            return
        rec["metadata"]["id"] = (
            f"{meta['task']}/{meta['root']}/{edge_id}/t{step.get('turn')}s{step.get('step')}"
        )
        stats.records += 1
        stats.malformed_arguments += rec["metadata"]["malformed_arguments"]
        yield rec

    if granularity == "path":
        for path in selected:
            meta = _path_meta(ctx, path) | {"granularity": "path", "path_ranks": [path["rank"]]}
            last_edge = path["edges"][-1]
            # the last model call that answered (a failed request at the end holds nothing to learn)
            steps = [
                x
                for x in _exported_steps(ctx, last_edge)
                if isinstance(x.get("response"), dict) and not x.get("error")
            ]
            if not steps:
                stats.skipped["no_steps"] += 1
                log.warning(
                    "%s: path %d has no exportable step in %s", ctx.paths_file, path["rank"], last_edge
                )
                continue
            yield from emit(steps[-1], meta, last_edge)
        return

    # step granularity: each edge once, under the best-ranked selected path holding it
    ranks_of: dict[str, list[int]] = defaultdict(list)
    for path in selected:
        for e in path["edges"]:
            ranks_of[e].append(path["rank"])
    done: set[str] = set()
    for path in selected:
        meta = _path_meta(ctx, path) | {"granularity": "step"}
        for edge_id in path["edges"]:
            if edge_id in done:
                continue
            done.add(edge_id)
            for step in _exported_steps(ctx, edge_id):
                yield from emit(step, meta | {"path_ranks": ranks_of[edge_id]}, edge_id)


def iter_task_records(
    paths_files: Iterable[str | Path], granularity: str, stats: ExportStats
) -> Iterator[dict]:
    """Records of all selected paths of one task's trees, one tree at a time (nothing held in memory)."""
    paths_files = list(paths_files)
    progress = Progress("export-sft trees", total=len(paths_files), logger=log)
    for pf in paths_files:
        yield from export_tree(TreeContext.load(pf), granularity, stats)
        progress.update(records=stats.records)
    progress.finish(records=stats.records, paths=stats.paths)


def export_task(paths_files: Iterable[str | Path], granularity: str) -> tuple[list[dict], ExportStats]:
    stats = ExportStats()
    records = list(iter_task_records(paths_files, granularity, stats))
    return records, stats


# --- merge, dataset_info, card -------------------------------------------------------------------------


def iter_records(path: str | Path) -> Iterator[dict]:
    return iter_jsonl(path, "SFT file")


def llamafactory_messages(messages: list[dict]) -> list[dict]:
    """The same conversation in the shape LLaMA-Factory's `openai` converter accepts.

    It needs user/observation and assistant/function turns to alternate, so a user message that directly
    follows tool results (the prompt that starts the next rollout turn) is appended to the last tool result.
    Trailing tool results are dropped by LLaMA-Factory itself.
    """
    out: list[dict] = []
    for m in messages:
        if m["role"] == "user" and out and out[-1]["role"] == "tool":
            out[-1] = dict(out[-1], content=f"{out[-1]['content']}\n\n{m['content']}")
        else:
            out.append(m)
    return out


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
    root, best, direction = meta.get("root_score"), meta.get("max_score"), meta.get("direction")
    if root is None or best is None or direction not in ("maximize", "minimize"):
        return None
    return oriented(best, direction) - oriented(root, direction)


def _fmt(x: float | None, nd: int = 4) -> str:
    return "-" if x is None else f"{x:.{nd}g}" if abs(x) >= 1e4 else f"{x:.{nd}f}"


def dataset_card(records: list[dict], sft_name: str, lf_name: str | None = None) -> str:
    """Markdown card: counts by task/stage/root, token totals, score gains, how to load."""
    by_task: Counter[str] = Counter()
    by_stage: Counter[tuple[str, str]] = Counter()
    roots: dict[tuple[str, str], dict] = {}
    paths: dict[tuple[str, str, int], dict] = {}
    tokens = Counter()
    granularities = Counter()
    malformed = 0
    sandboxes: Counter[str] = Counter()
    for r in records:
        m = r["metadata"]
        sandboxes[str(m.get("sandbox") or "unknown")] += 1
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
    lines = [
        "# sftree SFT dataset",
        "",
        f"`{sft_name}`: {len(records)} records ({', '.join(f'{v} {k}' for k, v in granularities.items()) or 'none'}) "
        f"from {len(paths)} selected root-to-leaf paths of {len(roots)} trees, {len(by_task)} tasks. "
        "Each line is `{messages, tools, metadata}` in OpenAI chat format: assistant `tool_calls` with "
        "`arguments` as JSON objects, tool results as `role: tool` messages with `tool_call_id`, "
        "`reasoning_content` kept when the Teacher produced it.",
        "",
        "## Records by task and stage",
        "",
        "| task | early | middle | late | unknown | total |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    if sandboxes:
        note = ", ".join(f"{k}: {v} records" for k, v in sorted(sandboxes.items()))
        unsafe = " **Some records were made WITHOUT a sandbox** (`agent.sandbox: none`): their scores come from " \
            "code that ran unconfined." if "none" in sandboxes else ""
        lines[3:3] = [f"Sandbox (docs/security.md): {note}.{unsafe}", ""]
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
        f"total {tokens['total_tokens']} (the Teacher server's `usage` of each exported model call; "
        "a step record's context is its prompt, its trained target is the completion).",
        "",
        "## Score gains of the selected paths",
        "",
        "Gain = the path's best node score minus its root's (Student) score, oriented so that positive is better.",
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
            f'{malformed} tool-call arguments were not JSON objects and are kept as `{{"_raw": ...}}`.',
        ]
    lines += [
        "",
        "## Loading",
        "",
        "TRL (the `tools` column is passed to the chat template; train on assistant turns only):",
        "",
        "```python",
        "from datasets import load_dataset",
        "from trl import SFTConfig, SFTTrainer",
        "",
        f'ds = load_dataset("json", data_files="{sft_name}", split="train").remove_columns("metadata")',
        'trainer = SFTTrainer(model="Qwen/Qwen3-8B", train_dataset=ds, args=SFTConfig(assistant_only_loss=True))',
        "trainer.train()",
        "```",
        "",
        f"LLaMA-Factory: put `dataset_info.json` and `{lf_name or sft_name}` in your `dataset_dir` and set "
        f"`dataset: {DATASET_NAME}` in the training YAML (entry `{DATASET_NAME}`: `formatting: openai`, "
        "`observation_tag: tool`"
        + (
            f"; `{lf_name}` holds the same records with the prompt that starts a new rollout turn appended to the "
            "tool result before it, because LLaMA-Factory needs strictly alternating turns)."
            if lf_name
            else ")."
        ),
        "",
        "See `docs/outputs.md` for every field of `metadata`.",
        "",
    ]
    return "\n".join(lines)


def merge(
    inputs: list[str], out: str, info: str | None, card: str | None, llamafactory: str | None = None
) -> int:
    """Concatenate per-task files (streaming), write the LLaMA-Factory copy, dataset_info.json and the card."""
    metadata: list[dict] = []  # the card needs only these, not the messages
    with contextlib.ExitStack() as stack:
        main = stack.enter_context(AtomicLines(out))
        lf = stack.enter_context(AtomicLines(llamafactory)) if llamafactory else None
        progress = Progress("merge-sft records", logger=log)
        for f in inputs:
            for rec in iter_records(f):
                main.write(rec)
                if lf:
                    lf.write(dict(rec, messages=llamafactory_messages(rec["messages"])))
                metadata.append(rec.get("metadata") or {})
                progress.update()
        progress.finish(files=len(inputs))
    if info:
        write_json_atomic(info, dataset_info(llamafactory or out, info))
    if card:
        lf_name = Path(llamafactory).name if llamafactory else None
        write_text_atomic(card, dataset_card([{"metadata": m} for m in metadata], Path(out).name, lf_name))
    log.info("merged %d records from %d files -> %s", main.count, len(inputs), out)
    return main.count


# --- CLI ------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--paths", nargs="*", default=None, help="paths.json files of one task's trees")
    parser.add_argument("--merge", nargs="*", default=None, help="per-task sft.jsonl files to merge")
    parser.add_argument("--out", required=True, help="JSONL to write")
    parser.add_argument("--granularity", choices=("step", "path"), default="step")
    parser.add_argument("--dataset-info", help="merge mode: LLaMA-Factory dataset_info.json to write")
    parser.add_argument("--card", help="merge mode: dataset card (Markdown) to write")
    parser.add_argument(
        "--llamafactory-out",
        help="merge mode: the records reshaped for LLaMA-Factory (dataset_info points here)",
    )


def run(args: argparse.Namespace) -> int:
    if (args.paths is None) == (args.merge is None):
        raise InputError("give exactly one of --paths (per-task export) or --merge (merge per-task files)")
    if args.merge is not None:
        missing = [f for f in args.merge if not Path(f).is_file()]
        if missing:
            raise InputError(f"SFT files to merge not found: {', '.join(missing)}")
        merge(args.merge, args.out, args.dataset_info, args.card, args.llamafactory_out)
        return 0
    stats = ExportStats()
    with AtomicLines(args.out) as out:
        for rec in iter_task_records(args.paths, args.granularity, stats):
            out.write(rec)
    log.info(
        "%d records (%s) from %d selected paths in %d trees -> %s; skipped %s; malformed arguments %d",
        stats.records,
        args.granularity,
        stats.paths,
        len(args.paths),
        args.out,
        dict(stats.skipped) or 0,
        stats.malformed_arguments,
    )
    return 0
