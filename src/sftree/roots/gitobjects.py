"""Read git objects of repositories that someone else's processes wrote, without running their git config.

`sftree import-coral` reads two repositories of a Coral run (the code repository and the checkpoint repository
`.coral/public/.git`). Agents could write both, so git never runs with either as the repository whose config,
hooks, attributes or filters apply. Instead a fresh git directory owned by sftree (`host_git_dir`) lists their
object folders in `objects/info/alternates`, and one `git cat-file --batch` process on it reads objects raw:
no checkout, no `git archive` (it applies attributes and filter drivers), no config of theirs is read, no
program of theirs runs. The object folders are checked first (`check_objects_dir`): reached without a symlink
from the run folder, holding no symlink, and no alternates of their own (git would follow those out of the run).

Trees are parsed here from their raw bytes, so the caller writes every file itself (docs/import_coral.md).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from sftree.errors import InputError
from sftree.runtime import safefs

HEX_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
MODE_TREE, MODE_BLOB, MODE_EXEC, MODE_LINK, MODE_GITLINK = (
    b"40000",
    b"100644",
    b"100755",
    b"120000",
    b"160000",
)
BLOB_MODES = {MODE_BLOB: False, MODE_EXEC: True, b"100664": False}  # 100664: old git's group-writable blob
# Git settings given on the command line of the one git process: nothing it reads may run a program.
SAFE_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.sshCommand=false",
    "core.pager=cat",
    "protocol.allow=never",
    "submodule.recurse=false",
    "gc.auto=0",
)


class Entry(NamedTuple):
    mode: bytes
    name: bytes
    oid: str  # hex


class ObjectError(Exception):
    """An object is missing, of the wrong type, too large or malformed; the message says which."""


def object_format(oid: str) -> str:
    return "sha256" if len(oid) == 64 else "sha1"


def check_objects_dir(root: Path, rel: str, what: str) -> str:
    """The absolute path of the object folder `root/rel` after checking it is safe to give git as an alternate.

    Every component from `root` down is a real folder (no symlink); the folder, its fan-out folders and `pack/`
    hold no symlink; there is no `info/alternates` (git would follow it to object folders outside the run) and
    no `info/http-alternates`. Raises InputError naming the path and the reason."""
    path = Path(root) / rel
    try:
        with safefs.open_dir(Path(root), rel) as dfd:
            with os.scandir(dfd) as it:
                top = [(e.name, e.is_symlink(), e.is_dir(follow_symlinks=False)) for e in it]
            for name, is_link, is_dir in top:
                if is_link:
                    raise InputError(
                        f"{path}/{name}: a symlink in a git object folder; sftree will not follow it"
                    )
                if not is_dir:
                    continue
                sub = os.open(name, safefs.DIR_FLAGS, dir_fd=dfd)
                try:
                    with os.scandir(sub) as it:
                        for e in it:
                            if e.is_symlink():
                                raise InputError(
                                    f"{path}/{name}/{e.name}: a symlink in a git object folder; "
                                    "sftree will not follow it"
                                )
                            if name == "info" and e.name in ("alternates", "http-alternates"):
                                raise InputError(
                                    f"{path}/info/{e.name}: the repository borrows objects from elsewhere "
                                    "(alternates); sftree reads only objects inside the run"
                                )
                finally:
                    os.close(sub)
    except safefs.UnsafePath as exc:
        raise InputError(f"{what} {path}: {exc}") from None
    except FileNotFoundError:
        raise InputError(f"{what} not found: {path}") from None
    except NotADirectoryError:
        raise InputError(f"{what} {path} is not a folder") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    return os.path.join(os.path.realpath(root), rel)


def host_git_dir(path: Path, alternates: list[str], fmt: str) -> Path:
    """(Re)make a minimal bare git directory at `path`, owned by us, whose objects are the `alternates`
    folders. Written by hand (no `git init`: no template, no hooks folder)."""
    path = Path(path)
    if path.exists():
        safefs.remove_all(path)
    (path / "objects" / "info").mkdir(parents=True)
    (path / "refs").mkdir()
    (path / "HEAD").write_text("ref: refs/heads/main\n")
    if fmt == "sha256":
        config = (
            "[core]\n\trepositoryformatversion = 1\n\tbare = true\n[extensions]\n\tobjectformat = sha256\n"
        )
    else:
        config = "[core]\n\trepositoryformatversion = 0\n\tbare = true\n"
    (path / "config").write_text(config)
    (path / "objects" / "info" / "alternates").write_text("".join(a + "\n" for a in alternates))
    return path


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL="/dev/null",
        GIT_ATTR_NOSYSTEM="1",
        GIT_NO_REPLACE_OBJECTS="1",
        GIT_TERMINAL_PROMPT="0",
        GIT_CEILING_DIRECTORIES=str(Path(home).parent),
        GIT_DISCOVERY_ACROSS_FILESYSTEM="0",
        HOME=str(home),
        XDG_CONFIG_HOME=str(home),
        LC_ALL="C",
    )
    return env


class ObjectReader:
    """One `git cat-file --batch` process on a host git directory: objects by full hash, trees parsed.

    Small trees are cached (by hash: a tree never changes), so the folders shared by many commits are read
    once. `max_blob` bounds what one object may weigh; a larger one is refused before its bytes are read."""

    TREE_CACHE_ENTRIES = 200_000  # entries kept over all cached trees
    CACHE_TREE_MAX = 256  # a tree with more entries (e.g. a run's attempts/) is read each time, not kept

    def __init__(self, git_dir: Path, fmt: str, max_blob: int):
        self.git_dir, self.fmt, self.max_blob = Path(os.path.abspath(git_dir)), fmt, max_blob
        self.raw_len = 32 if fmt == "sha256" else 20
        self._tree_re = re.compile(rb"([0-7]{5,6}) ([^\0/]+)\0(.{%d})" % self.raw_len, re.S)
        cmd = ["git"]
        for kv in SAFE_CONFIG:
            cmd += ["-c", kv]
        cmd += ["--git-dir", str(self.git_dir), "cat-file", "--batch"]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self.git_dir,
            env=_env(self.git_dir),
        )
        self._trees: dict[str, list[Entry]] = {}
        self._cached = 0
        self.reads = 0

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()

    def __enter__(self) -> ObjectReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self, oid: str, want: str | None = None, limit: int | None = None) -> tuple[str, bytes]:
        """(type, content) of object `oid`; ObjectError if it is missing, not `want`, or over `limit` bytes."""
        if not HEX_RE.match(oid):
            raise ObjectError(f"{oid!r} is not an object hash")
        limit = self.max_blob if limit is None else limit
        self.reads += 1
        try:
            self.proc.stdin.write(oid.encode() + b"\n")
            self.proc.stdin.flush()
            header = self.proc.stdout.readline()
        except (BrokenPipeError, OSError) as exc:
            raise InputError(f"git cat-file stopped while reading {oid}: {exc}") from None
        parts = header.split()
        if len(parts) == 2 and parts[1] in (b"missing", b"ambiguous"):
            raise ObjectError(f"{oid} is {parts[1].decode()}")
        if len(parts) != 3:
            raise InputError(f"git cat-file gave an unexpected answer for {oid}: {header[:200]!r}")
        kind, size = parts[1].decode(), int(parts[2])
        if size > limit or (want is not None and kind != want):
            self._skip(size + 1)
            if want is not None and kind != want:
                raise ObjectError(f"{oid} is a {kind}, not a {want}")
            raise ObjectError(f"{oid} holds {size} bytes, more than the limit of {limit}")
        data = self._exactly(size + 1)
        return kind, data[:-1]

    def _exactly(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.proc.stdout.read(left)
            if not chunk:
                raise InputError("git cat-file ended in the middle of an object")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _skip(self, n: int) -> None:
        while n:
            chunk = self.proc.stdout.read(min(n, 1 << 20))
            if not chunk:
                raise InputError("git cat-file ended in the middle of an object")
            n -= len(chunk)

    def commit_tree(self, oid: str) -> str:
        """The tree of commit `oid`."""
        _, data = self.read(oid, "commit", limit=1 << 22)
        if not data.startswith(b"tree "):
            raise ObjectError(f"commit {oid} has no tree line")
        tree = data[5 : data.index(b"\n")].decode("ascii", "replace")
        if not HEX_RE.match(tree):
            raise ObjectError(f"commit {oid} names a malformed tree {tree!r}")
        return tree

    def tree(self, oid: str) -> list[Entry]:
        """The entries of tree `oid` in stored order; ObjectError for a malformed tree."""
        hit = self._trees.get(oid)
        if hit is not None:
            return hit
        _, data = self.read(oid, "tree", limit=1 << 30)
        entries: list[Entry] = []
        pos = 0
        for m in self._tree_re.finditer(data):
            if m.start() != pos:
                break
            entries.append(Entry(m[1], m[2], m[3].hex()))
            pos = m.end()
        if pos != len(data):
            raise ObjectError(f"tree {oid} is malformed at byte {pos}")
        if len(entries) <= self.CACHE_TREE_MAX:
            if self._cached + len(entries) > self.TREE_CACHE_ENTRIES:
                self._trees.clear()
                self._cached = 0
            self._trees[oid] = entries
            self._cached += len(entries)
        return entries

    def walk(self, oid: str, prefix: bytes = b"") -> Iterator[tuple[bytes, Entry]]:
        """(path, entry) for every entry below tree `oid`, folders before what they hold."""
        for e in self.tree(oid):
            path = prefix + e.name
            yield path, e
            if e.mode == MODE_TREE:
                yield from self.walk(e.oid, path + b"/")
