"""`sftree explore --root DIR --out TREEDIR [--config config.yaml]`: grow one root's MCTS tree.

Resumable: the live tree (`tree.live.json`, a snapshot, plus `tree.log.jsonl`, one appended line per change:
`tree.LiveTree`) is persisted after every dispatch and every edge; a rerun of a killed job loads it, discards
the edges that were running (their worktrees and partial transcripts) and continues. The declared output
`tree.json` is written once, when the search stops (Snakemake deletes declared outputs before a job runs, so it
cannot hold the live state). A rerun without `tree.live.json` (e.g. `--forcerun explore`) starts afresh.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TextIO

from sftree.errors import InputError
from sftree.fileio import read_json
from sftree.jsontypes import JSONObject
from sftree.progress import ConsoleLines, tree_line
from sftree.records.root import check_files, read_root_meta, verify_root
from sftree.records.scores import best_of
from sftree.records.tree import final_path
from sftree.runtime import remove, tempdirs
from sftree.search import mcts
from sftree.search import tree as treemod
from sftree.settings import SearchSettings, Settings, load_settings
from sftree.teacher.vocabulary import Vocabulary, read_teacher_vocab
from sftree.world.task import task_config

log = logging.getLogger(__name__)

# Folders of a tree directory that belong to one exploration (wiped when a fresh one starts).
RUN_DIRS = ("store", "work", "edges", "sessions")
# Params that only change how the search runs, not which tree it grows: a resumed run takes them from config.
OPERATIONAL = ("parallel_width", "schedule", "keep_workspaces")
# Temporary folders of edges (coral sockets, grader checkouts): removed on exit, SIGTERM, and after kill -9 by
# the next run (tempdirs.sweep).
TEMP_PREFIXES = tempdirs.PREFIXES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root", required=True, help="root snapshot folder (results/<task>/roots/<snapshot>)"
    )
    parser.add_argument("--out", required=True, help="tree folder (results/<task>/trees/<snapshot>)")
    parser.add_argument("--config", help="config.yaml (default: the repository's)")
    parser.add_argument(
        "--progress-fd",
        type=int,
        help="also write one progress line per finished edge to this open file descriptor (the workflow"
        " passes the job's console as fd 3 while stdout and stderr go to the log file)",
    )
    parser.add_argument(
        "--width",
        type=int,
        help="at most this many expansions at once (the workflow passes the teacher_slots Snakemake granted); "
        "lowers search.parallel_width, never raises it",
    )


@dataclass(frozen=True)
class RootInfo:
    """What the tree takes from its root snapshot's metadata (annotated by select-roots)."""

    task: str
    task_cfg: dict[str, object]  # the task's config entry (`sftree.world.task.task_config`)
    direction: str
    score: float | None  # raw
    eval_count: int | None


def read_root(root_dir: Path, settings: Settings) -> RootInfo:
    """Task, direction, raw score and eval count of a root snapshot (metadata.json, annotated by select-roots)."""
    meta = read_root_meta(root_dir)
    meta_path = meta.path
    task = meta.get("task") or (root_dir.parent.parent.name if root_dir.parent.name == "roots" else None)
    if not task:
        raise InputError(f"{meta_path}: no `task` field, and the path is not results/<task>/roots/<snapshot>")
    task_cfg = task_config(settings, task)
    direction = meta.get("direction") or task_cfg["direction"]
    score = meta.get("score")
    if score is None:
        score = _attempt_score(root_dir, meta.get("commit_hash"))
    if score is not None and not isinstance(score, int | float):
        raise InputError(f"{meta_path}: `score` must be a number or null, not {score!r}")
    eval_count = meta.get("eval_count")
    if eval_count is not None and not isinstance(eval_count, int):
        raise InputError(f"{meta_path}: `eval_count` must be an integer, not {eval_count!r}")
    return RootInfo(task, task_cfg, direction, score, eval_count)


def _attempt_score(root_dir: Path, commit: str | None) -> float | None:
    """The snapshot's own attempt record's score, when select-roots did not annotate it."""
    if not commit:
        return None
    attempts = root_dir / "shared" / "attempts"
    for f in sorted(attempts.glob(f"{commit[:7]}*.json")) if attempts.is_dir() else []:
        rec = read_json(f, "attempt record")
        if isinstance(rec, dict) and str(rec.get("commit_hash", f.stem)).startswith(commit[:7]):
            score: float | None = rec.get("score")  # (read_root checks it is a number)
            return score
    return None


