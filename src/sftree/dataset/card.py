"""The dataset card (`dataset_card.md`): counts by task, stage and root, tokens, whether to trust the data (gains,
snapshots skipped, sandbox, backend, Coral), the steps never trained and why, the Student's figures, how the
LLaMA-Factory copy differs, how to load. Written by `merge-sft` (dataset/merge.py) from the figures it counted
(dataset/figures.py), the same the report shows."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping

from sftree.dataset.figures import DatasetFigures, PathFigures, figures_of
from sftree.dataset.llamafactory import DATASET_NAME
from sftree.dataset.stats import ExportStats, MergeStats
from sftree.dataset.student import DROP_TOO_LONG, UNFIT_REASONS, StudentStats
from sftree.records.sft import EXCLUSION_REASONS, OPENCODE
from sftree.records.tree import SchemaDoc
from sftree.records.trust import TaskTrust


def _fmt(x: float | None, nd: int = 4) -> str:
    return "-" if x is None else f"{x:.{nd}g}" if abs(x) >= 1e4 else f"{x:.{nd}f}"


def _trust_lines(trust: list[TaskTrust]) -> list[str]:
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


def _counts(c: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in c.items() if v) or "none"


def _backend_lines(backends: Counter[str], corals: Counter[str], export: ExportStats | None) -> list[str]:
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
        f'Turns by how they ended (docs/real_teacher.md, "End reasons"): {_counts(dict(sorted(export.turn_ends.items())))}.',
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


def _fit_lines(st: StudentStats) -> list[str]:
    """The template's family and what was adapted to it (dataset/fit.py), with the records each touched."""
    touched = (
        ", ".join(f"`{a}` {st.adaptations.get(a, 0)} records" for a in st.fit) if st.fit else "none needed"
    )
    lines = [
        f"Template family: {st.family or 'unknown'}. Fitted to it (`export.student.fit`): {touched}.",
        "",
    ]
    excluded = {k: v for k, v in st.dropped.items() if k in UNFIT_REASONS}
    if excluded:
        lines += [
            "Records the template cannot hold, excluded: "
            + "; ".join(f"`{k}` {v} ({UNFIT_REASONS[k]})" for k, v in sorted(excluded.items()))
            + ".",
            "",
        ]
    return lines


def _student_lines(merged: MergeStats | None) -> list[str]:
    """Card section: the records under the Student's tokenizer, template and max_length (`export.student`)."""
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
        *_fit_lines(st),
        *_tokenizer_lines(st.tokenizer or {}),
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


def forms_rows(merged: MergeStats | None) -> list[tuple[str, int, int]]:
    """(form, tokens processed, tokens trained) of each form the export measured under the Student: the step form
    (what the merged form's steps would cost), the form written, and the path and tree forms when the tree form
    was written (`export.tree_packed`). Tokens trained: each once (the path form's loss counts a token shared by
    paths once per path: `TreeStats.objective`)."""
    export = merged.export if merged else None
    st = export.student if export else None
    tree = merged.tree if merged else None
    rows: list[tuple[str, int, int]] = []
    if export is not None and st is not None and st.trained:
        form = export.granularity or "step"
        if form == "merged" and st.as_steps:
            rows.append(("step", st.as_steps, st.trained))
        if form != "path" or tree is None:
            rows.append((form, st.processed, st.trained))
    if tree is not None and tree.trained:
        # the path form's distinct trained tokens are the tree's (its loss counts them `objective` times)
        rows += [("path", tree.path_processed, tree.trained), ("tree", tree.processed, tree.trained)]
    return rows


