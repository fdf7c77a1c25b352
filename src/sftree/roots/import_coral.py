"""`sftree import-coral`: turn a standard Coral run folder into the per-eval snapshot folders sftree reads.

    sftree import-coral RUN_DIR --out all_snapshots/<task> [--task NAME] [--direction maximize|minimize]
                        [--shared-items attempts,notes,...] [--max-file-bytes N] [--strict]

One snapshot folder per `real` attempt record of the run (a `tune` or `grader_error` one is no score of the run:
counted by class in the report, no snapshot), over every island of a multi-island run (each snapshot's
`island_id`, its knowledge its own island's checkpoint), in the global order the attempts were submitted:

    OUT/eval-<index>-<agent id>-<commit[:12]>/
      code/           the tree of the attempt's commit in the run's code repository
      shared/         the checkpoint `shared_state_hash` of `.coral/public/.git` (the knowledge when the agent
                      submitted), the folders Coral links into every worktree; in shared/attempts/ the
                      attempt's own record as Coral holds it now (graded, or still pending)
      metadata.json   eval_count, agent_id, commit_hash, shared_state_hash, eval_ok (only once graded), ...
    OUT/import-coral.json, OUT/import-coral.tsv   the report: counts, every problem, one row per attempt
    OUT/.coral-import/   state (the index given to each commit), the blob store, a lock, temporary folders

docs/import_coral.md maps every field to the Coral file it comes from. Each snapshot is built in a temporary
folder and renamed into place; a rerun skips the finished ones, builds the new ones and rebuilds those whose
record changed (pending -> graded), so it is idempotent and incremental on a growing run. Files are written
from git's raw objects (`roots/gitobjects.py`: no git config, hook, attribute or filter of the run applies) and
hard-linked from a content-addressed store (`OUT/.coral-import/blobs`), so an attempt record that 10k snapshots
hold is stored once; store files, and so snapshot files, are read-only. Problems are reported per attempt
(file and reason) and counted; such an attempt gets no snapshot, the others are still made.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias, TypedDict

from sftree.display import shown
from sftree.errors import InputError
from sftree.fileio import write_bytes_atomic, write_json_atomic
from sftree.jsontypes import JSONObject
from sftree.progress import Progress
from sftree.roots import gitobjects as go
from sftree.roots.coral_run import BUDGET_CLASSES, REAL, CoralRun, Problem, Record, read_run
from sftree.runtime import safefs
from sftree.settings import ImportCoralSettings, schema_defaults

log = logging.getLogger(__name__)

FORMAT = 1  # bump when a snapshot's content for the same record changes: every snapshot is rebuilt
STATE_DIR = ".coral-import"
REPORT_JSON, REPORT_TSV = "import-coral.json", "import-coral.tsv"
# What Coral links into every agent worktree (coral/workspace/worktree.py `setup_shared_state`) but `logs`:
# the agents' session transcripts (the seed: a root does not inherit the Student's session), which also grow
# with every checkpoint. `--shared-items` chooses; `attempts` is always there.
# Everything Coral links into a worktree (`--shared-items all`); the default is the schema's
# (import_coral.shared_items: all but logs).
CORAL_ITEMS = ("attempts", "notes", "skills", "roles", "agents", "heartbeat", "eval_logs", "logs")
MAX_FILE = 64 << 20  # bytes of one file
MAX_ENTRIES = 2_000_000  # files and folders in one snapshot
MAX_DEPTH = 64
NAME_MAX = 255  # bytes of one file name (Linux filesystems make no longer one)
MAX_PATH = 4000
MAX_SHOWN = 50  # problem lines printed; the report holds all
LINK_SOFT_MAX = 30_000  # hard links to one store file before a fresh copy takes over (ext4 allows 65000)
STATE_EVERY = 2000  # snapshots between two saves of the state
AGENT_SAFE = re.compile(r"[^A-Za-z0-9._-]")
FILE_MODE = {False: 0o444, True: 0o555}


class ContentError(Exception):
    """An object of an attempt cannot be written as a snapshot file; the message names the path."""


# --- the plan: which attempt is which snapshot -------------------------------------------------------------


@dataclass
class Item:
    record: Record
    index: int
    name: str
    key: str  # digest of what the folder's content depends on
    meta: bytes  # metadata.json as it must be
    action: str = "up_to_date"  # new | rebuild | metadata | up_to_date | problem
    problem: str | None = None


def folder_name(index: int, agent_id: str, commit: str) -> str:
    agent = AGENT_SAFE.sub("_", agent_id)[:64].strip("._") or "agent"
    return f"eval-{index:06d}-{agent}-{commit[:12]}"


def blob_id(data: bytes, fmt: str) -> str:
    h = hashlib.sha256() if fmt == "sha256" else hashlib.sha1()
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def metadata(
    rec: Record, eval_count: int | None, task: str, run: Path, items: list[str], record_id: str
) -> bytes:
    meta: JSONObject = {}
    if eval_count is not None:
        meta["eval_count"] = eval_count
    meta |= {"agent_id": rec.agent_id, "commit_hash": rec.commit, "shared_state_hash": rec.shared_state_hash}
    if rec.island is not None:  # a multi-island run: the island whose hub the attempt and its knowledge are
        meta["island_id"] = rec.island
    if not rec.pending:  # section 2.1: no eval_ok until the grader wrote back
        meta["eval_ok"] = rec.eval_ok
    meta |= {
        "status": rec.status,
        "timestamp": rec.timestamp,
        "task": task,
        "coral_import": {
            "format": FORMAT,
            "run": str(run),
            "record": f"{rec.file}",
            "record_blob": record_id,
            "shared_items": items,
        },
    }
    return (json.dumps(meta, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


# --- the blob store -----------------------------------------------------------------------------------------


@dataclass
class _Source:
    """The store file a blob's links are made from, and its link count."""

    name: str
    links: int


