"""Read a Student Coral run: the `eval-*` snapshot folders of one task and their attempt records.

A snapshot folder is `eval-<global index>-<agent id>-<hash>/` with `code/`, `shared/` and `metadata.json`.
`metadata.json` without `eval_ok` is a pending snapshot (the grader never wrote back): skipped and counted.
The score comes from the Coral attempt record `shared/attempts/<commit hash>.json`, matched by file name first
(exact, then a short-hash prefix either way), then by the `commit_hash` field inside the files.

Every problem is collected and reported together (up to a few dozen lines), each naming the path, so one run
shows everything that is wrong with the input. Nothing is written here.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, TypeAlias

from sftree.errors import InputError
from sftree.fileio import gc_paused, read_json_object
from sftree.jsontypes import JSONObject, JSONValue
from sftree.progress import Progress
from sftree.records.root import MAX_REPORTED

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^eval-(\d+)-(.+)-([0-9a-fA-F]{6,64})$")
MIN_PREFIX = 6  # shortest hash prefix accepted when matching attempt files
PARALLEL_MIN = 4000  # folders below which a process pool costs more than it saves


@dataclass(slots=True)
class Snapshot:
    """One non-pending snapshot (a candidate of section 2.1)."""

    name: str
    path: str
    global_index: int
    agent_id: str
    commit_hash: str
    eval_ok: bool
    score: float | None  # raw score from the attempt record (None: missing, null or non-finite)
    status: JSONValue  # the attempt record's, as it is (Coral writes a string or null; stages.tsv shows any other)
    eval_count: int | None
    island: str | None = None  # metadata island_id: the Coral island of a multi-island run


@dataclass
class Scan:
    task: str
    directory: Path
    snapshots: list[Snapshot]  # candidates, sorted by global index
    pending: list[str] = field(default_factory=list)  # names of skipped pending snapshots
    non_finite: list[str] = field(default_factory=list)  # names whose score was NaN/inf (treated as missing)


def parse_name(name: str) -> tuple[int, str, str] | None:
    """(global index, agent id, hash) from `eval-000003-agent-3-e248a487ce3d`, or None."""
    m = NAME_RE.match(name)
    if not m:
        return None
    index, agent, digest = m.groups()
    return int(index), agent, digest.lower()


def _has_eval_dirs(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            return any(e.name.startswith("eval-") and e.is_dir() for e in it)
    except OSError:
        return False


def resolve_task_dir(snapshots: str | os.PathLike[str], task: str | None = None) -> tuple[Path, str]:
    """The folder holding the task's eval-* folders, and the task name.

    `snapshots` is either that folder itself (task defaults to its name) or a folder with one subfolder per
    task (then `task` must be given).
    """
    root = Path(snapshots)
    if not root.is_dir():
        raise InputError(f"snapshot folder not found: {root}")
    if _has_eval_dirs(root):
        return root, task or root.resolve().name
    if task and (root / task).is_dir():
        if _has_eval_dirs(root / task):
            return root / task, task
        raise InputError(f"task {task!r}: no eval-* snapshot folders in {root / task}")
    if task:
        raise InputError(f"task {task!r}: no eval-* snapshot folders in {root} (nor in {root / task})")
    raise InputError(f"no eval-* snapshot folders in {root}")


_CHUNK = 1 << 16
_DECODER = json.JSONDecoder()  # what json.loads(str) uses
# (typeshed leaves JSONDecoder.scan_once undeclared: __init__ sets it, the scanner json's own decode calls)
_decode, _scan_once = _DECODER.decode, _DECODER.scan_once  # type: ignore[attr-defined]

FAST_MIN = 2000  # folders below which importing orjson (about 12 ms) costs more than it saves
# A JSON parser of a file's bytes. What it gives is read in `_read_many`'s loop inside a try, each field's type
# checked before use: any shape the loop does not expect sends the snapshot to the careful `read_snapshot`.
Loads: TypeAlias = Callable[[bytes], Any]
_UNSET = object()
_fast_loads: Loads | None | object = (
    _UNSET  # orjson.loads once `_fast_parser` has looked; None: not installed
)


def _fast_parser() -> Loads:
    """orjson.loads, a C parser about twice as fast as json's on these small files (docs/select_roots.md,
    "Cost"), imported on first use; the standard parser where orjson is not installed."""
    global _fast_loads
    if _fast_loads is _UNSET:
        found: Loads | None
        try:
            from orjson import loads as found
        except ImportError:  # the standard parser alone gives the same results, more slowly
            found = None
        _fast_loads = found
    return _fast_loads if callable(_fast_loads) else _std_loads


def _std_loads(data: bytes) -> Any:
    """json.loads(data.decode()): strict UTF-8 (as open(encoding="utf-8") reads), then the standard parser."""
    return _decode(data.decode())


def _read_bytes(path: str) -> bytes | None:
    """The whole file (one open, one read for a small file, no Python file object), or None if it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (OSError, ValueError):
        return None
    try:
        data = os.read(fd, _CHUNK)
        if len(data) == _CHUNK:  # a large file: read on to the end
            parts = [data]
            while more := os.read(fd, _CHUNK):
                parts.append(more)
            data = b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data


