"""The attempt records of one knowledge checkout, kept current from what changed (docs/runtime.md).

A fork checks out every attempt of the root (10k+ in a long Coral run), and each turn prompt and `coral eval`
needs the branch's best score, its attempt count and the trailing run without improvement. Stat-ing (let alone
parsing) every record at every load is O(attempts); an `AttemptView` instead looks only at the names in
`attempts/` that its checkout's inotify watch (kwatch.py) reported since the last refresh. It keeps a slim
summary per record (what those queries need; `coral show` reads the one file it shows) in sorted lists, so a
query costs O(log A) or the length of what it returns.

The agent may write, delete, rename or link anything there, even while the host reads. What keeps the view right:
- every name an event reports is parsed again (never trusted on stat data, so a rewrite within one timestamp
  tick is seen), without following links; a link or special file is not a record;
- a replaced, moved or deleted folder, a new subfolder, or a queue overflow means a full rescan (kwatch.py);
- a change made through a hard link from outside the folder raises no event there, so records seen with more
  than one link are parsed at every refresh, and what each knowledge commit staged (git compares inode and
  ctime of the paths it looks at) is parsed again (`mark_dirty`).
Without a watch (not Linux, no inotify left, a one-off view) every refresh is a full scan.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
import stat
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from sftree.runtime import safefs
from sftree.runtime.kwatch import KnowledgeWatch

log = logging.getLogger(__name__)

ATTEMPTS_REL = Path(".opencode") / "attempts"
_MARKS = ("improved", "baseline")  # statuses that end a run without improvement


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """What the queries need from one record (`coral show` reads the file itself)."""

    name: str  # file name in attempts/
    commit_hash: str
    timestamp: str
    score: float | None  # numeric and finite, else None
    status: str
    title: str

    @property
    def order(self) -> tuple[str, str, str]:
        """Coral's order: oldest first, ties by commit hash (the name makes the key unique)."""
        return (self.timestamp, self.commit_hash, self.name)


def numeric(x) -> float | None:
    if isinstance(x, int | float) and not isinstance(x, bool):
        x = float(x)
        return x if math.isfinite(x) else None
    return None


def info_from_record(name: str, d: dict) -> AttemptInfo:
    return AttemptInfo(
        name=name,
        commit_hash=str(d.get("commit_hash", name[: -len(".json")])),
        timestamp=str(d.get("timestamp", "")),
        score=numeric(d.get("score")),
        status=str(d.get("status", "?")),
        title=str(d.get("title", ""))[:200],
    )