class Store:
    """Content-addressed, read-only files (`<blob id>`, `<blob id>.x` for executables) that snapshot files are
    hard links to. A file with LINK_SOFT_MAX links is followed by a fresh copy (`<name>.<n>`), so no inode
    reaches the filesystem's link limit; where hard links are impossible, files are copied. `ensure` runs in
    the planning thread, `link` in the writers (thread-safe)."""

    def __init__(self, path: Path):
        path.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, safefs.DIR_FLAGS)
        with os.scandir(self.fd) as it:
            names = [e.name for e in it]
        for n in names:
            if n.startswith(".tmp."):
                os.unlink(n, dir_fd=self.fd)
        self.have = {n for n in names if not n.startswith(".")}
        self.current: dict[str, _Source] = {}  # key -> the store file links are made from
        self.lock = threading.Lock()
        self.can_link = True
        self.new_blobs = self.links = self.copies = 0

    def close(self) -> None:
        os.close(self.fd)

    def _write(self, name: str, data: bytes, exe: bool) -> None:
        tmp = f".tmp.{os.getpid()}.{threading.get_ident()}.{name}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=self.fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, FILE_MODE[exe])
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        self.have.add(name)

    def _read(self, name: str) -> bytes:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        with os.fdopen(fd, "rb") as fh:
            return fh.read()

    def ensure(self, oid: str, exe: bool, fetch: Callable[[], bytes]) -> str:
        """The store key of blob `oid`; `fetch()` gives its bytes when it is not stored yet."""
        key = oid + ".x" if exe else oid
        if key not in self.have:
            self._write(key, fetch(), exe)
            self.new_blobs += 1
        return key

    def _source(self, key: str, exe: bool) -> str:
        """The store file to link `key` from (under the lock): a fresh copy once one has LINK_SOFT_MAX links."""
        cur = self.current.get(key)
        if cur is None:
            gen = 0
            while f"{key}.{gen + 1}" in self.have:  # the newest copy an earlier import made
                gen += 1
            name = f"{key}.{gen}" if gen else key
            cur = self.current[key] = _Source(name, os.stat(name, dir_fd=self.fd).st_nlink)
        if cur.links >= LINK_SOFT_MAX:
            self._rotate(key, exe)
        cur.links += 1
        return cur.name

    def _rotate(self, key: str, exe: bool) -> None:
        cur = self.current[key]
        gen = int(cur.name.rsplit(".", 1)[1]) + 1 if cur.name != key else 1
        name = f"{key}.{gen}"
        self._write(name, self._read(cur.name), exe)
        cur.name, cur.links = name, 1

    def link(self, key: str, dfd: int, name: bytes) -> None:
        """Make `name` in folder `dfd` a hard link to store file `key` (a copy where links are impossible)."""
        exe = key.endswith(".x")
        with self.lock:
            src = None if not self.can_link else self._source(key, exe)
        if src is not None:
            try:
                os.link(src, name, src_dir_fd=self.fd, dst_dir_fd=dfd, follow_symlinks=False)
                with self.lock:
                    self.links += 1
                return
            except OSError as exc:
                if exc.errno == errno.EMLINK:  # more links elsewhere than we counted: a fresh copy
                    with self.lock:
                        self._rotate(key, exe)
                    return self.link(key, dfd, name)
                if exc.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                with self.lock:
                    if self.can_link:
                        log.warning("hard links are not possible here (%s): files are copied", exc.strerror)
                    self.can_link = False
        self._copy(key, exe, dfd, name)

    def _copy(self, key: str, exe: bool, dfd: int, name: bytes) -> None:
        data = self._read(key)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, FILE_MODE[exe], dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        with self.lock:
            self.copies += 1


# --- planning one snapshot: the run's objects -> a recipe of folders, links and symlinks --------------------

# A recipe is a list of (kind, name, arg): ("d", name, sub-recipe) a folder, ("l", name, store key) a file,
# ("s", name, target) a symlink, ("e", name, None) an empty folder (a gitlink). Everything in it was checked.
Recipe: TypeAlias = list[tuple[Literal["d", "l", "s", "e"], bytes, "Recipe | str | bytes | None"]]


