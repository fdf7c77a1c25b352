"""The objects of one bare store repository (`store/code.git`, `store/knowledge.git`), read and written by the host.

Only the host writes these repositories, and only from bytes it read itself (`folderreader.py`) or made (commits
below), so git here never meets a worktree, an attribute, a hook or a config the agent wrote: it is used to read
objects back (one long-lived `git cat-file --batch` per repository, runtime/catfile.py) and, at the end, to pack them. Objects are
written by the host as loose files (`gittrees.write_loose`), trees and commits encoded in Python, so their ids
are git's own (tested against `git mktree` and `git commit-tree`).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from sftree.errors import SftreeError
from sftree.runtime import gittrees
from sftree.runtime.catfile import CatFile, CatFileError

# Fixed identity and date: equal content on equal parents gives equal ids, so a rerun with `parallel_width: 1`
# reproduces the tree's commit ids (eval prompts quote them).
IDENTITY = b"sftree <sftree@localhost> 1700000000 +0000"
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_AUTHOR_NAME": "sftree",
    "GIT_AUTHOR_EMAIL": "sftree@localhost",
    "GIT_COMMITTER_NAME": "sftree",
    "GIT_COMMITTER_EMAIL": "sftree@localhost",
    "GIT_AUTHOR_DATE": "1700000000 +0000",
    "GIT_COMMITTER_DATE": "1700000000 +0000",
}


class GitError(SftreeError):
    """A git command on a store failed; the message holds the command and its stderr."""


def git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_ENV)
    env.setdefault("HOME", "/tmp")
    return env


def git(git_dir: Path, args: list[str], *, input: bytes | None = None, check: bool = True) -> str:
    """git on a store repository (never a worktree); its stdout as text."""
    proc = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", "-c", "gc.auto=0", "--git-dir", str(git_dir), *args],
        input=input,
        capture_output=True,
        env=git_env(),
        cwd=str(git_dir),
    )
    if check and proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()[-2000:]
        raise GitError(f"git {' '.join(args[:3])} in {git_dir} failed ({proc.returncode}): {err}")
    return proc.stdout.decode("utf-8", "replace")


def commit_object(tree: str, parents: list[str], message: str) -> bytes:
    """A commit object's content as `git commit-tree` makes it with the fixed identity (message ends in \\n)."""
    lines = [b"tree " + tree.encode()]
    lines += [b"parent " + p.encode() for p in parents]
    lines += [b"author " + IDENTITY, b"committer " + IDENTITY]
    msg = message.encode("utf-8", "replace")
    if not msg.endswith(b"\n"):
        msg += b"\n"
    return b"\n".join(lines) + b"\n\n" + msg


def parse_commit(data: bytes) -> tuple[str, list[str], str]:
    """(tree, parents, message) of a commit object's content."""
    head, _, msg = data.partition(b"\n\n")
    tree, parents = "", []
    for line in head.split(b"\n"):
        if line.startswith(b"tree "):
            tree = line[5:].decode()
        elif line.startswith(b"parent "):
            parents.append(line[7:].decode())
    return tree, parents, msg.decode("utf-8", "replace")