def forms_lines(merged: MergeStats | None) -> list[str]:
    """Card section: tokens processed per trained token, form by form (docs/benchmarks.md)."""
    rows = forms_rows(merged)
    if len(rows) < 2:
        return []
    lines = [
        "## Forms under the Student",
        "",
        "| form | tokens processed | tokens trained | processed per trained token |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {f} | {p} | {t} | {p / t:.2f} |" for f, p, t in rows]
    lines += [
        "",
        "Each form trains the same tokens; the fewer tokens processed per trained token, the cheaper the epoch. "
        "Train the tree form where the trainer takes it (`sft.tree.jsonl`, dataset/tree_collator.py), else the "
        "merged form; the step form is for trainers that take one completion per record (docs/outputs.md).",
    ]
    tree = merged.tree if merged else None  # two rows or more: merged is set
    if tree is not None and tree.parts:
        lines += [
            "",
            f"Tree form (`sft.tree.jsonl`): {tree.paths} paths in {tree.parts} parts (`export.tree_max_tokens` "
            f"{tree.max_tokens}, longest {tree.longest}); unsplit, the trees would be {tree.unsplit} tokens, so the "
            f"parts repeat {tree.processed - tree.unsplit} for their ancestors; paths dropped: "
            f"{_counts(tree.dropped)}. Its weights make each part's loss the path form's (docs/outputs.md): the "
            f"{tree.trained} trained tokens weigh {tree.objective} in all, as often as the paths train them.",
        ]
    return lines + [""]


def _tokenizer_lines(tok: Mapping[str, object]) -> list[str]:
    """Card: the one tokenizer the figures come from, and which loader gives the same tokens."""
    line = (
        f"Tokenizer of these figures: `{tok.get('file')}` ({tok.get('kind')}, sha256 of the tokenizer as read: "
        f"`{tok.get('sha256')}`). The counts hold for this tokenizer only: train with the very same one."
    )
    if tok.get("kind") == "gguf":
        line += (
            " It was rebuilt from the GGUF's `tokenizer.ggml.*` with every control and user-defined token as one "
            "token, as the model's own HF `tokenizer.json` has them. transformers' GGUF loader (`gguf_file=`) "
            "does not keep the user-defined ones (`<tool_call>`, `</tool_call>`, ... become several tokens), so "
            "its counts differ: load the Student's HF folder (`AutoTokenizer.from_pretrained(folder)`), or train "
            "the pre-tokenized rows (`export.pretokenized`)."
        )
    return [line, ""]


def _special_text_lines(merged: MergeStats | None) -> list[str]:
    """Card section: records whose data holds control-token text (`export.special_text`)."""
    sp = merged.export.special_text if merged and merged.export else None
    if sp is None:
        return []
    source = (
        "the Student's own special and added tokens"
        if sp.source == "student"
        else "no Student was set, so the control strings of the common chat families (ChatML/Qwen, Llama 3, Gemma, "
        "Mistral, DeepSeek, Phi: `sftree.dataset.special_text.BUILTIN`)"
    )
    what = {
        "drop": "dropped (`export.special_text: drop`), so no written record holds such text",
        "split": "kept and tokenized with the data text as plain text (`export.special_text: split`, the "
        "pre-tokenized `input_ids`): train those ids, never a re-rendering",
        "keep": "**kept as they are** (`export.special_text: keep`): a trainer that renders and tokenizes them "
        "turns that text into control tokens (turn boundaries and turns nobody wrote)",
    }.get(sp.mode, f"handled by `{sp.mode}`")
    return [
        "## Control-token text in the data",
        "",
        f"Looked for: {source}, in every string the template renders from the data (system, user and tool "
        "messages, tool-call arguments, tool schemas, the Teacher's own text). Records (merged form: steps) "
        f"holding such text: {sp.records}, {what}. By role: {_counts(sp.roles)}; by string: "
        f"{_counts(sp.strings)}.",
        "",
    ]


STEP_FORM = (
    "Each line is `{prompt, completion, tools, metadata}` (TRL's conversational prompt-completion form): "
    "`completion` is the one assistant message the record trains, `prompt` every message before it."
)
MERGED_FORM = (
    "Each line is `{messages, tools, metadata}`: a run of consecutive steps of one session; only the "
    "assistant messages at `metadata.trained` are trained (each one step's completion, once, in the "
    "context it saw); every other message is context. Train it with the marked tokens "
    '(`sftree.dataset.trainer_labels.token_labels`: docs/outputs.md, "Training").'
)
PATH_FORM = (
    "Each line is `{messages, tools, metadata}`: the whole session of a selected path, every assistant "
    "turn trained."
)


def dataset_card(
    records: list[SchemaDoc],
    sft_name: str,
    lf_name: str | None = None,
    trust: list[TaskTrust] | None = None,
    merged: MergeStats | None = None,
    dedupe: bool = False,
) -> str:
    """The card of records in memory (`card_text` of their figures)."""
    return card_text(figures_of(records), sft_name, lf_name, trust, merged, dedupe)