class Planner:
    """Reads trees and blobs of the run (one git process per repository) and checks every entry: a plain UTF-8
    name (no `.`, `..`, `/`, `.git`), a known mode, bounded sizes, depth and count. Blobs go into the store
    here, so the writers only make folders and links. Small trees' recipes are kept (a tree never changes)."""

    CACHE_MAX = 256  # entries of a recipe worth keeping (skills/, notes/, code folders; not attempts/)

    def __init__(
        self,
        code: go.ObjectReader,
        checkpoints: dict[str | None, go.ObjectReader],
        store: Store,
        max_file: int,
    ):
        self.code, self.checkpoints, self.store, self.max_file = code, checkpoints, store, max_file
        self.cache: dict[tuple[int, str], tuple[Recipe, int, int]] = {}  # (reader, tree) -> recipe, height, n
        self.entries = 0

    def _name(self, name: bytes, shown: str) -> str:
        if name in (b".", b"..") or not name:
            raise ContentError(f"{shown}: the name {name!r} is not a plain file name")
        if name.rstrip(b". ").lower() == b".git":
            raise ContentError(
                f"{shown}: a {name.decode('utf-8', 'replace')!r} entry (sftree never writes one)"
            )
        if len(name) > NAME_MAX:
            raise ContentError(
                f"{shown}: a name of {len(name)} bytes, longer than a file name may be ({NAME_MAX})"
            )
        try:
            return name.decode("utf-8")
        except UnicodeDecodeError:
            raise ContentError(f"{shown}: the name {name!r} is not UTF-8") from None

    def _blob(self, reader: go.ObjectReader, oid: str, path: str, limit: int | None = None) -> bytes:
        try:
            return reader.read(oid, "blob", limit=self.max_file if limit is None else limit)[1]
        except go.ObjectError as exc:
            raise ContentError(f"{path}: {exc}") from None

    def tree(
        self, reader: go.ObjectReader, oid: str, shown: str, depth: int, skip: bytes | None = None
    ) -> tuple[Recipe, int, int]:
        """(recipe, height, entries) of tree `oid`, whose path is `shown`."""
        ck = (id(reader), oid)
        hit = self.cache.get(ck) if skip is None else None
        if hit is not None:
            if depth + hit[1] > MAX_DEPTH:
                raise ContentError(f"{shown}: folders nested deeper than {MAX_DEPTH}")
            self._count(hit[2], shown)
            return hit
        if depth > MAX_DEPTH:
            raise ContentError(f"{shown}: folders nested deeper than {MAX_DEPTH}")
        try:
            entries = reader.tree(oid, max_entries=MAX_ENTRIES - self.entries)
        except go.TooManyEntries as exc:
            raise ContentError(
                f"{shown}: more than {MAX_ENTRIES} files and folders in one snapshot ({exc})"
            ) from None
        except go.ObjectError as exc:
            raise ContentError(f"{shown}: {exc}") from None
        recipe: Recipe = []
        height, count = 0, 0
        names = set()
        for mode, name, eoid in entries:
            if name == skip:
                continue
            path = f"{shown}/{self._name(name, shown)}"
            if name in names:
                raise ContentError(f"{path}: the tree names it twice")
            names.add(name)
            if len(path) > MAX_PATH:
                raise ContentError(f"{path[:200]}...: a path longer than {MAX_PATH} characters")
            self._count(1, shown)
            count += 1
            if mode == go.MODE_TREE:
                sub, h, n = self.tree(reader, eoid, path, depth + 1)
                recipe.append(("d", name, sub))
                height, count = max(height, h + 1), count + n
            elif mode in go.BLOB_MODES:
                exe = go.BLOB_MODES[mode]
                key = self.store.ensure(eoid, exe, functools.partial(self._blob, reader, eoid, path))
                recipe.append(("l", name, key))
            elif mode == go.MODE_LINK:
                target = self._blob(reader, eoid, path, limit=4095)
                if not target or b"\0" in target or len(target) > 4095:
                    raise ContentError(f"{path}: a symlink whose target is empty, too long or holds NUL")
                recipe.append(("s", name, target))
            elif mode == go.MODE_GITLINK:  # a submodule's commit: git checks out an empty folder without it
                recipe.append(("e", name, None))
            else:
                raise ContentError(f"{path}: unknown git file mode {mode.decode('ascii', 'replace')}")
        out = (recipe, height, count)
        if skip is None and count <= self.CACHE_MAX:
            if len(self.cache) > 100_000:
                self.cache.clear()
            self.cache[ck] = out
        return out

    def _count(self, n: int, shown: str) -> None:
        self.entries += n
        if self.entries > MAX_ENTRIES:
            raise ContentError(f"{shown}: more than {MAX_ENTRIES} files and folders in one snapshot")

    def snapshot(self, rec: Record, items: list[str], fmt: str) -> tuple[Recipe, Recipe]:
        """The recipes of code/ and shared/ of an attempt; ContentError names what cannot be written."""
        self.entries = 0
        try:
            code_tree = self.code.commit_tree(rec.commit)
        except go.ObjectError as exc:
            if exc.missing:
                raise ContentError(
                    f"commit {rec.commit} is not in the run's code repository: {exc}"
                ) from None
            raise ContentError(
                f"commit {rec.commit} cannot be read from the run's code repository: {exc}"
            ) from None
        if rec.shared_state_hash is None:
            raise ContentError(
                "no shared_state_hash: the Coral that made this run records no checkpoint per attempt (or its "
                "checkpoint failed), so the knowledge this attempt saw is unknown"
            )
        checkpoint = self.checkpoints[rec.island]  # its own island's knowledge
        try:
            shared_tree = checkpoint.commit_tree(rec.shared_state_hash)
            top = checkpoint.tree(shared_tree, max_entries=MAX_ENTRIES)
        except go.ObjectError as exc:
            what = "is not in" if exc.missing else "cannot be read from"
            hub = rec.file.rsplit("/attempts/", 1)[0]
            raise ContentError(
                f"checkpoint {rec.shared_state_hash} {what} the checkpoint repository {hub}/.git: {exc}"
            ) from None
        code = self.tree(self.code, code_tree, "code", 1)[0]
        own = f"{rec.commit}.json".encode()
        shared: Recipe = []
        seen = set()
        for mode, name, eoid in top:
            text = name.decode("utf-8", "replace")
            if text not in items or text in seen:
                continue
            seen.add(text)
            path = f"shared/{text}"
            if mode != go.MODE_TREE:
                raise ContentError(f"{path}: not a folder in the checkpoint (Coral makes it a folder)")
            sub = self.tree(checkpoint, eoid, path, 2, skip=own if text == "attempts" else None)[0]
            if text == "attempts":
                sub = [*sub, ("l", own, self.store.ensure(blob_id(rec.data, fmt), False, lambda: rec.data))]
            shared.append(("d", name, sub))
        for text in items:  # Coral makes these folders at the start; git keeps no empty folder
            if text not in seen:
                sub = [("l", own, self.store.ensure(blob_id(rec.data, fmt), False, lambda: rec.data))]
                shared.append(("d", text.encode(), sub if text == "attempts" else []))
        return code, shared


