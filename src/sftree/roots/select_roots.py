"""`sftree select-roots`: split a Student run into early/middle/late stages and pick the root snapshots.

    sftree select-roots --snapshots DIR --out OUTDIR --table STAGES.tsv --direction {maximize,minimize}
                        [--num-roots 30] [--smooth-window 5] [--link symlink|hardlink|copy] [--plot STAGES.svg]
                        [--task NAME]

Reads the task's eval-* folders (`roots/snapshots.py`), applies section 2 (`roots/stages.py`), places each chosen
folder at OUTDIR/<same name>/ with `score, stage, selection_reason, task, direction` added to its metadata.json, and writes
one stages.tsv row per candidate. OUTDIR is built beside itself and renamed into place at the end, so a failed run
leaves the previous output (or none) and never half of one.

A real snapshot holds every attempt file written so far, so 30 roots of a long run carry a million files. By
default (`--link symlink`) a root refers to its snapshot: each top-level entry but metadata.json is a symlink to
the snapshot's, and metadata.json records the fingerprints explore checks (`verify_root`), so the cost
does not grow with the files. `--link hardlink` (also `auto`) makes a self-contained root: each file hard-linked
(no data copied), else reflinked (a copy-on-write clone, where the filesystem can), else copied; `--link copy`
always copies. The input is never modified: metadata.json is always a new file, and nothing writes into a root
afterwards (explore imports it into git with a private index: docs/select_roots.md).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from operator import attrgetter
from pathlib import Path
from typing import Any, NamedTuple, cast

from sftree.errors import InputError
from sftree.fileio import gc_paused, write_text_atomic
from sftree.jsontypes import JSONObject
from sftree.records.root import (
    META_NAME,
    ROOT_LINKS,
    check_files,
    link_fingerprints,
    read_root_meta,
    write_root_meta,
)
from sftree.records.scores import oriented
from sftree.records.stages import StageTable, write_stages
from sftree.roots import stages as st
from sftree.roots.snapshots import Scan, Snapshot, default_jobs, resolve_task_dir, scan
from sftree.runtime import remove
from sftree.settings import SelectRootsSettings, schema_defaults

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--snapshots", required=True, help="the task's eval-* folder, or a folder of task folders"
    )
    parser.add_argument("--out", required=True, help="output folder for the chosen root snapshots")
    parser.add_argument("--table", required=True, help="stages.tsv: one row per candidate snapshot")
    parser.add_argument("--direction", required=True, choices=["maximize", "minimize"])
    d = schema_defaults(SelectRootsSettings)
    parser.add_argument("--num-roots", type=int, default=d.num_roots, help="roots to choose (split 1:3:2)")
    parser.add_argument(
        "--smooth-window", type=int, default=d.smooth_window, help="centred moving-average window"
    )
    parser.add_argument(
        "--link",
        choices=["symlink", "hardlink", "auto", "copy"],
        default=d.link,
        help="how a root holds its snapshot's files (default %(default)s): symlink = link the snapshot's top-level entries "
        "(constant cost; the Student run must stay in place while trees are explored); hardlink (also auto) = "
        "a self-contained root, each file hard-linked, else reflinked, else copied; copy = full copies",
    )
    parser.add_argument(
        "--per-island",
        action="store_true",
        help="a multi-island Coral run: split --num-roots over the islands (metadata island_id) and apply "
        "section 2 to each island's snapshots alone, so every island is represented (default: over all "
        "islands together, in the global order)",
    )
    parser.add_argument("--plot", help="write the stage plot (SVG) here")
    parser.add_argument("--task", help="task name (default: the snapshot folder's name)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="processes reading a large run (>= 4000 folders); 0 = one per core, at most 8. Helps on network "
        "filesystems and idle cores; on a busy 2-core machine 1 is fastest",
    )


class Row(NamedTuple):  # a tuple: 100k of them are made in C (`_rows`), not by a Python __init__ each
    snap: Snapshot
    score_for_stage: float
    smooth: float  # in the task's own units (not oriented)
    gain: float | None
    stage: str
    reason: str | None  # None: not selected


def _rows(*columns: Sequence[object]) -> list[Row]:
    """Row(*values) for each position of the columns: tuple.__new__ is what Row._make calls, here without a
    Python call per row."""
    return list(map(partial(tuple.__new__, Row), zip(*columns, strict=True)))


@dataclass
class Selection:
    task: str
    direction: str
    method: str
    s0: float  # oriented
    s_inf: float
    rows: list[Row]
    quotas: dict[str, int]
    window: int

    @cached_property
    def chosen(self) -> list[Row]:
        return [r for r in self.rows if r.reason]


def select(result: Scan, direction: str, num_roots: int, window: int) -> Selection:
    """Apply section 2 to the scanned candidates (global order)."""
    snaps = result.snapshots
    try:
        filled = st.fill_missing([s.score for s in snaps])
    except ValueError:
        raise InputError(
            f"task {result.task!r}: none of the {len(snaps)} candidate snapshots in {result.directory} has a "
            "numeric score (every attempt score is null or missing)"
        ) from None
    # (oriented makes None of no finite float, and fill_missing gives finite floats only: scores are read so)
    split = st.split_stages(cast(list[float], [oriented(s, direction) for s in filled]), window)
    # A root must have eval_ok and a score of its own: explore starts from the root's score.
    eligible = [s.eval_ok and s.score is not None for s in snaps]
    chosen = st.choose(split.stages, eligible, num_roots)
    # Back to the task's units; 1.0 * x is x for every float, so a maximize task keeps the list as it is.
    smooth = split.smooth if direction == "maximize" else [-v for v in split.smooth]
    reasons: list[str | None] = [None] * len(snaps)
    for i, reason in chosen.items():
        reasons[i] = reason
    rows = _rows(snaps, filled, smooth, split.gain, split.stages, reasons)
    return Selection(
        result.task, direction, split.method, split.s0, split.s_inf, rows, st.quotas(num_roots), window
    )


def select_per_island(result: Scan, direction: str, num_roots: int, window: int) -> Selection:
    """Section 2 applied to each island's snapshots alone (in their global order), `num_roots` split over the
    islands as evenly as it goes (the first islands, by id, take the remainder); the rows merged back in global
    order. A run without islands is selected as `select` does."""
    groups: dict[str, list[Snapshot]] = {}
    for s in result.snapshots:
        groups.setdefault(s.island or "", []).append(s)
    if len(groups) <= 1:
        return select(result, direction, num_roots, window)
    if num_roots < len(groups):
        raise InputError(
            f"task {result.task!r}: --per-island needs at least one root per island: {len(groups)} islands, "
            f"--num-roots {num_roots}"
        )
    share, extra = divmod(num_roots, len(groups))
    parts = []
    for n, island in enumerate(sorted(groups)):
        sub = Scan(f"{result.task} (island {island})", result.directory, groups[island])
        parts.append(select(sub, direction, share + (n < extra), window))
    rows = sorted((r for p in parts for r in p.rows), key=lambda r: r.snap.global_index)
    quotas = {k: sum(p.quotas[k] for p in parts) for k in parts[0].quotas}
    methods = {p.method for p in parts}
    main = max(parts, key=lambda p: len(p.rows))
    method = methods.pop() if len(methods) == 1 else "per-island"
    return Selection(result.task, direction, method, main.s0, main.s_inf, rows, quotas, window)


# --- outputs ----------------------------------------------------------------------------------------------


def stage_table(sel: Selection) -> StageTable:
    """The selection as stages.tsv's columns (records/stages.py writes them), each built in C by `map`: this runs
    over every snapshot of a run, where a record object per row would double the table's cost."""
    rows = sel.rows
    snaps = list(map(attrgetter("snap"), rows))
    reasons = list(map(attrgetter("reason"), rows))

    def column(name: str, of: Sequence[object]) -> list[Any]:
        return list(map(attrgetter(name), of))

    return StageTable(
        snapshot=column("name", snaps),
        global_index=column("global_index", snaps),
        agent_id=column("agent_id", snaps),
        commit_hash=column("commit_hash", snaps),
        eval_count=column("eval_count", snaps),
        eval_ok=column("eval_ok", snaps),
        status=column("status", snaps),
        score=column("score", snaps),
        score_for_stage=column("score_for_stage", rows),
        smooth_score=column("smooth", rows),
        gain_ratio=column("gain", rows),
        stage=column("stage", rows),
        stage_method=[sel.method] * len(rows),
        selected=list(map(bool, reasons)),  # chosen: it has a reason
        selection_reason=reasons,
    )