def _json_object(data: bytes) -> JSONObject | None:
    """`data` parsed as json.loads(data.decode()) parses it, if that gives an object; else None."""
    try:
        text = data.decode()  # strict UTF-8, as open(encoding="utf-8") reads it
        if text[:1] == "{":  # what _decode does, less its two whitespace regex matches
            obj, end = _scan_once(text, 0)
            if end != len(text) and text[end:].strip(" \t\n\r"):
                return None
        else:
            obj = _decode(text)
    except (ValueError, StopIteration):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return obj if type(obj) is dict else None


def _quick_json_object(path: str) -> JSONObject | None:
    """The JSON object in `path` on the common path, else None: missing, unreadable, not UTF-8, not valid JSON or
    not an object. The caller then reads it again with `load_json_object`, which gives the exact error message, so
    this only makes the usual case cheap and never changes a result."""
    data = _read_bytes(path)
    return None if data is None else _json_object(data)


def find_attempt(snapshot_path: str, commit_hash: str) -> tuple[str, JSONObject]:
    """The attempt record of `commit_hash` in the snapshot's shared/attempts/: (path, record)."""
    attempts = f"{snapshot_path}/shared/attempts"
    exact = f"{attempts}/{commit_hash}.json"
    record = _quick_json_object(exact)  # the usual case: the file is named by the full hash
    if record is not None:
        return exact, record
    try:
        return exact, read_json_object(exact, "attempt record")
    except InputError:
        if os.path.exists(exact):
            raise
    try:
        names = sorted(n for n in os.listdir(attempts) if n.endswith(".json"))
    except FileNotFoundError:
        raise InputError(f"no shared/attempts folder in {snapshot_path}") from None
    except OSError as exc:
        raise InputError(f"cannot list {attempts}: {exc.strerror or exc}") from None
    want = commit_hash.lower()

    def same(h: str) -> bool:
        h = h.lower()
        return len(h) >= MIN_PREFIX and (h.startswith(want) or want.startswith(h))

    for name in names:  # by file name: a short hash on either side
        if same(name[: -len(".json")]):
            path = os.path.join(attempts, name)
            return path, read_json_object(path, "attempt record")
    for name in names:  # by the commit_hash field inside the files
        path = os.path.join(attempts, name)
        try:
            record = read_json_object(path, "attempt record")
        except InputError:
            continue  # another commit's broken record is not this snapshot's problem
        inside = record.get("commit_hash")
        if isinstance(inside, str) and same(inside):
            return path, record
    raise InputError(f"no attempt record for commit {commit_hash} in {attempts}")


def _score(value: object, where: str) -> tuple[float | None, bool]:
    """(score, non_finite) from an attempt's `score` field; InputError for a non-numeric value."""
    if value is None:
        return None, False
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: score must be a number or null, not {value!r}")
    number = float(value)
    if not math.isfinite(number):
        return None, True
    return number, False


_MISSING = object()