class ObjectDB:
    """Read and write objects of one bare repository; thread-safe. Parsed trees are kept (`gittrees.TreeCache`)."""

    def __init__(self, git_dir: Path):
        self.git_dir = Path(git_dir)
        self.trees = gittrees.TreeCache()
        self._lock = threading.Lock()
        self._git: CatFile | None = None  # started on the first read

    # ---- reading --------------------------------------------------------------------------------------------
    def read(self, oid: str) -> tuple[str, bytes]:
        """(kind, content) of an object; GitError when it is missing."""
        return self.read_many([oid])[0]

    def read_many(self, oids: list[str]) -> list[tuple[str, bytes]]:
        """Several objects with one round trip (runtime/catfile.py: the requests are written while the answers
        are read)."""
        if not oids:
            return []
        with self._lock:
            if self._git is None:
                self._git = CatFile(self.git_dir, env=git_env())
            try:
                return self._git.read_many(oids)
            except CatFileError as exc:
                raise GitError(
                    f"{self.git_dir}: object {exc.oid} not found ({exc.answer.strip()!r})"
                ) from None

    def read_each(self, oids: list[str], take: Callable[[str, int], Callable[[bytes], object]]) -> None:
        """Objects handed on a chunk at a time (`CatFile.read_each`): what streams a file of any size to a checkout
        or an import stream without holding it. The store's lock is held throughout: `take`'s function writes to
        a file of the host's, never to a pipe or socket another process reads (which could stall it)."""
        if not oids:
            return
        with self._lock:
            if self._git is None:
                self._git = CatFile(self.git_dir, env=git_env())
            try:
                self._git.read_each(oids, take)
            except CatFileError as exc:
                raise GitError(
                    f"{self.git_dir}: object {exc.oid} not found ({exc.answer.strip()!r})"
                ) from None

    def tree(self, oid: str) -> gittrees.Entries:
        """A tree's entries {name: (mode, id, raw entry)}, parsed once and kept."""
        got = self.trees.get(oid)
        if got is None:
            kind, data = self.read(oid)
            if kind != "tree":
                raise GitError(f"{self.git_dir}: {oid} is a {kind}, not a tree")
            got = gittrees.parse_tree(data)
            self.trees.put(oid, got)
        return got

    def commit(self, oid: str) -> tuple[str, list[str], str]:
        kind, data = self.read(oid)
        if kind != "commit":
            raise GitError(f"{self.git_dir}: {oid} is a {kind}, not a commit")
        return parse_commit(data)

    def commit_tree(self, oid: str) -> str:
        return self.commit(oid)[0]

    def exists(self, oid: str) -> bool:
        try:
            self.read(oid)
        except GitError:
            return False
        return True

    # ---- writing --------------------------------------------------------------------------------------------
    def write(self, kind: str, data: bytes) -> str:
        return gittrees.write_loose(self.git_dir, kind, data)

    def write_blob_stream(self, read: Callable[[int], bytes], size: int) -> str:
        return gittrees.write_loose_stream(self.git_dir, read, size)

    def write_tree(self, entries: gittrees.Entries) -> str:
        data, layout = gittrees.encode_tree(entries, laid_out=True)
        oid = self.write("tree", data)
        self.trees.put(oid, gittrees.Tree(entries, layout))
        return oid

    def write_tree_from(self, base: str | None, entries: gittrees.Entries, changed: Iterable[str]) -> str:
        """A tree that differs from tree `base` in the names `changed` alone: a large one is spliced from the base's
        kept encoding (`gittrees.splice`: C copies, where encoding 10k entries again is ~5 ms of Python)."""
        spliced = gittrees.splice(self.tree(base), entries, changed) if base else None
        if spliced is None:
            return self.write_tree(entries)
        data, layout = spliced
        oid = self.write("tree", data)
        self.trees.put(oid, gittrees.Tree(entries, layout))
        return oid

    def write_commit(self, tree: str, parents: list[str], message: str) -> str:
        return self.write("commit", commit_object(tree, parents, message))

    def close(self) -> None:
        with self._lock:
            if self._git is not None:
                self._git.close()
                self._git = None


def flatten(db: ObjectDB, tree: str, prefix: str = "") -> dict[str, tuple[str, str]]:
    """{path: (mode, blob id)} of every file and link under `tree` (a loop, not recursion)."""
    out: dict[str, tuple[str, str]] = {}
    todo = [(prefix, tree)]
    while todo:
        base, oid = todo.pop()
        for name, (mode, sub, _raw) in db.tree(oid).items():
            path = f"{base}{name}"
            if mode == gittrees.TREE_MODE:
                todo.append((path + "/", sub))
            else:
                out[path] = (mode, sub)
    return out


@dataclass(frozen=True)
class _Kept:
    """An entry of the top tree kept as it is (`root_extra`: a subtree taken whole)."""

    mode: str
    oid: str


# a folder being built: {name: sub-folder | (mode, blob id) | an entry kept whole}
_Folder: TypeAlias = dict[str, "_Folder | tuple[str, str] | _Kept"]


def tree_from_files(
    db: ObjectDB, files: dict[str, tuple[str, str]], root_extra: dict[str, tuple[str, str]] | None = None
) -> str:
    """The tree id of {path: (mode, blob id)} (the inverse of `flatten`), its trees written; `root_extra`: more
    entries of the top tree {name: (mode, id)} (a subtree kept as a whole)."""
    root: _Folder = {name: _Kept(*val) for name, val in (root_extra or {}).items()}
    for path, (mode, oid) in files.items():
        node = root
        *dirs, name = path.split("/")
        for d in dirs:
            sub = node.setdefault(d, {})
            if not isinstance(sub, dict):
                raise TypeError(f"{path}: {d} is a file or a kept entry, not a folder")
            node = sub
        node[name] = (mode, oid)

    def build(node: _Folder) -> str:
        entries: gittrees.Entries = {}
        for name, val in node.items():
            if isinstance(val, _Kept):
                entries[name] = gittrees.entry(name, val.mode, val.oid)
            elif isinstance(val, dict):
                entries[name] = gittrees.entry(name, gittrees.TREE_MODE, build(val))
            else:
                entries[name] = gittrees.entry(name, *val)
        return db.write_tree(entries)

    return build(root)


def init_bare(git_dir: Path) -> None:
    """A new bare repository (host-owned: its config is git's default)."""
    git_dir.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["git", "init", "-q", "--bare", str(git_dir)], check=True, env=git_env(), capture_output=True
    )
