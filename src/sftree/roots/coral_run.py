"""Read a standard Coral run directory (what `coral start` leaves), treating every file in it as hostile.

    RUN_DIR/
      .coral/config.yaml                 the task (name, grader.direction)
      .coral/public/attempts/<c>.json    one record per attempt (coral/types.py Attempt.to_dict)
      .coral/public/eval_count           the global eval counter (the grader daemon bumps it per graded attempt)
      .coral/public/manager.pid          while the run is live
      .coral/public/.git                 the checkpoint repository (coral/hub/checkpoint.py): one commit per
                                         submission, `shared_state_hash` in the record
      repo/.git                          the run's code repository; the agents' worktrees (agents/<id>) share
                                         its objects, so every attempt's commit is in it

A multi-island run (upstream Coral's `hub/_island.py` `island_root`: `.coral/islands/` exists) has one hub per
island instead of `.coral/public/`: `.coral/islands/<island id>/` with its own attempts/, notes/, skills/,
eval_count and checkpoint repository `.git`; the code repository is the run's one `repo/`. Each hub is read as
`.coral/public/` is, and each record knows its island. A record's `metadata.budget_class` (Coral's
`get_budget_class`: `real` when missing or unknown, `tune`, `grader_error`) is read too: only `real` attempts
are the run's scores.

Agents write into `.coral/public` (it is linked into their worktrees) and into the repositories, so every read
here is bounded and never follows a symlink: each path is opened one component at a time from the run folder
with O_NOFOLLOW (`runtime/safefs.py`), regular files only (a FIFO or device is refused on its fstat, before any
read), records parsed with a depth limit and config.yaml without aliases (`safeparse.py`). A record that cannot be
used is reported with its file and the reason, and the others are still read. Every name and value that reaches
a message is escaped for display (`display.shown`, applied by `Problem`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sftree.display import shown
from sftree.errors import InputError
from sftree.jsontypes import ForeignJSON, JSONObject
from sftree.roots.gitobjects import HEX_RE, check_objects_dir
from sftree.runtime import safefs
from sftree.safeparse import LimitError, json_loads, yaml_load

MAX_RECORD = 8 << 20  # bytes of one attempt record (its feedback can be long)
MAX_SMALL = 1 << 20  # config.yaml, eval_count, manager.pid
MAX_JSON_DEPTH = 100  # arrays and objects in one record (Coral's records nest 3 deep)
RECORD_NAME = re.compile(r"^([0-9a-f]{40}|[0-9a-f]{64})\.json$")
PUBLIC = ".coral/public"
ISLANDS = ".coral/islands"
ATTEMPTS = f"{PUBLIC}/attempts"
CHECKPOINT_OBJECTS = f"{PUBLIC}/.git/objects"
ISLAND_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}$")
REAL, TUNE, GRADER_ERROR = "real", "tune", "grader_error"
BUDGET_CLASSES = (REAL, TUNE, GRADER_ERROR)


def budget_class(obj: ForeignJSON) -> str:
    """Coral's `get_budget_class` (coral/types.py) of a record: its `metadata.budget_class` when that is one of
    the three classes, else `real` (runs written before budget classes existed are all real)."""
    meta = obj.get("metadata")
    cls = meta.get("budget_class") if isinstance(meta, dict) else None
    return cls if cls in BUDGET_CLASSES else REAL


@dataclass
class Record:
    """One attempt record, checked field by field (pending or graded)."""

    file: str  # relative to the run folder
    commit: str
    agent_id: str
    status: str
    score: float | None  # None: null or not finite
    timestamp: str
    when: datetime
    shared_state_hash: str | None
    data: bytes  # the file's bytes, written as they are into the snapshot
    budget_class: str = REAL
    island: str | None = None  # the island's id in a multi-island run; None: the one hub .coral/public

    @property
    def key(self) -> str:
        """What names the attempt in the import's state: its commit, and its island where there are islands
        (an island's records are its own: a commit id seen in two islands is two attempts)."""
        return self.commit if self.island is None else f"{self.island}/{self.commit}"

    @property
    def pending(self) -> bool:
        return self.status == "pending"

    @property
    def eval_ok(self) -> bool:
        """Graded with a numeric score (crashed and timeout never are)."""
        return not self.pending and self.status not in ("crashed", "timeout") and self.score is not None


@dataclass
class Problem:
    file: str
    reason: str
    commit: str | None = None
    agent_id: str | None = None
    index: int | None = None

    def __post_init__(self) -> None:  # every problem is printed and reported: its text escaped once, here
        self.file, self.reason = shown(self.file), shown(self.reason)
        self.agent_id = None if self.agent_id is None else shown(self.agent_id)

    def line(self) -> str:
        who = f" (attempt {self.commit[:12]} of {self.agent_id})" if self.commit and self.agent_id else ""
        return f"{self.file}{who}: {self.reason}"


@dataclass
class Hub:
    """One hub of the run: `.coral/public` (island None), or `.coral/islands/<island>` of a multi-island run."""

    island: str | None
    rel: str  # relative to the run folder
    eval_count: int | None
    checkpoint_objects: str  # absolute, checked
    checkpoint_refused: dict[str, str] = field(default_factory=dict)  # loose objects git is never asked for


@dataclass
class CoralRun:
    run_dir: Path  # real path
    task_name: str | None
    direction: str | None
    in_progress: bool
    code_repo: str  # relative to run_dir: the repository holding the attempts' commits
    code_objects: str  # absolute, checked
    hubs: list[Hub]
    records: list[Record] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    code_refused: dict[str, str] = field(default_factory=dict)  # loose objects git is never asked for
    # .coral/config.yaml as read (the run's expanded configuration)
    config: JSONObject = field(default_factory=dict)

    @property
    def islands(self) -> bool:
        return self.hubs[0].island is not None

    @property
    def eval_count(self) -> int | None:
        """The run's eval counter: the one hub's, or the sum of the islands' (None when one is unknown)."""
        counts = [h.eval_count for h in self.hubs]
        known = [c for c in counts if c is not None]
        return sum(known) if len(known) == len(counts) else None


def read_small(root: Path, rel: str, limit: int) -> bytes:
    """The bytes of regular file `root/rel`, reached without following a link; OSError or safefs.UnsafePath
    (a symlink, not a regular file), ValueError when it holds more than `limit` bytes."""
    parts = rel.split("/")
    with safefs.open_dir(root, "/".join(parts[:-1])) as dfd:
        return _read_at(dfd, parts[-1], limit, f"{root}/{rel}")


def _read_at(dfd: int, name: str, limit: int, where: str) -> bytes:
    """safefs.read_at (regular files only, bounded); a link is refused with the reason."""
    try:
        return safefs.read_at(dfd, name, limit, shown(where))
    except safefs.UnsafePath as exc:
        if exc.kind == "a symlink":
            raise safefs.UnsafePath(f"{exc}; sftree does not follow links in a Coral run") from None
        raise


def find_run(path: str | os.PathLike[str]) -> Path:
    """The run folder (the one holding `.coral/`), given it or its `.coral` folder. The path the user gives is
    resolved once (it may be a `latest` link); nothing inside the run is followed."""
    p = Path(os.path.realpath(path))
    if p.name == ".coral" and p.is_dir():
        p = p.parent
    if not p.is_dir():
        raise InputError(f"Coral run folder not found: {path}")
    coral = p / ".coral"
    if coral.is_symlink() or not coral.is_dir():
        raise InputError(
            f"{path} is not a Coral run folder: no .coral/ folder in it (give the run folder, e.g. "
            "results/<task>/<timestamp>, that `coral start` printed as 'Run directory')"
        )
    return p


def _code_repo(run: Path) -> str:
    """Where the attempts' commits are, as Coral's grader daemon looks (coral/grader/daemon.py `_repo_dir`):
    `repo/` beside `.coral/`, else the run folder itself when it is a repository."""
    for rel in ("repo/.git", ".git"):
        p = run / rel
        if p.is_symlink():
            raise InputError(f"{p} is a symlink; sftree does not follow links in a Coral run")
        if p.is_file():
            raise InputError(
                f"{p} is a file (a linked worktree), not the repository itself; sftree reads only the "
                "repository folder Coral cloned"
            )
        if p.is_dir():
            return rel
    raise InputError(f"no code repository in {run}: neither repo/.git nor .git (Coral clones it to repo/)")


def _parse_time(value: str) -> datetime:
    when = datetime.fromisoformat(value)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _brief(value: object) -> str:
    """A record's value for a message: its repr, cut short (a field can hold megabytes)."""
    text = repr(value)
    return text if len(text) <= 100 else f"{text[:80]}... ({len(text)} characters)"


def parse_record(file: str, data: bytes, name_commit: str, island: str | None = None) -> Record:
    """A Record from a record file's bytes; ValueError with the reason (field and value) if unusable."""
    try:
        obj = json_loads(data, max_bytes=MAX_RECORD, max_depth=MAX_JSON_DEPTH)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"must hold a JSON object, not {type(obj).__name__}")
    commit = obj.get("commit_hash")
    if commit != name_commit:
        raise ValueError(
            f"commit_hash {_brief(commit)} is not the commit its file is named after ({name_commit})"
        )
    agent = obj.get("agent_id")
    if not isinstance(agent, str) or not agent.strip() or len(agent) > 200 or not agent.isprintable():
        raise ValueError(f"agent_id must be a short printable string, not {_brief(agent)}")
    status = obj.get("status", "crashed")  # Attempt.from_dict's default
    if not isinstance(status, str) or not status or len(status) > 200 or not status.isprintable():
        raise ValueError(f"status must be a short printable string, not {_brief(status)}")
    score = obj.get("score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)):
        raise ValueError(f"score must be a number or null, not {_brief(score)}")
    if score is not None:
        score = float(score)
        if not math.isfinite(score):
            score = None
    stamp = obj.get("timestamp")
    if not isinstance(stamp, str):
        raise ValueError(f"timestamp must be a string, not {_brief(stamp)}")
    try:
        when = _parse_time(stamp)
    except ValueError:
        raise ValueError(
            f"timestamp {_brief(stamp)} is not an ISO 8601 time: the attempt cannot be placed in the global order"
        ) from None
    ssh = obj.get("shared_state_hash")
    if ssh is not None and (not isinstance(ssh, str) or not HEX_RE.match(ssh)):
        raise ValueError(f"shared_state_hash must be a commit hash or null, not {_brief(ssh)}")
    if status == "pending" and score is not None:
        raise ValueError("status is pending but the record has a score")
    return Record(
        file, commit, agent.strip(), status, score, stamp, when, ssh, data, budget_class(obj), island
    )


def read_records(
    run: Path, hub: str = PUBLIC, island: str | None = None
) -> tuple[list[Record], list[Problem]]:
    """Every `*.json` record in `<hub>/attempts/` (Coral's temporary `.*.json.tmp` files skipped)."""
    records: list[Record] = []
    problems: list[Problem] = []
    attempts = f"{hub}/attempts"
    with contextlib.ExitStack() as stack:
        try:
            dfd = stack.enter_context(safefs.open_dir(run, attempts))
        except safefs.UnsafePath as exc:
            raise InputError(f"{exc}; sftree does not follow links in a Coral run") from None
        except FileNotFoundError:
            raise InputError(f"no attempt records: {run / attempts} does not exist") from None
        except OSError as exc:
            raise InputError(f"cannot read {run / attempts}: {exc.strerror or exc}") from None
        with os.scandir(dfd) as it:
            names = sorted(e.name for e in it if e.name.endswith(".json") and not e.name.startswith("."))
        for name in names:
            rel = f"{attempts}/{name}"
            m = RECORD_NAME.match(name)
            if not m:
                problems.append(Problem(rel, "not named <commit hash>.json as Coral names attempt records"))
                continue
            try:
                data = _read_at(dfd, name, MAX_RECORD, rel)
                records.append(parse_record(rel, data, m[1], island))
            except (safefs.UnsafePath, ValueError) as exc:
                problems.append(Problem(rel, str(exc).removeprefix(f"{rel} "), commit=m[1]))
            except OSError as exc:
                problems.append(Problem(rel, f"cannot be read ({exc.strerror or exc})", commit=m[1]))
    return records, problems


def _config(run: Path, notes: list[str]) -> tuple[str | None, str | None, JSONObject]:
    import yaml

    rel = ".coral/config.yaml"
    try:
        doc = yaml_load(read_small(run, rel, MAX_SMALL).decode("utf-8"))
    except FileNotFoundError:
        notes.append(f"{rel} not found: the task's name and direction are unknown")
        return None, None, {}
    except LimitError as exc:
        raise InputError(f"{run / rel}: {exc}") from None
    except (OSError, ValueError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InputError(f"{run / rel} cannot be read: {exc}") from None
    task = doc.get("task") if isinstance(doc, dict) else None
    grader = doc.get("grader") if isinstance(doc, dict) else None
    name = task.get("name") if isinstance(task, dict) else None
    direction = grader.get("direction", "maximize") if isinstance(grader, dict) else "maximize"
    if direction not in ("maximize", "minimize"):
        raise InputError(
            f"{run / rel}: grader.direction must be maximize or minimize, not {_value(direction)}"
        )
    name = shown(name)[:200] if isinstance(name, str) else None  # for the report only
    return name, direction, doc if isinstance(doc, dict) else {}


def _value(value: object) -> str:
    """A config value for a message: a short string as it is (escaped), anything else by its type only."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else f"a string of {len(value)} characters"
    return f"a {type(value).__name__}" if value is not None else "null"


def _small_int(run: Path, rel: str) -> int | None:
    try:
        return int(read_small(run, rel, 64).decode("ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _hubs(run: Path) -> list[tuple[str | None, str]]:
    """(island id, hub folder) of each hub: the islands of `.coral/islands/` (upstream Coral's `island_root`:
    when that folder exists, `.coral/public` is not the run's hub), sorted by id; else `.coral/public`."""
    islands = run / ISLANDS
    if not os.path.lexists(islands):
        return [(None, PUBLIC)]
    try:
        with safefs.open_dir(run, ISLANDS) as dfd, os.scandir(dfd) as it:
            entries = sorted((e.name, e.is_dir(follow_symlinks=False), e.is_symlink()) for e in it)
    except safefs.UnsafePath as exc:
        raise InputError(f"{exc}; sftree does not follow links in a Coral run") from None
    except OSError as exc:
        raise InputError(f"cannot read {islands}: {exc.strerror or exc}") from None
    hubs: list[tuple[str | None, str]] = []
    for name, is_dir, is_link in entries:
        if is_link:
            raise InputError(
                f"{islands / shown(name)} is a symlink; sftree does not follow links in a Coral run"
            )
        if not is_dir:
            continue
        if not ISLAND_NAME.match(name):
            raise InputError(
                f"{islands}: {shown(name)!r} is not an island id Coral makes (a plain folder name)"
            )
        hubs.append((name, f"{ISLANDS}/{name}"))
    if not hubs:
        raise InputError(f"no attempt records: {islands} holds no island folder")
    return hubs


def _read_hub(
    run: Path, island: str | None, rel: str, notes: list[str]
) -> tuple[Hub, list[Record], list[Problem]] | None:
    """A hub's checkpoint repository and records; None for an island that never had an attempt."""
    ck = run / rel / ".git"
    if island is not None and not os.path.lexists(run / rel / "attempts") and not os.path.lexists(ck):
        notes.append(f"island {island} ({rel}) holds no attempts")
        return None
    if ck.is_symlink() or ck.is_file():
        raise InputError(f"{ck} is a symlink or a file, not the checkpoint repository folder Coral makes")
    if not ck.is_dir():
        raise InputError(
            f"no checkpoint repository {ck}: this Coral records no shared state per attempt "
            "(coral/hub/checkpoint.py), so the knowledge each attempt saw is unknown"
        )
    checkpoint = check_objects_dir(run, f"{rel}/.git/objects", "the checkpoint repository objects")
    records, problems = read_records(run, rel, island)
    hub = Hub(island, rel, _small_int(run, f"{rel}/eval_count"), checkpoint.path, checkpoint.refused)
    return hub, records, problems


def read_run(path: str | os.PathLike[str]) -> CoralRun:
    """Everything `import-coral` needs from a run folder. InputError when the run cannot be read at all (no
    `.coral/`, no attempts folder, no code or checkpoint repository); per-record problems are collected."""
    run = find_run(path)
    notes: list[str] = []
    task_name, direction, config = _config(run, notes)
    code_repo = _code_repo(run)
    code = check_objects_dir(run, f"{code_repo}/objects", "the run's code repository objects")
    hubs: list[Hub] = []
    records: list[Record] = []
    problems: list[Problem] = []
    for island, rel in _hubs(run):
        got = _read_hub(run, island, rel, notes)
        if got is not None:
            hubs.append(got[0])
            records += got[1]
            problems += got[2]
    if not hubs:
        raise InputError(f"no attempt records: no island of {run / ISLANDS} has an attempts folder")
    pid = _small_int(run, f"{PUBLIC}/manager.pid")
    in_progress = pid is not None and pid > 0 and _alive(pid)
    if in_progress:
        notes.append(
            f"the run is in progress (its manager, pid {pid}, is alive): attempts still pending are imported "
            "without eval_ok; import again later to update them"
        )
    return CoralRun(
        run,
        task_name,
        direction,
        in_progress,
        code_repo,
        code.path,
        hubs,
        records,
        problems,
        notes,
        code.refused,
        config,
    )