def read_snapshot(
    path: str, name: str, parsed: tuple[int, str, str] | None = None
) -> tuple[Snapshot | None, bool]:
    """(snapshot, non_finite_score); snapshot is None when pending (no eval_ok)."""
    parsed = parsed or parse_name(name)
    if parsed is None:
        raise InputError(f"snapshot folder name does not parse as eval-<index>-<agent>-<hash>: {path}")
    index, agent_from_name, _ = parsed
    meta_path = f"{path}/metadata.json"
    meta = _quick_json_object(meta_path)
    if meta is None:
        meta = read_json_object(meta_path, "metadata.json")
    eval_ok = meta.get("eval_ok", _MISSING)
    if eval_ok is _MISSING:
        return None, False
    if eval_ok is not True and eval_ok is not False:
        raise InputError(f"{meta_path}: eval_ok must be true or false, not {eval_ok!r}")
    commit = meta.get("commit_hash")
    if not isinstance(commit, str) or not commit.strip() or "/" in commit:
        raise InputError(f"{meta_path}: commit_hash is missing or not a plain string: {commit!r}")
    commit = commit.strip()
    attempt_path, attempt = find_attempt(path, commit)
    value = attempt.get("score")
    score: float | None
    if type(value) is float and math.isfinite(value):  # the usual case, same result as _score
        score, non_finite = value, False
    else:
        score, non_finite = _score(value, attempt_path)
    eval_count = meta.get("eval_count")
    island = meta.get("island_id")
    return (
        Snapshot(
            name,
            path,
            index,
            str(meta.get("agent_id") or agent_from_name),
            commit,
            eval_ok,
            score,
            attempt.get("status"),
            eval_count if type(eval_count) is int else None,
            island if type(island) is str else None,
        ),
        non_finite,
    )


Read = tuple[list[Snapshot], list[str], list[str], list[str]]  # candidates, pending, non-finite, problems
Item = tuple[
    str, str, tuple[int, str, str] | None
]  # a folder's name, path, and its name parsed (None: no parse)


def _read_many(items: list[Item], fast: bool = True) -> Read:
    """Read a slice of snapshot folders, in order: (candidates, pending names, non-finite names, problems).

    The loop below is `read_snapshot` for the usual snapshot, inlined (it runs 100k times in a long run): both
    files small, parsed as objects (by orjson when `fast`, else by the standard parser), every field used of the
    type both parsers give alike (orjson gives an integer beyond 64 bits as a float: read again), the attempt
    file named by the full hash, a finite float score. Anything else, pending snapshots included, is read again by
    `read_snapshot`, which gives the exact result or message; so this loop changes the cost, never a result."""
    snaps: list[Snapshot] = []
    pending: list[str] = []
    non_finite: list[str] = []
    problems: list[str] = []
    out: Read = (snaps, pending, non_finite, problems)
    add = snaps.append
    loads = _fast_parser() if fast else _std_loads
    open_, read, close, rdonly, chunk = os.open, os.read, os.close, os.O_RDONLY, _CHUNK
    for name, path, parsed in items:
        if parsed is not None:
            try:
                fd = open_(path + "/metadata.json", rdonly)
                try:
                    data = read(fd, chunk)
                finally:
                    close(fd)
                meta = loads(data)
                eval_ok, commit = meta["eval_ok"], meta["commit_hash"]
                agent, count = meta.get("agent_id"), meta.get("eval_count")
                island = meta.get("island_id")
                if (
                    len(data) < chunk
                    and (eval_ok is True or eval_ok is False)
                    and type(commit) is str
                    and commit
                    and "/" not in commit
                    and commit.strip() == commit
                    and (agent is None or type(agent) is str)
                    and (count is None or type(count) is int)
                    and (island is None or type(island) is str)
                ):
                    fd = open_(f"{path}/shared/attempts/{commit}.json", rdonly)
                    try:
                        data = read(fd, chunk)
                    finally:
                        close(fd)
                    attempt = loads(data)
                    score, status = attempt["score"], attempt.get("status")
                    if (
                        len(data) < chunk
                        and type(score) is float
                        and score - score == 0.0  # finite
                        and (status is None or type(status) is str)
                    ):
                        add(
                            Snapshot(
                                name,
                                path,
                                parsed[0],
                                agent or parsed[1],
                                commit,
                                eval_ok,
                                score,
                                status,
                                count,
                                island,
                            )
                        )
                        continue
            # Anything unusual: the careful way below reads it again and says what is wrong, if anything.
            except (OSError, ValueError, KeyError, TypeError):
                pass
        _read_careful(name, path, parsed, out)
    return out


