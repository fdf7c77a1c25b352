"""All tasks' SFT files -> the dataset (`sftree merge-sft`, the `merge_sft` rule).

`sftree merge-sft T1.jsonl T2.jsonl --out results/sft.jsonl [--dataset-info results/dataset_info.json]
[--card results/dataset_card.md] [--llamafactory-out results/sft_llamafactory.jsonl] [--results DIR] [--dedupe]`:
concatenates the per-task files (streaming), writes the LLaMA-Factory copy (dataset/llamafactory.py), its
`dataset_info.json` entry and the card (dataset/card.py), and sums the per-task stats files into
`results/sft.stats.json` (the card and the report read them).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from pathlib import Path

from sftree.dataset.atif import merge_trajectories
from sftree.dataset.card import card_text
from sftree.dataset.dedupe import Dedupe
from sftree.dataset.figures import DatasetFigures
from sftree.dataset.llamafactory import dataset_info, llamafactory_record, turn_boundaries
from sftree.dataset.stats import ExportStats, MergeStats
from sftree.dataset.tree_packed import merge_tree_files
from sftree.errors import InputError
from sftree.fileio import write_json_atomic, write_text_atomic
from sftree.progress import Progress
from sftree.records.atif import atif_path
from sftree.records.sft import (
    STATS_VERSION,
    MergedRecord,
    iter_records,
    lines_writer,
    read_stats,
    record_writer,
    stats_path,
    write_figures,
    write_stats,
)
from sftree.records.tree import SchemaDoc
from sftree.records.tree_packed import tree_form_path
from sftree.records.trust import read_results
from sftree.settings import load_settings

log = logging.getLogger("sftree.dataset.merge")


def merge(
    inputs: list[str],
    out: str,
    info: str | None,
    card: str | None,
    llamafactory: str | None = None,
    dedupe: bool = False,
    results: str | None = None,
    tree: tuple[list[str], str] | None = None,
) -> MergeStats:
    """Concatenate per-task files (streaming), write the LLaMA-Factory copy, dataset_info.json and the card.

    Duplicate trained messages (dataset/dedupe.py) are counted; with `dedupe` they are removed. The inputs'
    stats files (`stats_path`) are summed into the merged one beside `out`, with the merge's own counts; the
    figures of the records written (dataset/figures.py) go beside it too, for the card and the report. `tree`: (the
    tasks' tree-form files, the merged one to write: dataset/tree_packed.py), its figures in the card.
    """
    stats = MergeStats()
    if tree:
        stats.tree = merge_tree_files(*tree)
    stats.export = _summed_stats(inputs, stats.missing_stats)
    figures = _write_records(inputs, out, llamafactory, dedupe, stats)
    write_stats(out, _stats_doc(stats, len(inputs)))
    write_figures(out, figures.to_dict())
    if info:
        write_json_atomic(info, dataset_info(llamafactory or out, info))
    if card:
        trust = read_results(Path(results), figures.tasks or None) if results else None
        lf_name = Path(llamafactory).name if llamafactory else None
        write_text_atomic(card, card_text(figures, Path(out).name, lf_name, trust, stats, dedupe))
    log.info(
        "merged %d records from %d files -> %s; %d duplicate trained messages (%d records dropped)",
        stats.records,
        len(inputs),
        out,
        stats.duplicates,
        stats.dropped,
    )
    return stats


def _summed_stats(inputs: list[str], missing: list[str]) -> ExportStats | None:
    """The inputs' export stats summed (None when none has a stats file); inputs without one go to `missing`."""
    total: ExportStats | None = None
    for f in inputs:
        sp = stats_path(f)
        if not sp.is_file():
            missing.append(str(f))
            log.warning("%s: no export stats file %s; its left-out steps are not counted", f, sp)
            continue
        one = ExportStats.from_dict(read_stats(sp), str(sp))
        if total is None:
            total = one
        else:
            total.add(one)
    return total


def _write_records(
    inputs: list[str], out: str, llamafactory: str | None, dedupe: bool, stats: MergeStats
) -> DatasetFigures:
    """Stream the inputs into `out` (and the LLaMA-Factory copy), counting into `stats`; the written records'
    figures."""
    figures = DatasetFigures()
    dedupe_ = Dedupe(drop=dedupe)
    with contextlib.ExitStack() as stack:
        main = stack.enter_context(record_writer(out))
        lf = stack.enter_context(lines_writer(llamafactory)) if llamafactory else None
        progress = Progress("merge-sft records", logger=log)
        for f in inputs:
            for read in iter_records(f):
                rec, duplicate = dedupe_.check(read)  # dataset/dedupe.py: per trained message
                if rec is None:
                    continue
                main.write(rec)
                n = turn_boundaries(rec)
                stats.boundaries += n
                stats.boundary_records += n > 0
                if lf and isinstance(rec, MergedRecord):
                    stats.llamafactory_left_out += 1
                elif lf:
                    lf.write(llamafactory_record(rec))
                figures.add(rec, duplicate)
                progress.update()
        progress.finish(files=len(inputs))
    stats.records = main.count
    stats.duplicates, stats.dropped = dedupe_.duplicates, dedupe_.dropped
    stats.untrained, stats.kept_in_path_records = dedupe_.untrained, dedupe_.kept_in_path_records
    return figures


def _stats_doc(stats: MergeStats, inputs: int) -> SchemaDoc:
    """The merged stats file: the inputs' stats summed, plus the merge's own counts."""
    return (stats.export.to_dict() if stats.export else {"version": STATS_VERSION}) | {
        "merge": {
            "inputs": inputs,
            "records": stats.records,
            "duplicates": stats.duplicates,
            "dropped": stats.dropped,
            "untrained_duplicates": stats.untrained,
            "duplicates_kept_in_path_records": stats.kept_in_path_records,
            "turn_boundaries": stats.boundaries,
            "turn_boundary_records": stats.boundary_records,
            "llamafactory_left_out": stats.llamafactory_left_out,
            "missing_stats": list(stats.missing_stats),
        }
    }


# --- CLI ------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", help="per-task sft.jsonl files to merge")
    parser.add_argument("--out", required=True, help="the merged JSONL to write")
    parser.add_argument("--dataset-info", help="LLaMA-Factory dataset_info.json to write")
    parser.add_argument("--card", help="dataset card (Markdown) to write")
    parser.add_argument(
        "--llamafactory-out",
        help="the records reshaped for LLaMA-Factory (dataset_info points here)",
    )
    parser.add_argument(
        "--config",
        help="config.yaml whose `export` section says what to merge (export.dedupe, export.tree_packed: the tasks' "
        "tree forms beside their sft.jsonl); default: the repository's",
    )
    parser.add_argument(
        "--dedupe",
        action="store_const",
        const=True,
        help="export.dedupe for this run: leave out trained messages that an earlier record trains",
    )
    parser.add_argument(
        "--tree-packed",
        action="store_const",
        const=True,
        help="export.tree_packed for this run: merge the tasks' tree forms (sft.tree.jsonl beside each input)",
    )
    parser.add_argument(
        "--atif",
        action="store_const",
        const=True,
        help="export.atif for this run: merge the tasks' ATIF trajectories (sft.atif.jsonl beside each input)",
    )
    parser.add_argument(
        "--results",
        help="the results folder, for the card's gains, skipped snapshots and sandbox",
    )


def run(args: argparse.Namespace) -> int:
    settings = load_settings(args.config).export
    dedupe = settings.dedupe if args.dedupe is None else args.dedupe
    tree_packed = settings.tree_packed if args.tree_packed is None else args.tree_packed
    tree_inputs = [str(tree_form_path(f)) for f in args.inputs] if tree_packed else []
    atif = settings.atif if args.atif is None else args.atif
    atif_inputs = [str(atif_path(f)) for f in args.inputs] if atif else []
    missing = [f for f in [*args.inputs, *tree_inputs, *atif_inputs] if not Path(f).is_file()]
    if missing:
        raise InputError(f"SFT files to merge not found: {', '.join(missing)}")
    merge(
        args.inputs,
        args.out,
        args.dataset_info,
        args.card,
        args.llamafactory_out,
        dedupe=dedupe,
        results=args.results,
        tree=(tree_inputs, str(tree_form_path(args.out))) if tree_packed else None,
    )
    if atif:
        merge_trajectories(atif_inputs, atif_path(args.out))
    return 0