def read_record(dir_fd: int, name: str) -> tuple[os.stat_result | None, dict | None]:
    """(stat, parsed record) of a regular file, never through a link; (stat or None, None) when it is no record."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None, None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a folder, a FIFO, a device: never read
            return st, None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            d = json.loads(fh.read(safefs.MAX_READ).decode("utf-8"))
    except (OSError, ValueError):
        return None, None
    finally:
        os.close(fd)
    return st, (d if isinstance(d, dict) else None)


def _is_record_name(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(".") and "/" not in name


class AttemptView:
    """The records of `<root>/.opencode/attempts`, refreshed from what `watch` reports (module docstring);
    without a watch, every refresh is a full scan."""

    def __init__(self, root: Path, watch: KnowledgeWatch | None = None, rel: Path = ATTEMPTS_REL):
        self.root, self.rel, self.watch = Path(root), Path(rel), watch
        self._lock = threading.RLock()
        self._infos: dict[str, AttemptInfo] = {}
        self._recheck: set[str] = set()  # records with more than one link: parsed at every refresh
        self._dirty: set[str] = set()  # names git reported changed (mark_dirty)
        self._order: list[tuple[str, str, str]] = []
        self._scores: list[tuple[float, str]] = []
        self._marks: list[tuple[str, str, str]] = []  # order keys of `improved`/`baseline` records
        self.full_scans = 0  # for tests and benchmarks: how often every file was read
        self.reads = 0  # files read

    # ---- upkeep --------------------------------------------------------------------------------------------
    def rebind(self, root: Path) -> None:
        """The checkout moved (parked, reused): same folder inodes, new path."""
        with self._lock:
            self.root = Path(root)
            if self.watch is not None:
                self.watch.rebind(root)

    def mark_dirty(self, names) -> None:
        """Names (in attempts/) to parse again at the next refresh, whatever the events said."""
        with self._lock:
            self._dirty.update(n for n in names if "/" not in n)

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()

    def refresh(self) -> AttemptView:
        """Bring the view up to date with the folder; returns self."""
        with self._lock:
            names, reset = set(), True
            if self.watch is not None:
                self.watch.sync()
                names, reset = self.watch.take_attempt_changes()
            try:
                with safefs.open_dir(self.root, self.rel) as dfd:
                    if reset:
                        self._full_scan(dfd)
                    else:
                        for name in names | self._dirty | self._recheck:
                            self._update(dfd, name)
                    self._dirty.clear()
            except OSError:  # no attempts folder, or a link or a file where it should be: no attempts
                self._forget_all()
            return self

    def _full_scan(self, dfd: int) -> None:
        self.full_scans += 1
        self._forget_all()
        with os.scandir(dfd) as it:
            present = [e.name for e in it if _is_record_name(e.name)]
        for name in present:
            self._read(dfd, name)
        # One sort instead of an insertion per record.
        self._order = sorted(i.order for i in self._infos.values())
        self._scores = sorted((i.score, i.name) for i in self._infos.values() if i.score is not None)
        self._marks = sorted(i.order for i in self._infos.values() if i.status in _MARKS)

    def _update(self, dfd: int, name: str) -> None:
        if not _is_record_name(name):
            return
        self._forget(name)
        info = self._read(dfd, name)
        if info is not None:
            bisect.insort(self._order, info.order)
            if info.score is not None:
                bisect.insort(self._scores, (info.score, name))
            if info.status in _MARKS:
                bisect.insort(self._marks, info.order)

    def _read(self, dfd: int, name: str) -> AttemptInfo | None:
        """Parse `name` into `_infos` (the sorted lists are the caller's job)."""
        self.reads += 1
        st, d = read_record(dfd, name)
        if st is not None and st.st_nlink > 1:
            self._recheck.add(name)
        if d is None:
            return None
        d.setdefault("commit_hash", name[: -len(".json")])
        info = info_from_record(name, d)
        self._infos[name] = info
        return info

    def _forget(self, name: str) -> None:
        self._recheck.discard(name)
        info = self._infos.pop(name, None)
        if info is None:
            return
        _remove(self._order, info.order)
        if info.score is not None:
            _remove(self._scores, (info.score, name))
        if info.status in _MARKS:
            _remove(self._marks, info.order)

    def _forget_all(self) -> None:
        self._infos.clear()
        self._recheck.clear()
        self._order.clear()
        self._scores.clear()
        self._marks.clear()

    # ---- queries (call refresh first) ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._infos)

    def last(self, n: int | None = None) -> list[AttemptInfo]:
        """The newest `n` records (all when n is None or 0), oldest first."""
        with self._lock:
            keys = self._order[-n:] if n else list(self._order)
            return [self._infos[k[2]] for k in keys]

    def best(self, direction: str, exclude: str | None = None) -> float | None:
        """The branch's best numeric score (`direction`-aware), ignoring records of commit `exclude`."""
        with self._lock:
            seq = self._scores if direction == "minimize" else reversed(self._scores)
            for score, name in seq:
                if self._infos[name].commit_hash != exclude:
                    return score
            return None

    def since_improvement(self) -> int:
        """Trailing records (newest first) that are neither `improved` nor `baseline` (the pivot heartbeat)."""
        with self._lock:
            if not self._marks:
                return len(self._order)
            return len(self._order) - bisect.bisect_right(self._order, self._marks[-1])

    def find(self, prefix: str) -> AttemptInfo | None:
        """The newest record whose commit hash starts with `prefix`."""
        with self._lock:
            for key in reversed(self._order):
                if self._infos[key[2]].commit_hash.startswith(prefix):
                    return self._infos[key[2]]
            return None

    def read(self, info: AttemptInfo) -> dict | None:
        """The full record of `info` as the file holds it now (never through a link)."""
        try:
            with safefs.open_dir(self.root, self.rel) as dfd:
                _st, d = read_record(dfd, info.name)
        except OSError:
            return None
        if d is not None:
            d.setdefault("commit_hash", info.name[: -len(".json")])
        return d


def _remove(seq: list, item) -> None:
    i = bisect.bisect_left(seq, item)
    if i < len(seq) and seq[i] == item:
        del seq[i]


# ---- views by folder: a workspace registers its own; anything else gets a one-off full scan ------------------
_VIEWS: weakref.WeakValueDictionary[str, AttemptView] = weakref.WeakValueDictionary()
_VIEWS_LOCK = threading.Lock()


def _key(attempts_dir: Path) -> str:
    return os.path.abspath(attempts_dir)


def register(view: AttemptView) -> None:
    with _VIEWS_LOCK:
        _VIEWS[_key(view.root / view.rel)] = view


def unregister(view: AttemptView) -> None:
    with _VIEWS_LOCK:
        key = _key(view.root / view.rel)
        if _VIEWS.get(key) is view:
            del _VIEWS[key]


def view_for(attempts_dir: Path) -> AttemptView:
    """The refreshed view of `attempts_dir` (`<workspace>/.opencode/attempts`): the workspace's registered one,
    else a one-off view (a full scan, no watch)."""
    attempts_dir = Path(attempts_dir)
    with _VIEWS_LOCK:
        view = _VIEWS.get(_key(attempts_dir))
    if view is None:
        view = AttemptView(attempts_dir.parents[1], None, Path(*attempts_dir.parts[-2:]))
    return view.refresh()