def drop_unfinished(out: Path, finished: set[str]) -> None:
    """Remove what edges that never finished left: their transcripts, and every session file named for them
    (`sessions/<edge>.json`, and a backend's own beside it, such as OpenCode's `<edge>.opencode.db`)."""
    for d in sorted((out / "edges").iterdir()) if (out / "edges").is_dir() else []:
        if d.name not in finished:
            remove.quietly(d)
    for f in sorted((out / "sessions").iterdir()) if (out / "sessions").is_dir() else []:
        if f.name.split(".", 1)[0] not in finished:
            f.unlink()


def _resume(
    live: treemod.LiveTree, out: Path, root_name: str, task: str, params: SearchSettings
) -> treemod.Tree:
    tree = live.load()
    if tree.root != root_name or tree.task != task:
        raise InputError(f"{live.snapshot_path} belongs to {tree.task}/{tree.root}, not {task}/{root_name}")
    for d in tree.in_flight:  # half-done edges: dropped, and redone
        log.info("discarding half-done edge %s (from %s)", d["edge"], d["node"])
    tree.in_flight = []
    # The ids above every finished edge are taken again, in order: a redone edge has the id it had (its Teacher
    # requests name it), so a killed run's rerun writes what an uninterrupted run writes at parallel_width 1. An
    # id below a finished edge (a wider run) stays a gap.
    tree.next_edge = 1 + max((int(e.id[1:]) for e in tree.edges), default=0)
    drop_unfinished(out, {e.id for e in tree.edges})
    given, own = asdict(params), asdict(tree.params)
    changed = {k for k in given if k not in OPERATIONAL and given[k] != own[k]}
    if changed:
        log.warning(
            "resuming with the tree's own search params; config differs in %s", ", ".join(sorted(changed))
        )
    tree.params = replace(tree.params, **{k: given[k] for k in OPERATIONAL})
    c = tree.counters()
    log.info("resuming %s: %d edges done, %d nodes", live.dir, c["edges"], len(tree.nodes))
    return tree


def _progress_stream(fd: int | None) -> TextIO | None:
    """The inherited descriptor as a text stream (written through the shared descriptor, not reopened, so the
    lines land in order with the console's other writers even when the console is a file)."""
    if fd is None:
        return None
    try:
        return os.fdopen(fd, "w", encoding="utf-8", closefd=False)
    except OSError as exc:
        raise InputError(f"--progress-fd {fd}: not an open file descriptor ({exc.strerror})") from exc


class BestSoFar:
    """The best raw score of any node so far, from the nodes added since the last call: nodes are only
    appended and a node's score is set when it is made, so the progress line after each edge reads the new
    nodes, not the whole tree. (A tree with fewer nodes than seen, i.e. another tree, starts over.)"""

    def __init__(self) -> None:
        self.seen: int = 0
        self.best: float | None = None

    def update(self, tree: treemod.Tree) -> float | None:
        nodes = tree.nodes
        if len(nodes) < self.seen:
            self.seen, self.best = 0, None
        new = [n.score for n in nodes[self.seen :]]
        if new:
            self.best = best_of([self.best, *new], tree.direction)
        self.seen = len(nodes)
        return self.best


def _tree_progress(console: ConsoleLines, tree: treemod.Tree, best: BestSoFar | None = None) -> None:
    """A console line whenever the number of finished edges or the tree's status changed."""
    stop = tree.stop_reason if tree.status == "finished" else None
    best_score = (best or BestSoFar()).update(tree)
    if console.stream is None or console.last == (len(tree.edges), stop):
        return  # nothing new to print: no counting
    c, p = tree.counters(), tree.params
    line = tree_line(
        f"explore {tree.task}/{tree.root}", c, p.max_valid_edges, p.target_good_leaves, best_score, stop
    )
    console.emit((c["edges"], stop), line)


def record_backend(previous: str | None, current: str | None) -> str | None:
    """tree.json `backend` after a run with `current`: a tree resumed with another backend than the one that
    began it is `mixed` (its edges do not all come from one agent; the export flags it like `native`)."""
    if previous and current and previous != current:
        log.warning(
            "tree made by agent backend %s continues with %s: backend recorded as mixed", previous, current
        )
        return "mixed"
    return current or previous