FICLONE = 0x40049409  # ioctl(dest_fd, FICLONE, src_fd): a copy-on-write clone (btrfs, xfs, ...)
# link() answers these where links cannot be made here (another filesystem, not permitted, too many links, ...).
NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES)


@dataclass
class Linker:
    """Places one file of a root: hard link, else reflink, else copy (`mode` copy: always a full copy)."""

    mode: str = "auto"
    can_link: bool = True
    can_clone: bool = True
    counts: dict[str, int] = field(default_factory=lambda: {"hardlink": 0, "reflink": 0, "copy": 0})

    def place(self, src: str, dst: str) -> None:
        if self.mode != "copy" and self.can_link:
            try:
                os.link(src, dst)
                self.counts["hardlink"] += 1
                return
            except OSError as exc:
                if exc.errno not in NO_LINK:
                    raise
                self.can_link = False  # the same answer for every file of this filesystem pair
                log.warning("hard links not possible here (%s): reflink or copy instead", exc.strerror)
        if self.mode != "copy" and self.can_clone and self._clone(src, dst):
            self.counts["reflink"] += 1
            return
        shutil.copy2(src, dst)
        self.counts["copy"] += 1

    def _clone(self, src: str, dst: str) -> bool:
        import fcntl

        sfd = os.open(src, os.O_RDONLY)
        try:
            dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                fcntl.ioctl(dfd, FICLONE, sfd)
            except OSError:
                self.can_clone = False
                os.close(dfd)
                os.unlink(dst)
                return False
            os.close(dfd)
        finally:
            os.close(sfd)
        shutil.copystat(src, dst)
        return True