def _read_careful(name: str, path: str, parsed: tuple[int, str, str] | None, out: Read) -> None:
    """`read_snapshot` on a snapshot `_read_many`'s loop did not take: the snapshot, or its name as pending (and
    as non-finite), or the problem, added to `out`."""
    snaps, pending, non_finite, problems = out
    try:
        snap, bad_score = read_snapshot(path, name, parsed)
    except InputError as exc:
        problems.append(str(exc))
        return
    if snap is None:
        pending.append(name)
    else:
        snaps.append(snap)
        if bad_score:
            non_finite.append(name)


def default_jobs() -> int:
    return max(
        1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    )


def _read_all(items: list[Item], jobs: int, result: Scan, problems: list[str], task: str) -> None:
    """Read the folders of `items` (serially or with a process pool) into `result` and `problems`."""
    progress = Progress(f"select-roots[{task}]: read snapshots", total=len(items), logger=log)
    step = max(PARALLEL_MIN // 4, -(-len(items) // (8 * max(1, jobs))))
    chunks = [items[i : i + step] for i in range(0, len(items), step)]
    fast = len(items) >= FAST_MIN
    if jobs > 1 and len(items) >= PARALLEL_MIN:
        import multiprocessing  # only here: the import costs more start-up than a small run takes to read
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork"))
        results = pool.map(_read_many, chunks, [fast] * len(chunks))
    else:
        pool, results = None, map(_read_many, chunks, [fast] * len(chunks))
    try:
        for chunk, (snaps, pending, non_finite, bad) in zip(chunks, results, strict=True):
            result.snapshots += snaps
            result.pending += pending
            result.non_finite += non_finite
            problems += bad
            progress.update(len(chunk))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    progress.finish(
        candidates=len(result.snapshots), pending=len(result.pending), problems=len(problems), jobs=jobs
    )


@gc_paused()
def scan(directory: str | os.PathLike[str], task: str, jobs: int = 1) -> Scan:
    """Read every eval-* folder of one task. Raises one InputError listing all problems found.

    With jobs > 1 and a large run, slices of folders are read by a pool of processes (file reads and JSON
    parsing dominate; on a network filesystem the overlap of many small reads matters even more).
    """
    directory = Path(directory)
    try:
        with os.scandir(directory) as it:
            names = sorted([e.name for e in it if e.name.startswith("eval-") and e.is_dir()])
    except OSError as exc:
        raise InputError(
            f"task {task!r}: cannot list snapshot folder {directory}: {exc.strerror or exc}"
        ) from None
    if not names:
        raise InputError(f"task {task!r}: no eval-* snapshot folders in {directory}")
    # prefix + name is what DirEntry.path would be (os.path.join), without keeping 100k entries around.
    prefix = os.path.join(directory, "")
    problems: list[str] = []
    result = Scan(task, directory, [])
    # parse_name on every folder, as comprehensions (a Python step per folder costs here, at 100k folders).
    paths = [prefix + name for name in names]
    parsed = [m and (int(m[1]), m[2], m[3].lower()) for m in map(NAME_RE.match, names)]
    indices = [p[0] for p in parsed if p]
    if len(set(indices)) == len(indices):
        items = list(zip(names, paths, parsed, strict=True))
    else:  # duplicates are checked on every folder, pending or not; the later folder is reported, not read
        by_index: dict[int, str] = {}
        items = []
        for item in zip(names, paths, parsed, strict=True):
            if item[2] is not None:
                index = item[2][0]
                if index in by_index:
                    problems.append(f"duplicate global index {index}: {by_index[index]} and {item[1]}")
                    continue
                by_index[index] = item[1]
            items.append(item)
    _read_all(items, jobs, result, problems, task)
    if problems:
        shown = "\n  ".join(problems[:MAX_REPORTED])
        more = f"\n  ... and {len(problems) - MAX_REPORTED} more" if len(problems) > MAX_REPORTED else ""
        raise InputError(f"task {task!r}: {len(problems)} bad snapshot(s) in {directory}:\n  {shown}{more}")
    if not result.snapshots:
        raise InputError(
            f"task {task!r}: no candidate snapshots in {directory} ({len(result.pending)} pending, none with eval_ok)"
        )
    result.snapshots.sort(key=attrgetter("global_index"))
    return result