def record_teacher_vocab(
    previous: JSONObject | None, current: Vocabulary | None, tree_file: Path
) -> JSONObject | None:
    """tree.json `teacher_vocab` after a run whose Teacher has the vocabulary `current` (None: not known this run,
    the tree keeps what it recorded). A tree begun under another vocabulary stops the run: the ids sampled under two
    vocabularies cannot be one tree's (the export reads them all as the one recorded)."""
    if current is None:
        return previous
    if previous is None:
        return current.to_doc()
    if previous.get("sha256") != current.sha256:
        raise InputError(
            f"{tree_file}: the tree was grown with the Teacher vocabulary of {previous.get('source')} (sha256 "
            f"{previous.get('sha256')}), this run's Teacher has that of {current.source} (sha256 {current.sha256}): "
            "token ids sampled under two vocabularies cannot be one tree's; resume with the tree's tokenizer "
            "(teacher.tokenizer, teacher.launch.model), or remove the tree folder to grow it afresh"
        )
    return previous  # the same vocabulary: the tree keeps where it was first read


def _grow(
    tree: treemod.Tree | None,
    live: treemod.LiveTree,
    root_dir: Path,
    settings: Settings,
    info: RootInfo,
    params: SearchSettings,
    console: ConsoleLines,
    vocab: Vocabulary | None,
) -> treemod.Tree:
    """Create or continue the tree with the edge runtime until a stop rule holds; `vocab` is the Teacher's
    vocabulary this run (`read_teacher_vocab`, read by preflight)."""
    from sftree.runtime.workspace import NodeState
    from sftree.search.edge import EdgeContext, run_edge
    from sftree.search.result import EdgeResult

    # checked before the Teacher starts: a resumed tree of another vocabulary stops here
    teacher_vocab = record_teacher_vocab(tree.teacher_vocab if tree else None, vocab, live.snapshot_path)
    ctx = EdgeContext.create(live.dir, root_dir, settings, info.task_cfg)
    try:
        ctx.store.cleanup_stale(keep=set())  # nothing runs yet: every worktree is a leftover
        if tree is None:
            tree = treemod.Tree.new(
                info.task, root_dir.name, info.direction, params, info.score, ctx.root_state.to_dict(),
                info.eval_count,
            )  # fmt: skip
            log.info("new tree for %s/%s (root score %s, %s)", info.task, root_dir.name, info.score,
                     info.direction)  # fmt: skip
        tree.sandbox = ctx.agent.sandbox  # the report and dataset card show it
        tree.backend = record_backend(tree.backend, ctx.agent.name)
        tree.coral = {"mode": ctx.world.kind, **ctx.world.describe()}  # the dataset card and report show it
        if ctx.agent.student_model:  # OpenCode's prompt and tools were built for this id
            tree.coral["student_model"] = ctx.agent.student_model
        tree.teacher_vocab = teacher_vocab  # the export checks the Student against it (export.teacher_tokens)
        if tree.sandbox == "none":
            log.warning("agent.sandbox is none: the Teacher's commands and the graded code run unconfined")
        live.save(tree)

        def run_one(d: mcts.Dispatch) -> EdgeResult:
            return run_edge(
                ctx, NodeState.from_dict(_parent_state(d)), d.edge, d.parent_score,
                depth=d.depth, attempt=d.attempt, eval_count=d.parent_eval_count or 0,
            )  # fmt: skip

        best = BestSoFar()
        teacher = ctx.teacher
        teacher.absorb(tree.teacher)  # a resumed tree keeps counting its Teacher incidents

        def persist(t: treemod.Tree) -> None:
            t.teacher = teacher.report()  # tree.json `teacher`: requests, retries, stalls, worker events
            live.save(t)
            _tree_progress(console, t, best)

        tree = mcts.run_search(tree, run_one, persist)
        tree.teacher = teacher.report()
        return tree
    finally:
        live.close()
        ctx.close()  # worktrees removed unless keep_workspaces; a teacher-sim it started is stopped


def _parent_state(d: mcts.Dispatch) -> JSONObject:
    """The state of the node a dispatch expands (every node the search expands has one)."""
    if d.parent_state is None:
        raise TypeError(f"dispatch {d.edge}: node {d.node} has no state")
    return d.parent_state


def cap_width(params: SearchSettings, width: int | None) -> SearchSettings:
    """`parallel_width` lowered to the granted slots, so a global `teacher_slots` limit holds across jobs."""
    if width is None:
        return params
    if width < 1:
        raise InputError(f"--width must be at least 1, not {width}")
    if width < params.parallel_width:
        log.info("parallel_width %d capped to %d granted teacher slots", params.parallel_width, width)
        return replace(params, parallel_width=width)
    return params


def _resolve(arg: str, flag: str) -> Path:
    try:
        return Path(arg).resolve(strict=False)
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError before Python 3.13)
        raise InputError(f"{flag} {arg}: cannot be resolved ({exc})") from None