def card_text(
    fig: DatasetFigures,
    sft_name: str,
    lf_name: str | None = None,
    trust: list[TaskTrust] | None = None,
    merged: MergeStats | None = None,
    dedupe: bool = False,
) -> str:
    """Markdown card: counts by task/stage/root, tokens, trust (gains, skipped snapshots, sandbox, backend, Coral),
    the steps never trained and why, how the LLaMA-Factory copy differs, how to load."""
    step = fig.granularities.get("step", 0) > 0
    merged_form = not step and fig.granularities.get("merged", 0) > 0
    lines = _header_lines(fig, sft_name, STEP_FORM if step else MERGED_FORM if merged_form else PATH_FORM)
    lines += forms_lines(merged)  # first: which form to train, the forms side by side
    lines += _backend_lines(fig.backends, fig.corals, merged.export if merged else None)
    lines += _sandbox_lines(fig.sandboxes)
    if merged is not None:
        lines += _duplicate_lines(merged, dedupe)
    if trust:
        lines += _trust_lines(trust)
    lines += _untrained_lines(merged, fig.history_excluded, step)
    lines += _student_lines(merged)
    lines += teacher_token_lines(merged.export if merged else None)
    lines += _special_text_lines(merged)
    lines += _count_lines(fig)
    lines += _gain_lines(fig)
    if fig.malformed:
        lines += [
            "",
            f"{fig.malformed} tool-call arguments in the records' history (never in a trained message) were not "
            'JSON objects and are kept as `{"_raw": ...}`.',
        ]
    if merged_form:
        return "\n".join(lines + _merged_loading_lines(sft_name))
    return "\n".join(lines + _loading_lines(sft_name, lf_name, step, merged))


def teacher_token_lines(export: ExportStats | None) -> list[str]:
    """Card: the replies on the selected paths with and without the Teacher's tokens and logprobs
    (`teacher.logprobs`); nothing when no reply was asked for them."""
    counts = export.teacher_logprobs if export is not None else Counter()
    asked = {k: v for k, v in counts.items() if k != "not_asked"}
    if not asked:
        return []
    missing = {k: v for k, v in sorted(asked.items()) if k != "kept"}
    return [
        "",
        f"Teacher tokens (`teacher.logprobs`): {counts['kept']} replies keep the sampled token ids, logprobs and "
        "top-K"
        + (
            f"; {sum(missing.values())} asked for them keep none ({_counts(missing)}: recorded absent, never "
            "invented)"
            if missing
            else " (every reply asked for them)"
        )
        + (f"; {counts['not_asked']} were not asked for them" if counts["not_asked"] else "")
        + ".",
    ] + same_tokenizer_lines(export)


def same_tokenizer_lines(export: ExportStats | None) -> list[str]:
    """Card: `export.teacher_tokens`, the trained replies whose render under the Student is the Teacher's sampled
    ids, those trained on the sampled ids instead, and those marked (dataset/teacher_tokens.py)."""
    c = export.teacher_tokens if export is not None else Counter()
    if not c:
        return []
    marked = {k: c[k] for k in ("rendered", "no_tokens", "no_ids", "misaligned") if c[k]}
    return [
        "",
        f"Same-tokenizer export (`export.teacher_tokens`): of {sum(c.values())} trained replies, the Student's "
        f"render gives the Teacher's sampled ids for {c['same']} and other ids for "
        f"{c['substituted'] + c['rendered']}; {c['substituted'] + c['same']} train exactly the sampled ids"
        + (
            f"; {sum(marked.values())} train the render, marked in `metadata.teacher_tokens` ({_counts(marked)})"
            if marked
            else ""
        )
        + ".",
    ]


def _header_lines(fig: DatasetFigures, sft_name: str, form: str) -> list[str]:
    tasks = {task for task, _ in fig.by_task_stage}
    kinds = ", ".join(f"{v} {k}" for k, v in fig.granularities.items()) or "none"
    return [
        "# sftree SFT dataset",
        "",
        f"`{sft_name}`: {fig.records} records ({kinds}) "
        f"from {len(fig.paths)} selected root-to-leaf paths of {len(fig.roots)} trees, {len(tasks)} tasks. {form} "
        "OpenAI chat messages: assistant `tool_calls` with `arguments` as JSON objects, tool results as "
        "`role: tool` messages with `tool_call_id` and `name`, `reasoning_content` kept when the Teacher produced "
        "it.",
        "",
    ]