def make(recipe: Recipe, dfd: int, store: Store) -> None:
    """Carry out `recipe` in the (new, empty) folder `dfd`: folders made here and entered by descriptor, never
    through a link; an entry that exists already (a duplicate name) raises FileExistsError."""
    for kind, name, arg in recipe:
        if kind == "l" and isinstance(arg, str):
            store.link(arg, dfd, name)
        elif kind == "d" and isinstance(arg, list):
            os.mkdir(name, 0o755, dir_fd=dfd)
            sub = os.open(name, safefs.DIR_FLAGS, dir_fd=dfd)
            try:
                make(arg, sub, store)
            finally:
                os.close(sub)
        elif kind == "s" and isinstance(arg, bytes):
            os.symlink(arg, name, dir_fd=dfd)
        elif kind == "e":
            os.mkdir(name, 0o755, dir_fd=dfd)
        else:  # (the planner makes no other entry)
            raise TypeError(f"recipe entry {kind!r} {name!r} with {type(arg).__name__}")


@contextlib.contextmanager
def _dir(dfd: int, name: str) -> Iterator[int]:
    fd = os.open(name, safefs.DIR_FLAGS, dir_fd=dfd)
    try:
        yield fd
    finally:
        os.close(fd)


# --- the output folder: lock, state, report -----------------------------------------------------------------


class StateEntry(TypedDict):
    """One attempt's entry in the output's state.json: its snapshot's index and folder, and the digests of what
    the folder was made from (None: unknown, a folder found without its entry)."""

    index: int
    name: str
    key: str | None
    meta: str | None


@dataclass
class Output:
    out: Path
    state: dict[str, StateEntry] = field(default_factory=dict)  # record key -> what the import made of it
    run: str | None = None

    @property
    def sdir(self) -> Path:
        return self.out / STATE_DIR

    def load(self, existing: set[str]) -> None:
        """The state of earlier imports, and every eval-* folder it does not list (a run killed between a
        rename and the next save of the state): such a folder keeps its index and is rebuilt."""
        path = self.sdir / "state.json"
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            doc = None
        except (OSError, ValueError) as exc:
            log.warning("%s unreadable (%s): indices are taken from the snapshot folders", path, exc)
            doc = None
        if isinstance(doc, dict) and doc.get("format") == FORMAT and isinstance(doc.get("items"), dict):
            self.state, self.run = doc["items"], doc.get("run")
        listed = {s.get("name") for s in self.state.values()}
        for name in sorted(existing - listed):
            try:
                meta = json.loads((self.out / name / "metadata.json").read_text())
            except (OSError, ValueError):
                meta = None
            if not isinstance(meta, dict) or not isinstance(meta.get("coral_import"), dict):
                raise InputError(
                    f"{self.out} already holds {name}, which import-coral did not make: give an --out of its own"
                )
            m = re.match(r"^eval-(\d+)-", name)
            commit, island = meta.get("commit_hash"), meta.get("island_id")
            if m and isinstance(commit, str):
                key = commit if island is None else f"{island}/{commit}"
                if key not in self.state:
                    self.state[key] = {"index": int(m[1]), "name": name, "key": None, "meta": None}

    def save(self, run: Path) -> None:
        write_json_atomic(
            self.sdir / "state.json", {"format": FORMAT, "run": str(run), "items": self.state}, indent=None
        )


def _existing(out: Path) -> set[str]:
    with os.scandir(out) as it:
        return {e.name for e in it if e.name.startswith("eval-") and e.is_dir(follow_symlinks=False)}


def _clear(folder: Path) -> None:
    if folder.exists():
        for entry in os.listdir(folder):
            safefs.remove_all(folder / entry)
    folder.mkdir(parents=True, exist_ok=True)


# --- the import ---------------------------------------------------------------------------------------------


