"""A root snapshot: the folder select-roots makes and explore grows a tree from (stage 1 -> stage 2, 3).

    results/<task>/roots/<snapshot>/{code/, shared/, metadata.json}

`metadata.json` is the snapshot's own (the Student run's: eval_count, agent_id, commit_hash, eval_ok, ...) with
what select-roots adds: `score` (raw), `stage`, `selection_reason`, `task`, `direction`, `snapshots_pending`, and,
for a root that links to its snapshot, `root_links` (what explore checks before it reads through the links).
This module is its one reader (`read_root_meta`, also for the snapshot's own file select-roots extends) and its
one writer (`write_root_meta`), and holds the checks a root folder passes before a tree is grown from it
(`verify_root`, `check_files`), so explore needs nothing from stage 1's modules.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sftree.errors import InputError
from sftree.fileio import read_json_object

META_NAME = "metadata.json"
# The root's metadata.json field: {"source": the snapshot folder, "entries": {path: fingerprint}}.
ROOT_LINKS = "root_links"
MAX_REPORTED = 25  # problems listed in one error message


@dataclass(frozen=True)
class RootMeta:
    """A root's (or a snapshot's) metadata.json as read: every field kept (`fields`, read-only) and the ones the
    stages use named. Values are as written; the stage that needs one checks it (explore: `score`, `eval_count`)."""

    path: Path
    fields: Mapping[str, Any]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    @property
    def task(self) -> Any:
        return self.fields.get("task")

    @property
    def direction(self) -> Any:
        return self.fields.get("direction")

    @property
    def score(self) -> Any:
        return self.fields.get("score")

    @property
    def eval_count(self) -> Any:
        return self.fields.get("eval_count")

    @property
    def commit_hash(self) -> Any:
        return self.fields.get("commit_hash")

    @property
    def island_id(self) -> Any:
        """The Coral island of the snapshot (a multi-island run's `import-coral`); absent otherwise."""
        return self.fields.get("island_id")

    @property
    def stage(self) -> Any:
        return self.fields.get("stage")

    @property
    def snapshots_pending(self) -> Any:
        return self.fields.get("snapshots_pending")

    @property
    def root_links(self) -> Any:
        return self.fields.get(ROOT_LINKS)

    def links(self) -> tuple[str, dict[str, str]] | None:
        """`root_links` checked: (the snapshot folder, {entry: fingerprint}); None for a self-contained root.
        InputError naming the file and the field when it is not what select-roots writes."""
        record = self.root_links
        if record is None:
            return None
        where = str(self.path)
        if not isinstance(record, dict):
            raise InputError(f"{where}: `{ROOT_LINKS}` must be an object, not {type(record).__name__}")
        source, entries = record.get("source"), record.get("entries")
        if not isinstance(source, str) or not os.path.isabs(source):
            raise InputError(f"{where}: `{ROOT_LINKS}.source` must be an absolute path, not {source!r}")
        if not isinstance(entries, dict) or not all(isinstance(v, str) for v in entries.values()):
            raise InputError(f"{where}: `{ROOT_LINKS}.entries` must map paths to fingerprint strings")
        return source, entries

    def to_dict(self) -> dict[str, Any]:
        """A new dict of every field (what a writer extends)."""
        return dict(self.fields)


def meta_path(folder: str | os.PathLike[str]) -> Path:
    return Path(folder) / META_NAME


def read_root_meta(folder: str | os.PathLike[str], what: str = "root metadata") -> RootMeta:
    """`folder`/metadata.json, a JSON object; InputError naming the file otherwise."""
    path = meta_path(folder)
    return RootMeta(path, MappingProxyType(read_json_object(path, what)))


def write_root_meta(folder: str | os.PathLike[str], fields: Mapping[str, Any]) -> Path:
    """metadata.json as a new file (2-space JSON, one newline): a hard-linked or copied one is unlinked first, so
    the snapshot's own file stays untouched. Not fsynced: select-roots syncs the whole new folder at once."""
    path = meta_path(folder)
    path.unlink(missing_ok=True)
    with open(path, "x", encoding="utf-8") as fh:
        fh.write(json.dumps(dict(fields), indent=2, ensure_ascii=False) + "\n")
    return path


# --- the files a root may hold -------------------------------------------------------------------------------


def unsupported_files(folder: str | os.PathLike[str], limit: int = MAX_REPORTED) -> list[str]:
    """Entries under `folder` a root cannot hold, each `path: why`: FIFOs, sockets and devices (copying one
    blocks or fails; git cannot store one), and names that are not UTF-8 (git, JSON transcripts and the agent's
    tools all need text names). Listed bytes-safe, so the check itself cannot fail.

    Links are not followed, except the top-level ones of `folder` that lead to a folder: a root made with
    `--link symlink` refers to its snapshot's `code/` and `shared/` that way, and explore reads through them
    (`git --work-tree ROOT/code add`). The file type comes from the directory listing (d_type), so a folder of
    100k attempt files costs a listing, not 100k stat calls."""
    problems: list[str] = []
    top = os.fsencode(folder)
    stack = [top]
    while stack:
        here = stack.pop()
        try:
            it = os.scandir(here)
        except OSError as exc:
            problems.append(f"{_shown(here)}: cannot be read ({exc.strerror})")
            continue
        with it:
            for entry in it:
                if not _is_utf8(entry.name):
                    problems.append(f"{_shown(entry.path)}: file name is not UTF-8")
                    continue  # a non-UTF-8 folder is reported once, not walked
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                        continue
                    if entry.is_file(follow_symlinks=False):
                        continue
                    if entry.is_symlink():
                        if here is top and entry.is_dir():  # the root's own link to its snapshot's folder
                            stack.append(entry.path)
                        continue
                    mode = entry.stat(follow_symlinks=False).st_mode
                except OSError as exc:
                    problems.append(f"{_shown(entry.path)}: cannot be read ({exc.strerror})")
                    continue
                kind = (
                    "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                    else "a device" if stat.S_ISBLK(mode) or stat.S_ISCHR(mode) else None
                )  # fmt: skip
                if kind:
                    problems.append(f"{_shown(entry.path)}: {kind}, not a file or folder")
                if len(problems) >= limit:
                    return problems
    return problems[:limit]


def _shown(path: bytes) -> str:
    return os.fsdecode(path).encode("utf-8", "backslashreplace").decode("utf-8")


def _is_utf8(name: bytes) -> bool:
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_files(folder: str | os.PathLike[str], what: str) -> None:
    """Raise InputError naming every entry of `folder` that `unsupported_files` refuses."""
    problems = unsupported_files(folder)
    if problems:
        raise InputError(
            f"{what} {os.fsdecode(folder)} holds entries sftree cannot explore: " + "; ".join(problems)
        )


# --- roots that refer to their snapshot (`select-roots --link symlink`) -------------------------------------


def _fingerprint(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def link_fingerprints(snapshot: str, names: list[str]) -> dict[str, str]:
    """Device, inode, size and mtime of each linked entry of `snapshot` and, for a folder, of each entry directly
    in it (not followed). A snapshot that was deleted and rebuilt, or had a file or folder added, removed or
    replaced at those two levels, no longer matches; a few dozen stat calls, not a walk of the attempt files."""
    out: dict[str, str] = {}
    for name in names:
        path = os.path.join(snapshot, name)
        st = os.lstat(path)
        out[name] = _fingerprint(st)
        if stat.S_ISDIR(st.st_mode):
            with os.scandir(path) as it:
                for entry in it:
                    out[f"{name}/{entry.name}"] = _fingerprint(entry.stat(follow_symlinks=False))
    return out


def verify_root(root_dir: str | os.PathLike[str]) -> None:
    """A root whose entries link to its snapshot must still find that snapshot as select-roots saw it.

    Checks every top-level link of the root (it must lead somewhere) and, when metadata.json records
    `root_links`, that each recorded entry is still the link select-roots made and that the snapshot's entries
    have the recorded fingerprints. Raises one InputError naming the paths. A self-contained root (hard links
    or copies) has nothing to check."""
    root = os.fspath(root_dir)
    problems: list[str] = []
    try:
        with os.scandir(root) as it:
            links = sorted(e.name for e in it if e.is_symlink())
    except OSError as exc:
        raise InputError(f"cannot list root {root}: {exc.strerror or exc}") from None
    for name in links:
        path = os.path.join(root, name)
        if not os.path.exists(path):
            problems.append(f"{path} -> {os.readlink(path)}: the snapshot entry it refers to is gone")
    recorded = read_root_meta(root).links()
    source = None
    if recorded is not None:
        source, entries = recorded
        names = sorted(n for n in entries if "/" not in n)
        for name in names:
            path, want = os.path.join(root, name), os.path.join(source, name)
            try:
                target = os.readlink(path)
            except OSError:
                target = None
            if target != want:
                problems.append(f"{path}: not the link to {want} that select-roots made")
        try:
            now = link_fingerprints(source, names)
        except OSError as exc:
            problems.append(f"{exc.filename or source}: {exc.strerror or exc}")
        else:
            changed = sorted(k for k in entries.keys() | now.keys() if entries.get(k) != now.get(k))
            for rel in changed[:MAX_REPORTED]:
                what = "added" if rel not in entries else "gone" if rel not in now else "changed"
                problems.append(f"{os.path.join(source, rel)}: {what} since select-roots")
            if len(changed) > MAX_REPORTED:
                problems.append(f"... and {len(changed) - MAX_REPORTED} more")
    if problems:
        where = f"its snapshot {source}" if source else "its snapshot"
        raise InputError(
            f"root {root} refers to {where}, which is gone or changed since select-roots: "
            + "; ".join(problems)
            + ". Roots made with --link symlink need the Student run to stay in place, unchanged, while its "
            "trees are explored: rerun select-roots, or make self-contained roots with --link hardlink or copy"
        )
