"""`sftree explore --root DIR --out TREEDIR [--config config.yaml]`: grow one root's MCTS tree.

Resumable: `tree.live.json` is rewritten atomically after every edge; a rerun of a killed job loads it, discards
the edges that were running (their worktrees and partial transcripts) and continues. The declared output
`tree.json` is written once, when the search stops (Snakemake deletes declared outputs before a job runs, so it
cannot hold the live state). A rerun without `tree.live.json` (e.g. `--forcerun explore`) starts afresh.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from dataclasses import replace
from pathlib import Path

from sftree import search
from sftree import tree as treemod
from sftree.config import load_config, task_config
from sftree.errors import InputError
from sftree.fileio import read_json

log = logging.getLogger(__name__)

# Folders of a tree directory that belong to one exploration (wiped when a fresh one starts).
RUN_DIRS = ("store", "work", "edges", "sessions")
# Params that only change how the search runs, not which tree it grows: a resumed run takes them from config.
OPERATIONAL = ("parallel_width", "schedule", "keep_workspaces")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root", required=True, help="root snapshot folder (results/<task>/roots/<snapshot>)"
    )
    parser.add_argument("--out", required=True, help="tree folder (results/<task>/trees/<snapshot>)")
    parser.add_argument("--config", help="config.yaml (default: the repository's)")
    parser.add_argument(
        "--width",
        type=int,
        help="at most this many expansions at once (the workflow passes the teacher_slots Snakemake granted); "
        "lowers search.parallel_width, never raises it",
    )


def read_root(root_dir: Path, config: dict) -> dict:
    """Task, direction, raw score and eval count of a root snapshot (metadata.json, annotated by select-roots)."""
    meta_path = root_dir / "metadata.json"
    meta = read_json(meta_path, "root metadata")
    if not isinstance(meta, dict):
        raise InputError(f"{meta_path}: expected a JSON object")
    task = meta.get("task") or (root_dir.parent.parent.name if root_dir.parent.name == "roots" else None)
    if not task:
        raise InputError(f"{meta_path}: no `task` field, and the path is not results/<task>/roots/<snapshot>")
    task_cfg = task_config(config, task)
    direction = meta.get("direction") or task_cfg["direction"]
    score = meta.get("score")
    if score is None:
        score = _attempt_score(root_dir, meta.get("commit_hash"))
    if score is not None and not isinstance(score, int | float):
        raise InputError(f"{meta_path}: `score` must be a number or null, not {score!r}")
    eval_count = meta.get("eval_count")
    if eval_count is not None and not isinstance(eval_count, int):
        raise InputError(f"{meta_path}: `eval_count` must be an integer, not {eval_count!r}")
    return {
        "task": task,
        "task_cfg": task_cfg,
        "direction": direction,
        "score": score,
        "eval_count": eval_count,
    }


def _attempt_score(root_dir: Path, commit: str | None) -> float | None:
    """The snapshot's own attempt record's score, when select-roots did not annotate it."""
    if not commit:
        return None
    attempts = root_dir / "shared" / "attempts"
    for f in sorted(attempts.glob(f"{commit[:7]}*.json")) if attempts.is_dir() else []:
        rec = read_json(f, "attempt record")
        if isinstance(rec, dict) and str(rec.get("commit_hash", f.stem)).startswith(commit[:7]):
            return rec.get("score")
    return None


def _resume(live: Path, out: Path, root_name: str, task: str, params: treemod.SearchParams) -> treemod.Tree:
    tree = treemod.load(live)
    if tree.root != root_name or tree.task != task:
        raise InputError(f"{live} belongs to {tree.task}/{tree.root}, not {task}/{root_name}")
    for d in tree.in_flight:  # half-done edges: dropped, their ids are not reused
        log.info("discarding half-done edge %s (from %s)", d["edge"], d["node"])
    tree.in_flight = []
    finished = {e.id for e in tree.edges}
    for d in sorted((out / "edges").iterdir()) if (out / "edges").is_dir() else []:
        if d.name not in finished:  # transcripts of edges that never finished
            shutil.rmtree(d, ignore_errors=True)
    for f in sorted((out / "sessions").glob("*.json")) if (out / "sessions").is_dir() else []:
        if f.stem not in finished:
            f.unlink()
    changed = {
        k for k in vars(params) if k not in OPERATIONAL and getattr(params, k) != getattr(tree.params, k)
    }
    if changed:
        log.warning(
            "resuming with the tree's own search params; config differs in %s", ", ".join(sorted(changed))
        )
    tree.params = replace(tree.params, **{k: getattr(params, k) for k in OPERATIONAL})
    c = tree.counters()
    log.info("resuming %s: %d edges done, %d nodes", live, c["edges"], len(tree.nodes))
    return tree


def _grow(tree, root_dir: Path, out: Path, config: dict, info: dict, params) -> treemod.Tree:
    """Create or continue the tree with the edge runtime until a stop rule holds."""
    from sftree.edge import EdgeContext, run_edge
    from sftree.workspace import NodeState

    live = out / treemod.LIVE_NAME
    ctx = EdgeContext.create(out, root_dir, config, info["task_cfg"])
    try:
        ctx.store.cleanup_stale(keep=set())  # nothing runs yet: every worktree is a leftover
        if tree is None:
            tree = treemod.Tree.new(
                info["task"], root_dir.name, info["direction"], params, info["score"],
                ctx.root_state.to_dict(), info["eval_count"],
            )  # fmt: skip
            log.info("new tree for %s/%s (root score %s, %s)", info["task"], root_dir.name, info["score"],
                     info["direction"])  # fmt: skip
        treemod.save(tree, live)

        def run_one(d: search.Dispatch):
            return run_edge(
                ctx, NodeState.from_dict(d.parent_state), d.edge, d.parent_score,
                depth=d.depth, attempt=d.attempt, eval_count=d.parent_eval_count or 0,
            )  # fmt: skip

        return search.run_search(tree, run_one, lambda t: treemod.save(t, live))
    finally:
        ctx.close()  # worktrees removed unless keep_workspaces; a teacher-sim it started is stopped


def cap_width(params: treemod.SearchParams, width: int | None) -> treemod.SearchParams:
    """`parallel_width` lowered to the granted slots, so a global `teacher_slots` limit holds across jobs."""
    if width is None:
        return params
    if width < 1:
        raise InputError(f"--width must be at least 1, not {width}")
    if width < params.parallel_width:
        log.info("parallel_width %d capped to %d granted teacher slots", params.parallel_width, width)
        return replace(params, parallel_width=width)
    return params


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    root_dir, out = Path(args.root).resolve(), Path(args.out).resolve()
    if not root_dir.is_dir():
        raise InputError(f"root snapshot folder not found: {root_dir}")
    info = read_root(root_dir, config)
    params = treemod.SearchParams.from_config(config["search"])
    live, final = out / treemod.LIVE_NAME, out / treemod.FINAL_NAME
    out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / "explore.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    logging.getLogger().addHandler(handler)
    try:
        params = cap_width(params, args.width)
        tree = _resume(live, out, root_dir.name, info["task"], params) if live.exists() else None
        if tree is None:
            final.unlink(missing_ok=True)
            for name in RUN_DIRS:  # leftovers of an earlier exploration of this root
                shutil.rmtree(out / name, ignore_errors=True)
        if tree is None or tree.status != "finished":
            # (a tree killed after it finished needs no Teacher: it is only written out)
            tree = _grow(tree, root_dir, out, config, info, params)
        treemod.save(tree, final)
        live.unlink(missing_ok=True)
        c = tree.counters()
        log.info("wrote %s: %d nodes, %d edges, %d good leaves, stop: %s", final, len(tree.nodes), c["edges"],
                 c["good_leaves"], tree.stop_reason)  # fmt: skip
        return 0
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