@dataclass
class Result:
    items: list[Item]
    problems: list[Problem]
    notes: list[str]
    counts: dict[str, int]
    actions: dict[str, int]
    seconds: float
    budget_classes: dict[str, int] = field(
        default_factory=dict
    )  # records per class (only `real` become snapshots)


def plan(
    run: CoralRun, output: Output, task: str, items: list[str], fmt: str
) -> tuple[list[Item], list[str]]:
    """Give every `real` record its global index (kept from earlier imports; new ones after them in submission
    order, over all islands), its eval_count (its place among its hub's graded attempts) and the metadata its
    snapshot must have. `tune` and `grader_error` records are no scores of the run: they get no snapshot."""
    notes: list[str] = []
    records = sorted(
        (r for r in run.records if r.budget_class == REAL), key=lambda r: (r.when, r.commit, r.island or "")
    )
    known = {k: s["index"] for k, s in output.state.items()}
    next_index = max(known.values(), default=0) + 1
    latest_known = max((r.when for r in records if r.key in known), default=None)
    late = 0
    index: dict[str, int] = {}
    for r in records:
        if r.key in known:
            index[r.key] = known[r.key]
        else:
            index[r.key] = next_index
            next_index += 1
            if latest_known is not None and r.when < latest_known:
                late += 1
    if late:
        notes.append(
            f"{late} attempt(s) appeared after later ones were imported: they are given the next free indices, "
            "not their place in the submission order (indices never change once given)"
        )
    by_index = sorted(records, key=lambda r: index[r.key])
    notes += _eval_count_notes(run)
    rank = _ranks(run, index)
    plan_items = []
    for r in by_index:
        rid = blob_id(r.data, fmt)
        key = _digest([FORMAT, r.commit, r.shared_state_hash, rid, items, *([r.island] if r.island else [])])
        meta = metadata(r, rank.get(r.key), task, run.run_dir, items, rid)
        plan_items.append(Item(r, index[r.key], folder_name(index[r.key], r.agent_id, r.commit), key, meta))
    return plan_items, notes


def _ranks(run: CoralRun, index: dict[str, int]) -> dict[str, int]:
    """Each `real` graded record's place among its hub's graded records, in submission order: the number the
    hub's eval counter had after grading it. Coral's daemon counts every graded attempt, whatever its class, so
    `tune` and `grader_error` ones take their place in time; a run of `real` ones only is taken in index order
    (the submission order, but for records that appeared late)."""
    if all(r.key in index for r in run.records):
        order = sorted(run.records, key=lambda r: index[r.key])
    else:
        order = sorted(run.records, key=lambda r: (r.when, r.commit))
    rank: dict[str, int] = {}
    graded: dict[str | None, int] = {}
    for r in order:
        if not r.pending:
            graded[r.island] = graded.get(r.island, 0) + 1
            if r.budget_class == REAL:
                rank[r.key] = graded[r.island]
    return rank


def _eval_count_notes(run: CoralRun) -> list[str]:
    notes = []
    for hub in run.hubs:
        graded = sum(1 for r in run.records if r.island == hub.island and not r.pending)
        if hub.eval_count is not None and hub.eval_count != graded:
            notes.append(
                f"{hub.rel}/eval_count is {hub.eval_count} but {graded} attempt record(s) are graded: each "
                "snapshot's eval_count is its place among the graded records, in submission order"
            )
    return notes


def run_import(
    run_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    task: str | None = None,
    direction: str | None = None,
    items: list[str] | None = None,
    max_file: int = MAX_FILE,
    jobs: int = 1,
) -> Result:
    t0 = time.monotonic()
    run = read_run(run_dir)
    out = Path(os.path.abspath(out))
    task = task or Path(os.path.realpath(out)).name
    items = list(dict.fromkeys(["attempts", *(items or schema_defaults(ImportCoralSettings).shared_items)]))
    if direction and run.direction and direction != run.direction:
        raise InputError(
            f"task {task!r} is configured to {direction}, but the Coral run {run.run_dir} graded it to "
            f"{run.direction} (.coral/config.yaml grader.direction)"
        )
    if os.path.realpath(out).startswith(str(run.run_dir) + os.sep):
        raise InputError(f"--out {out} is inside the Coral run {run.run_dir}: write the snapshots elsewhere")
    out.mkdir(parents=True, exist_ok=True)
    sdir = out / STATE_DIR
    sdir.mkdir(exist_ok=True)
    lock = open(sdir / "lock", "w")  # noqa: SIM115 - held until the end
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"another import-coral is writing {out} (lock {sdir / 'lock'})") from None
        return _locked(run, out, task, items, max_file, max(1, jobs), t0)
    finally:
        lock.close()