def check_out(out: Path, flag: str = "--out") -> None:
    """`out` is a folder or can become one: no part of it is an existing file."""
    for p in [out, *out.parents]:
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise InputError(f"{flag} {out}: {p} exists and is not a folder")
            return


def preflight(args: argparse.Namespace) -> tuple[Settings, Path, Path, RootInfo, Vocabulary | None]:
    """Everything that can be checked before the first write: config, root, out, prompt templates, teacher-sim
    options, the Teacher's tokenizer (its vocabulary, read once per job). A bad input fails here, so it leaves no
    output folder behind."""
    settings = load_settings(args.config)
    root_dir, out = _resolve(args.root, "--root"), _resolve(args.out, "--out")
    if not root_dir.is_dir():
        raise InputError(f"--root {args.root}: root snapshot folder not found")
    check_out(out)
    verify_root(root_dir)  # a root that links to its snapshot: the snapshot is still there, unchanged
    info = read_root(root_dir, settings)
    check_files(root_dir, "--root")
    from sftree.agents.prompts import NAMES, load_template

    for name in NAMES:  # a missing template would otherwise surface inside the first edge
        load_template(name, settings.agent.prompts)
    if settings.teacher.sim is not None:
        from sftree.teacher.sim.server import make_state

        # script file, fault rates, latency tail: the same checks the server makes
        make_state(**settings.teacher.sim)
    # the Teacher's vocabulary for tree.json `teacher_vocab`: a bad teacher.tokenizer fails here
    vocab = read_teacher_vocab(settings.teacher)
    return settings, root_dir, out, info, vocab


def run(args: argparse.Namespace) -> int:
    settings, root_dir, out, info, vocab = preflight(args)
    params = settings.search
    live, final = treemod.LiveTree(out), final_path(out)
    stream = _progress_stream(getattr(args, "progress_fd", None))  # a bad fd fails before anything is made
    console = ConsoleLines(stream)
    # the topmost folder this run creates (None: out exists): removed if the run fails before its first save
    created = next((p for p in reversed([out, *out.parents]) if not p.exists()), None)
    out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / "explore.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root_logger = logging.getLogger()
    # The tree's log keeps INFO and up however the process set up logging: `sftree`'s main sets INFO with
    # basicConfig, which does nothing when the root logger has handlers already (a caller in the same process,
    # such as pytest's log capture), and the root's default level WARNING would leave this file with warnings
    # only (no "starting llama-server", no "teacher ready"). Lowered for the run only; -v's DEBUG is kept.
    level = root_logger.level
    if root_logger.getEffectiveLevel() > logging.INFO:
        root_logger.setLevel(logging.INFO)
    root_logger.addHandler(handler)
    try:
        params = cap_width(params, getattr(args, "width", None))
        with tempdirs.removed_on_sigterm():
            stale = tempdirs.sweep(TEMP_PREFIXES)
            if stale:
                log.info("removed %d temporary folder(s) of killed runs: %s", len(stale), ", ".join(stale))
            return _explore(out, root_dir, settings, info, params, console, vocab)
    except BaseException:
        if created is not None and not live.exists() and not final.exists():
            # failed before the tree's first state was saved (Teacher not reachable, ...): nothing to resume
            remove.quietly(created)  # (work/ holds what agents wrote)
        raise
    finally:
        root_logger.removeHandler(handler)
        root_logger.setLevel(level)
        handler.close()
        if stream is not None:
            stream.close()


def _explore(
    out: Path,
    root_dir: Path,
    settings: Settings,
    info: RootInfo,
    params: SearchSettings,
    console: ConsoleLines,
    vocab: Vocabulary | None,
) -> int:
    live, final = treemod.LiveTree(out), final_path(out)
    tree = _resume(live, out, root_dir.name, info.task, params) if live.exists() else None
    if tree is None:
        final.unlink(missing_ok=True)
        for name in RUN_DIRS:  # leftovers of an earlier exploration of this root
            remove.quietly(out / name)  # work/: what agents wrote, of any shape (runtime/remove.py)
    if tree is None or tree.status != "finished":
        # (a tree killed after it finished needs no Teacher: it is only written out)
        tree = _grow(tree, live, root_dir, settings, info, params, console, vocab)
    treemod.save(tree, final)
    _tree_progress(console, tree)
    live.remove()
    c = tree.counters()
    log.info("wrote %s: %d nodes, %d edges, %d good leaves, stop: %s", final, len(tree.nodes), c["edges"],
             c["good_leaves"], tree.stop_reason)  # fmt: skip
    return 0