def _link_entries(src: str, dst: str) -> JSONObject:
    """A root that refers to the snapshot: each top-level entry (but metadata.json) a symlink to its absolute path.
    Returns the `root_links` record for metadata.json (what explore checks before it reads through the links)."""
    os.mkdir(dst)
    source = os.path.abspath(src)  # absolute: the root may be moved or read from another working directory
    with os.scandir(source) as it:
        names = sorted(e.name for e in it if e.name != META_NAME)
    for name in names:
        os.symlink(os.path.join(source, name), os.path.join(dst, name))
    return {"source": source, "entries": link_fingerprints(source, names)}


def _copy_tree(src: str, dst: str, linker: Linker) -> None:
    """copytree with `linker` placing each file; symlinks stay symlinks (never followed out of the snapshot)."""
    os.mkdir(dst)
    with os.scandir(src) as it:
        entries = list(it)
    for e in entries:
        s, d = e.path, os.path.join(dst, e.name)
        if e.is_symlink():
            os.symlink(os.readlink(s), d)
        elif e.is_dir():
            _copy_tree(s, d, linker)
        else:
            linker.place(s, d)
    shutil.copystat(src, dst)


def build_roots(sel: Selection, out: Path, link: str, pending: int | None = None) -> Path:
    """Copy the chosen folders into a new temporary folder beside `out` and return it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the result should look like any other folder
    try:
        linker = Linker(link)
        written: list[Path] = []
        for r in sel.chosen:
            dst = tmp / r.snap.name
            meta = read_root_meta(r.snap.path, META_NAME).to_dict()
            meta.pop(ROOT_LINKS, None)  # only this command writes it, for the root it makes
            if link == "symlink":
                meta[ROOT_LINKS] = _link_entries(r.snap.path, str(dst))
            else:
                _copy_tree(r.snap.path, str(dst), linker)
            meta.update(
                score=r.snap.score,
                stage=r.stage,
                selection_reason=r.reason,
                task=sel.task,
                direction=sel.direction,
            )
            if pending is not None:  # the task's pending snapshots skipped, for the report and dataset card
                meta["snapshots_pending"] = pending
            written.append(write_root_meta(dst, meta))
        # One journal commit for all of them, not one per file: the folder is temporary until swap_in renames it
        # into place, so its files need no rename of their own, only to be on disk before that rename.
        for path in written:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        placed = ", ".join(f"{v} {k}" for k, v in linker.counts.items() if v)
        log.info("root files: %s", placed or ("top-level entries symlinked" if link == "symlink" else "none"))
    except BaseException:
        remove.quietly(tmp)
        raise
    return tmp


def swap_in(tmp: Path, out: Path) -> None:
    """Put the finished folder in place of `out`; the old one is removed only after the swap."""
    old = None
    if out.exists() or out.is_symlink():
        old = out.parent / f".{out.name}.old-{os.getpid()}-{time.time_ns()}"
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        if old is not None:
            os.rename(old, out)
        raise
    if old is not None:
        remove.quietly(old)  # copies of the Student's files: any shape (runtime/remove.py)


STAGE_COLORS = {"early": "#1f77b4", "middle": "#2ca02c", "late": "#ff7f0e"}


def plot_svg(sel: Selection) -> str:
    """Raw scores, eval_ok false markers, the smoothed curve, stage bands and the chosen roots. Series longer than
    the plot is wide are drawn as the lowest and highest value of each pixel column (`svg.decimate`): every
    extreme and outlier stays, the chosen roots are all drawn, and the note under the title says so."""
    from sftree.svg import Band, Series, svg_plot

    rows = sel.rows
    snaps = list(map(attrgetter("snap"), rows))
    x = list(map(attrgetter("global_index"), snaps))
    scores = list(map(attrgetter("score"), snaps))
    good = [s.eval_ok and s.score is not None for s in snaps]
    ok = [i for i, g in enumerate(good) if g]
    bad = [i for i, g in enumerate(good) if not g]
    filled = list(map(attrgetter("score_for_stage"), rows))
    stages = list(map(attrgetter("stage"), rows))
    chosen = sel.chosen
    # Stage bands: runs of consecutive snapshots in one stage, split halfway between neighbours.
    bands: list[Band] = []
    labelled: set[str] = set()
    cuts = [i for i in range(1, len(rows)) if stages[i] != stages[i - 1]]
    for start, end in zip([0, *cuts], [*cuts, len(rows)], strict=True):
        x0 = x[0] - 0.5 if start == 0 else (x[start - 1] + x[start]) / 2
        x1 = x[-1] + 0.5 if end == len(rows) else (x[end - 1] + x[end]) / 2
        stage = stages[start]
        bands.append(Band(x0, x1, STAGE_COLORS[stage], None if stage in labelled else stage, 0.14))
        labelled.add(stage)
    series = [
        Series([x[i] for i in ok], [scores[i] for i in ok], "points", "score (eval_ok)", "#555555", size=2.2, opacity=0.7),
        Series([x[i] for i in bad], [filled[i] for i in bad], "points", "eval_ok false", "#d62728", marker="cross", size=3.0),
        Series(x, list(map(attrgetter("smooth"), rows)), "line", f"smoothed (window {sel.window})", "#000000", width=1.8),
        Series(
            [r.snap.global_index for r in chosen],
            [r.snap.score for r in chosen],
            "points",
            f"chosen roots ({len(chosen)})",
            "#9467bd",
            marker="ring",
            size=5.5,
            thin=False,
        ),
    ]  # fmt: skip
    title = f"{sel.task}: stages by {'gain ratio' if sel.method == 'gain' else 'time position (no rise)'} ({sel.direction})"
    note = f"{len(rows):,} snapshots"
    return svg_plot(series, title=title, xlabel="global eval index", ylabel="score", bands=bands, note=note)


# --- command ----------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    # No cycles are made here; with the collector paused, the per-snapshot objects of a large run are not walked
    # again and again while they are built.
    with gc_paused():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.num_roots < 1:
        raise InputError(f"--num-roots must be at least 1, not {args.num_roots}")
    if args.smooth_window < 1:
        raise InputError(f"--smooth-window must be at least 1, not {args.smooth_window}")
    t0 = time.monotonic()
    task_dir, task = resolve_task_dir(args.snapshots, args.task)
    result = scan(task_dir, task, jobs=args.jobs or default_jobs())
    read_s = time.monotonic() - t0
    choose = select_per_island if args.per_island else select
    sel = choose(result, args.direction, args.num_roots, args.smooth_window)
    if result.non_finite:
        log.warning(
            "%s: %d non-finite score(s) treated as missing, e.g. %s",
            task,
            len(result.non_finite),
            result.non_finite[0],
        )
    _write_outputs(args, sel, pending=len(result.pending))
    _log_stages(task, sel, result, read_s)
    chosen = len(sel.chosen)
    if chosen < args.num_roots:
        log.warning(
            "%s: only %d eligible snapshot(s), fewer than --num-roots %d: all of them chosen",
            task,
            chosen,
            args.num_roots,
        )
    log.info(
        "%s: %d roots -> %s, table -> %s (%.2fs total)",
        task,
        chosen,
        args.out,
        args.table,
        time.monotonic() - t0,
    )
    return 0


def _write_outputs(args: argparse.Namespace, sel: Selection, *, pending: int) -> None:
    """The roots folder (swapped in whole), the plot and the table."""
    # Everything is computed before anything is written: a bad input leaves no output behind. Placing files one
    # by one needs them to be files or folders; a root that links to its snapshot is checked by explore, which
    # reads every file anyway (a walk here would list the roots' million attempt files of a long run).
    if args.link != "symlink":
        for r in sel.chosen:
            check_files(r.snap.path, "snapshot")
    out = Path(args.out)
    tmp = build_roots(sel, out, args.link, pending=pending)
    try:
        if args.plot:
            write_text_atomic(args.plot, plot_svg(sel))
        write_stages(args.table, stage_table(sel))
        swap_in(tmp, out)
    except BaseException:
        remove.quietly(tmp)
        raise


def _log_stages(task: str, sel: Selection, result: Scan, read_s: float) -> None:
    """What was read and how fast, the stages' method, and per stage its snapshots, eligible ones, quota and
    roots chosen."""
    n = len(sel.rows)
    log.info(
        "%s: %d snapshots read (%d candidates, %d pending skipped) in %.2fs (%.0f/s); stages by %s "
        "(S0=%.6g, S_inf=%.6g, %s)",
        task,
        n + len(result.pending),
        n,
        len(result.pending),
        read_s,
        (n + len(result.pending)) / max(read_s, 1e-9),
        "gain ratio" if sel.method == "gain" else "time position",
        sel.s0,
        sel.s_inf,
        sel.direction,
    )
    # counted in C where it can be: this runs over every snapshot
    members = Counter(map(attrgetter("stage"), sel.rows))
    eligible = Counter([r.stage for r in sel.rows if r.snap.eval_ok and r.snap.score is not None])
    picked = sel.chosen
    for stage in st.STAGES:
        in_stage = [r for r in picked if r.stage == stage]
        refills = sum(1 for r in in_stage if r.reason != "quota")
        log.info(
            "%s: %-6s %5d snapshots, %5d eligible, quota %2d, chosen %2d (%d refill)",
            task,
            stage,
            members[stage],
            eligible[stage],
            sel.quotas[stage],
            len(in_stage),
            refills,
        )