def _locked(
    run: CoralRun, out: Path, task: str, items: list[str], max_file: int, jobs: int, t0: float
) -> Result:
    output = Output(out)
    existing = _existing(out)
    output.load(existing)
    problems = list(run.problems)
    notes = list(run.notes)
    fmt = _format(r.commit for r in run.records)
    if output.state and run.records and not (set(output.state) & {r.key for r in run.records}):
        raise InputError(
            f"{out} holds an import of another Coral run ({output.run}): none of its attempts is in "
            f"{run.run_dir}; give an --out of its own"
        )
    plan_items, plan_notes = plan(run, output, task, items, fmt)
    notes += plan_notes
    for it in plan_items:
        st = output.state.get(it.record.key)
        if it.name not in existing or st is None or st.get("name") != it.name:
            it.action = "new" if it.name not in existing else "rebuild"
        elif st.get("key") != it.key:
            it.action = "rebuild"
        elif st.get("meta") != hashlib.sha256(it.meta).hexdigest():
            it.action = "metadata"
    gone = sorted(set(output.state) - {it.record.key for it in plan_items})
    if gone:
        notes.append(f"{len(gone)} snapshot(s) in {out} whose attempt record is no longer in the run: kept")
    tmp, trash = output.sdir / "tmp", output.sdir / "trash"
    _clear(tmp)
    _clear(trash)
    notes += _drop_left_out(run, output, out)
    git_root = output.sdir / "git"
    todo = [it for it in plan_items if it.action in ("new", "rebuild")]
    store = Store(output.sdir / "blobs")
    readers: list[go.ObjectReader] = []
    try:
        if todo:
            planner = Planner(*_readers(run, git_root, fmt, max_file, readers), store, max_file)
            _build_all(todo, planner, store, items, fmt, out, tmp, trash, output, run.run_dir, task, jobs)
        for it in plan_items:
            if it.action == "metadata":
                write_bytes_atomic(out / it.name / "metadata.json", it.meta)
                output.state[it.record.key]["meta"] = hashlib.sha256(it.meta).hexdigest()
        if todo:
            os.sync()  # the folders were renamed into place: their files must be on disk before the state says so
        output.save(run.run_dir)
    finally:
        for r in readers:
            r.close()
        store.close()
        safefs.remove_all(git_root)
    for it in plan_items:
        if it.problem:
            problems.append(
                Problem(it.record.file, it.problem, it.record.commit, it.record.agent_id, it.index)
            )
    counts = _counts(plan_items, problems, out, sum(1 for r in run.records if r.budget_class != REAL))
    classes = {c: sum(1 for r in run.records if r.budget_class == c) for c in BUDGET_CLASSES}
    result = Result(
        plan_items, problems, notes, counts, _actions(plan_items, store), time.monotonic() - t0, classes
    )
    _report(result, run, out, task, items)
    return result


def _readers(
    run: CoralRun, git_root: Path, fmt: str, max_file: int, readers: list[go.ObjectReader]
) -> tuple[go.ObjectReader, dict[str | None, go.ObjectReader]]:
    """One object reader on the code repository and one on each hub's checkpoint repository (appended to
    `readers`, which the caller closes): (code, {island: checkpoint})."""
    code_dir = go.host_git_dir(git_root / "code", [run.code_objects], fmt)
    code = go.ObjectReader(code_dir, fmt, max_file, run.code_refused)
    readers.append(code)
    checkpoints: dict[str | None, go.ObjectReader] = {}
    for n, hub in enumerate(run.hubs):
        hashes = (r.shared_state_hash for r in run.records if r.shared_state_hash and r.island == hub.island)
        ck_fmt = _format(hashes)
        name = "checkpoint" if hub.island is None else f"checkpoint-{n}"
        ck_dir = go.host_git_dir(git_root / name, [hub.checkpoint_objects], ck_fmt)
        checkpoints[hub.island] = go.ObjectReader(ck_dir, ck_fmt, max_file, hub.checkpoint_refused)
        readers.append(checkpoints[hub.island])
    return code, checkpoints


def _drop_left_out(run: CoralRun, output: Output, out: Path) -> list[str]:
    """Remove the snapshot of an attempt imported while pending whose grading made it no score of the run
    (`grader_error`: the grader timed out or raised): only `real` attempts are snapshots."""
    dropped = 0
    for r in run.records:
        st = output.state.get(r.key)
        if r.budget_class == REAL or st is None:
            continue
        name = st.get("name")
        if name and os.path.lexists(out / name):
            os.rename(out / name, output.sdir / "trash" / name)
            safefs.remove_all(output.sdir / "trash" / name)
        del output.state[r.key]
        dropped += 1
    if not dropped:
        return []
    return [
        f"{dropped} snapshot(s) removed: their attempt, pending when imported, was graded as no score of the "
        "run (budget_class grader_error or tune)"
    ]


def _format(hashes: Iterable[str]) -> str:
    """The object format of a repository from the hashes that name its commits (SHA-1 unless all are 64 long)."""
    fmts = {go.object_format(h) for h in hashes}
    return "sha256" if fmts == {"sha256"} else "sha1"