def _sandbox_lines(sandboxes: Counter[str]) -> list[str]:
    if not sandboxes:
        return []
    note = ", ".join(f"{k}: {v} records" for k, v in sorted(sandboxes.items()))
    unsafe = (
        " **Some records were made WITHOUT a sandbox** (`agent.sandbox: none`): their scores come from "
        "code that ran unconfined."
        if "none" in sandboxes
        else ""
    )
    return [f"Sandbox (docs/security.md): {note}.{unsafe}", ""]


def _duplicate_lines(merged: MergeStats, dedupe: bool) -> list[str]:
    """Card: trained messages that an earlier record already trains (dataset/dedupe.py), and what was removed."""
    if not dedupe:
        done = "kept (set `export.dedupe: true` to remove them)."
    else:
        done = (
            f"removed (`export.dedupe: true`): {merged.dropped} records left out (every trained message a "
            f"duplicate), {merged.untrained} messages untrained inside kept merged records"
            + (
                f", {merged.kept_in_path_records} kept in path records (a path record trains every turn)"
                if merged.kept_in_path_records
                else ""
            )
            + "."
        )
    return [
        "Duplicate trained messages (the same message, tool-call ids aside, as one an earlier record trains; "
        f"counted per trained message in every form): {merged.duplicates}; {done}",
        "",
    ]


def _count_lines(fig: DatasetFigures) -> list[str]:
    """Card sections: records by task and stage, by root; tokens."""
    by_task: Counter[str] = Counter()
    for (task, _), n in fig.by_task_stage.items():
        by_task[task] += n
    lines = [
        "## Records by task and stage",
        "",
        "| task | early | middle | late | unknown | total |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for task in sorted(by_task):
        cells = [str(fig.by_task_stage[(task, s)]) for s in ("early", "middle", "late", "unknown")]
        lines.append(f"| {task} | {' | '.join(cells)} | {by_task[task]} |")
    lines += [
        "",
        "## Records by root",
        "",
        "| task | root | stage | records | tokens (prompt+completion) | completion tokens |",
        "|---|---|---|---:|---:|---:|",
    ]
    for (task, root), row in sorted(fig.roots.items()):
        lines.append(
            f"| {task} | {root} | {row['stage']} | {row['records']} | {row['tokens']} | {row['completion']} |"
        )
    tokens = fig.tokens
    return lines + [
        "",
        "## Tokens",
        "",
        f"Prompt tokens {tokens['prompt_tokens']}, completion tokens {tokens['completion_tokens']}, "
        f"total {tokens['total_tokens']} (the Teacher server's `usage` of each exported model call).",
        "",
    ]


def _gain_lines(fig: DatasetFigures) -> list[str]:
    """Card section: per task the best-node gains of the selected paths."""
    lines = [
        "## Best-node gains of the selected paths",
        "",
        "Gain here = the path's best node score (not its leaf's, as above) minus its root's (Student) score, "
        "oriented so that positive is better.",
        "",
        "| task | paths | improved | mean gain | best gain | mean PathScore |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    by_task_paths: dict[str, list[PathFigures]] = defaultdict(list)
    for (task, _, _), p in fig.paths.items():
        by_task_paths[task].append(p)
    for task in sorted(by_task_paths):
        ps = by_task_paths[task]
        gains = [p["gain"] for p in ps if p["gain"] is not None]
        scores = [p["path_score"] for p in ps if p["path_score"] is not None]
        lines.append(
            f"| {task} | {len(ps)} | {sum(g > 0 for g in gains)} | {_fmt(sum(gains) / len(gains) if gains else None)}"
            f" | {_fmt(max(gains) if gains else None)} | {_fmt(sum(scores) / len(scores) if scores else None)} |"
        )
    return lines


def _merged_loading_lines(sft_name: str) -> list[str]:
    """Card: how to train the merged form (its trained tokens marked by the Student's tokenizer)."""
    return [
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


def _loading_lines(sft_name: str, lf_name: str | None, step: bool, merged: MergeStats | None) -> list[str]:
    """Card: how to train the step or path form with TRL and with LLaMA-Factory."""
    trl_cols = '"prompt", "completion", "tools"' if step else '"messages", "tools"'
    return [
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