def _build_all(
    todo: list[Item],
    planner: Planner,
    store: Store,
    items: list[str],
    fmt: str,
    out: Path,
    tmp: Path,
    trash: Path,
    output: Output,
    run_dir: Path,
    task: str,
    jobs: int,
) -> None:
    """Plan each snapshot here (the git readers and the store are this thread's), write it in `jobs` threads
    (folders and links: system calls, which run in parallel), rename each into place when it is complete."""
    progress = Progress(f"import-coral[{task}]: snapshots", total=len(todo), logger=log)
    lock = threading.Lock()
    tfd = os.open(tmp, safefs.DIR_FLAGS)
    inflight: deque[Future[None]] = deque()
    done = 0

    def settle(n: int) -> None:
        nonlocal done
        while len(inflight) > n:
            inflight.popleft().result()
            done += 1
            progress.update(1, links=store.links, blobs=store.new_blobs)
            if done % STATE_EVERY == 0:
                with lock:
                    output.save(run_dir)

    try:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="import-coral") as pool:
            try:
                for it in todo:
                    try:
                        code, shared = planner.snapshot(it.record, items, fmt)
                    except ContentError as exc:
                        _failed(it, str(exc))
                        progress.update(1)
                        continue
                    inflight.append(
                        pool.submit(_write, it, code, shared, store, tfd, out, tmp, trash, output, lock)
                    )
                    settle(2 * jobs)
                settle(0)
            except BaseException:
                for f in inflight:
                    f.cancel()
                raise
    finally:
        os.close(tfd)
    progress.finish(links=store.links, blobs=store.new_blobs)


def _failed(it: Item, reason: str) -> None:
    it.problem = reason
    if it.action == "rebuild":  # the finished folder stays as it was
        it.problem += f" (the snapshot {it.name} made earlier is kept as it was)"
    it.action = "problem"


def _write(
    it: Item,
    code: Recipe,
    shared: Recipe,
    store: Store,
    tfd: int,
    out: Path,
    tmp: Path,
    trash: Path,
    output: Output,
    lock: threading.Lock,
) -> None:
    """Write `it` into a temporary folder, then rename it into place (a rebuilt one replaces the old one)."""
    tname = f"{it.name}.{os.getpid()}"
    os.mkdir(tname, 0o755, dir_fd=tfd)
    try:
        with _dir(tfd, tname) as dfd:
            for part, recipe in (("code", code), ("shared", shared)):
                os.mkdir(part, 0o755, dir_fd=dfd)
                with _dir(dfd, part) as fd:
                    make(recipe, fd, store)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open("metadata.json", flags, 0o644, dir_fd=dfd)
            try:
                os.write(fd, it.meta)
            finally:
                os.close(fd)
    except FileExistsError as exc:
        safefs.remove_all(tmp / tname)
        _failed(it, f"{os.fsdecode(exc.filename or '')}: a name the tree holds twice")
        return
    except BaseException:
        safefs.remove_all(tmp / tname)
        raise
    final = out / it.name
    with lock:
        entry = output.state.get(it.record.key)
        old = entry.get("name") if entry else None
    if os.path.lexists(final):
        os.rename(final, trash / tname)
    os.rename(tmp / tname, final)
    safefs.remove_all(trash / tname)
    if old and old != it.name and os.path.lexists(out / old):  # the record's agent_id changed: one folder
        os.rename(out / old, trash / old)
        safefs.remove_all(trash / old)
    with lock:
        output.state[it.record.key] = {
            "index": it.index,
            "name": it.name,
            "key": it.key,
            "meta": hashlib.sha256(it.meta).hexdigest(),
        }


def _counts(plan_items: list[Item], problems: list[Problem], out: Path, left_out: int = 0) -> dict[str, int]:
    """What the output holds after the import (the same for the same run, however many imports made it)."""
    present = _existing(out)
    made = [it for it in plan_items if it.name in present]
    return {
        "records": len(plan_items) + left_out + sum(1 for p in problems if p.index is None),
        "snapshots": len(present),
        "pending": sum(1 for it in made if it.record.pending),
        "eval_ok_true": sum(1 for it in made if not it.record.pending and it.record.eval_ok),
        "eval_ok_false": sum(1 for it in made if not it.record.pending and not it.record.eval_ok),
        "problems": len(problems),
    }


def _actions(plan_items: list[Item], store: Store) -> dict[str, int]:
    """What this import did (printed and logged, not in the report: a rerun that did nothing changes no file)."""
    by = {
        a: sum(1 for it in plan_items if it.action == a) for a in ("new", "rebuild", "metadata", "up_to_date")
    }
    return {
        "written": by["new"],
        "rebuilt": by["rebuild"],
        "metadata_updated": by["metadata"],
        "up_to_date": by["up_to_date"],
        "links": store.links,
        "new_blobs": store.new_blobs,
        "copies": store.copies,
    }


def _report(result: Result, run: CoralRun, out: Path, task: str, items: list[str]) -> None:
    """import-coral.json (counts, notes, every problem) and import-coral.tsv (one row per attempt), written only
    when their content changes, so an import that changed nothing leaves them (and the workflow) alone."""
    coral: JSONObject = {
        "task": run.task_name,
        "direction": run.direction,
        "eval_count": run.eval_count,
        "in_progress": run.in_progress,
        "code_repository": run.code_repo,
    }
    if run.islands:
        coral["islands"] = [
            {"island_id": h.island, "hub": h.rel, "eval_count": h.eval_count} for h in run.hubs
        ]
    doc = {
        "run": str(run.run_dir),
        "task": task,
        "coral": coral,
        "budget_classes": result.budget_classes,
        "shared_items": items,
        "counts": result.counts,
        "notes": result.notes,
        "problems": [
            {
                "record": p.file,
                "commit": p.commit,
                "agent_id": p.agent_id,
                "index": p.index,
                "reason": p.reason,
            }
            for p in result.problems
        ],
    }
    reasons = {p.file: p.reason for p in result.problems if p.commit}
    present = _existing(out)
    rows = ["index\tsnapshot\tcommit_hash\tagent_id\tstatus\teval_ok\teval_count\tproblem"]
    if run.islands:
        rows[0] += "\tisland_id"
    for it in result.items:
        meta = json.loads(it.meta)
        ok = "" if "eval_ok" not in meta else str(meta["eval_ok"]).lower()
        row = [str(it.index), it.name if it.name in present else "", it.record.commit, it.record.agent_id]
        row += [it.record.status, ok, str(meta.get("eval_count", "")), reasons.get(it.record.file, "")]
        rows.append("\t".join(map(_tsv, row + ([it.record.island or ""] if run.islands else []))))
    for r in sorted(run.records, key=lambda r: (r.when, r.commit)):
        if r.budget_class != REAL:  # counted by class, no snapshot: not a score of the run
            row = ["", "", r.commit, r.agent_id, r.status, "", "", f"left out: budget_class {r.budget_class}"]
            rows.append("\t".join(map(_tsv, row + ([r.island or ""] if run.islands else []))))
    for p in result.problems:
        if p.index is None:
            rows.append("\t".join(["", "", p.commit or "", "", "", "", "", _tsv(f"{p.file}: {p.reason}")]))
    _write_if_changed(
        out / REPORT_JSON, (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    )
    _write_if_changed(out / REPORT_TSV, ("\n".join(rows) + "\n").encode("utf-8"))


def _write_if_changed(path: Path, data: bytes) -> None:
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    write_bytes_atomic(path, data)


def _tsv(text: str) -> str:
    return shown(text.replace("\t", " ").replace("\n", " ").replace("\r", " "))


# --- CLI ----------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", help="the Coral run folder (holds .coral/), or its .coral/"
    )
    parser.add_argument("--out", required=True, help="the task's snapshot folder, e.g. all_snapshots/<task>")
    parser.add_argument(
        "--task", help="task name written into metadata.json (default: the --out folder's name)"
    )
    parser.add_argument(
        "--direction",
        choices=("maximize", "minimize"),
        help="refuse the run when its .coral/config.yaml grades the other way",
    )
    parser.add_argument(
        "--shared-items",
        default=",".join(schema_defaults(ImportCoralSettings).shared_items),
        help="checkpoint folders copied into shared/ (comma list, or `all` for everything Coral links into a "
        f"worktree: {','.join(CORAL_ITEMS)}); attempts is always copied (default: %(default)s)",
    )
    parser.add_argument(
        "--max-file-bytes", type=int, default=MAX_FILE, help="largest file written (default: 64 MiB)"
    )
    parser.add_argument(
        "--jobs", type=int, default=default_jobs(), help="threads writing snapshots (default: %(default)s)"
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit with status 2 when any attempt has a problem"
    )


def default_jobs() -> int:
    """Up to 4 threads: creating links is system-call bound and scales with cores, past 4 the disk decides."""
    return max(
        1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    )


def _items(text: str) -> list[str]:
    if text.strip() == "all":
        return list(CORAL_ITEMS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [
        n for n in names if not re.fullmatch(r"[A-Za-z0-9._-]+", n) or n in (".", "..") or n.lower() == ".git"
    ]
    if bad:
        raise InputError(f"--shared-items: not folder names: {', '.join(bad)}")
    return names


def run(args: argparse.Namespace) -> int:
    result = run_import(
        args.run_dir,
        args.out,
        task=args.task,
        direction=args.direction,
        items=_items(args.shared_items),
        max_file=args.max_file_bytes,
        jobs=args.jobs,
    )
    c, a = result.counts, result.actions
    for note in result.notes:
        print(f"import-coral: note: {shown(note)}", file=sys.stderr)
    for p in result.problems[:MAX_SHOWN]:
        print(f"import-coral: problem: {p.line()}", file=sys.stderr)
    if len(result.problems) > MAX_SHOWN:
        print(
            f"import-coral: ... and {len(result.problems) - MAX_SHOWN} more problems ({Path(args.out) / REPORT_JSON})",
            file=sys.stderr,
        )
    print(
        f"import-coral: {c['records']} attempt records -> {c['snapshots']} snapshots in {args.out} "
        f"({c['pending']} pending, {c['eval_ok_true']} eval_ok, {c['eval_ok_false']} failed); this import: "
        f"{a['written']} new, {a['rebuilt']} rebuilt, {a['metadata_updated']} metadata updated, "
        f"{a['up_to_date']} up to date, {a['links']} links, {a['new_blobs']} new blobs; "
        f"{c['problems']} problem(s); {result.seconds:.1f}s"
    )
    left = {k: v for k, v in result.budget_classes.items() if k != REAL and v}
    if left:
        print(
            "import-coral: left out (no score of the run): " + ", ".join(f"{v} {k}" for k, v in left.items()),
            file=sys.stderr,
        )
    if c["snapshots"] == 0:
        raise InputError(
            f"no snapshot could be made from {args.run_dir}: {c['problems']} problem(s), "
            f"see {Path(args.out) / REPORT_JSON}"
        )
    if args.strict and result.problems:
        return 2
    return 0
