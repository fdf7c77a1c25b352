"""Read git objects of repositories that someone else's processes wrote, without running their git config.

`sftree import-coral` reads two repositories of a Coral run (the code repository and the checkpoint repository
`.coral/public/.git`). Agents could write both, so git never runs with either as the repository whose config,
hooks, attributes or filters apply. Instead a fresh git directory owned by sftree (`host_git_dir`) lists their
object folders in `objects/info/alternates`, and one `git cat-file --batch` process on it reads objects raw:
no checkout, no `git archive` (it applies attributes and filter drivers), no config of theirs is read, no
program of theirs runs. The object folders are checked first (`check_objects_dir`): reached without a symlink
from the run folder, holding only regular files and folders (git opens an object file without O_NONBLOCK, so a
FIFO would block it for ever), and no alternates of their own (git would follow those out of the run). A loose
object file that is not a regular file is refused alone: the reader never asks git for it, so only the attempts
that need it fail.

Nothing git gives is held unbounded: an object over its limit is refused on git's header (a large one by
restarting git rather than reading it), a tree's entries are counted as they are read and the read stops at the
caller's limit, and a read that gets no byte for STALL_SECONDS (a file swapped for a FIFO after the check, in a
live run) ends the import with that reason instead of hanging it.

Trees are parsed here from their raw bytes, so the caller writes every file itself (docs/import_coral.md).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from sftree.display import shown
from sftree.errors import InputError
from sftree.runtime import safefs
from sftree.runtime.catfile import BadAnswer, CatFile, Missing, Stopped

HEX_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
MODE_TREE, MODE_BLOB, MODE_EXEC, MODE_LINK, MODE_GITLINK = (
    b"40000",
    b"100644",
    b"100755",
    b"120000",
    b"160000",
)
BLOB_MODES = {MODE_BLOB: False, MODE_EXEC: True, b"100664": False}  # 100664: old git's group-writable blob
TREE_MAX_BYTES = 256 << 20  # one tree object (2M entries of 100-byte names); git inflates a tree whole
NAME_MAX_BYTES = 4096  # one tree entry's name (a file name holds at most 255)
SKIP_MAX = 1 << 20  # bytes of a refused object read and dropped; past this git is restarted instead
STALL_SECONDS = 120.0  # no byte from git for this long: it is blocked on a file of the run
MAX_RESTARTS = 200  # restarts of git cat-file to skip large refused objects (a git that died: as many more)
_HEX_NAME = re.compile(r"^(?:[0-9a-f]{38}|[0-9a-f]{62})$")
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
    """An object is missing, of the wrong type, too large or malformed; the message says which. `missing`:
    git does not have it at all."""

    def __init__(self, message: str, missing: bool = False):
        super().__init__(message)
        self.missing = missing


class TooManyEntries(ObjectError):
    """A tree holds more entries than the caller allowed (counted while reading; the rest was not kept)."""


def object_format(oid: str) -> str:
    return "sha256" if len(oid) == 64 else "sha1"


class ObjectsDir(NamedTuple):
    path: str  # absolute, for the alternates file
    refused: dict[str, str]  # hex id -> why: loose objects that are not regular files, never asked of git


def check_objects_dir(root: Path, rel: str, what: str) -> ObjectsDir:
    """The object folder `root/rel`, checked to be safe to give git as an alternate.

    Every component from `root` down is a real folder (no symlink); below it (three levels: fan-out folders,
    `pack/`, `info/`, `info/commit-graphs/`; git reads nothing deeper) there are only regular files and folders:
    git opens these files as they are, following links and blocking on a FIFO. A loose object (`xx/<hex>`) that is
    anything else is listed in `refused` with the reason; any other such entry refuses the run. There is no
    `info/alternates` (git would follow it to object folders outside the run) and no `info/http-alternates`.
    Raises InputError naming the path (escaped for display) and the reason."""
    path = Path(root) / rel
    refused: dict[str, str] = {}
    try:
        with safefs.open_dir(Path(root), rel) as dfd:
            _check_level(dfd, rel, 1, refused)
    except safefs.UnsafePath as exc:
        raise InputError(f"{what} {shown(path)}: {exc}") from None
    except FileNotFoundError:
        raise InputError(f"{what} not found: {shown(path)}") from None
    except NotADirectoryError:
        raise InputError(f"{what} {shown(path)} is not a folder") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {shown(path)}: {exc.strerror or exc}") from None
    return ObjectsDir(os.path.join(os.path.realpath(root), rel), refused)


def _check_level(dfd: int, here: str, level: int, refused: dict[str, str]) -> None:
    """Check the entries of folder `dfd` (`here`, relative to the run) and, up to level 3, its folders."""
    with os.scandir(dfd) as it:
        entries: list[tuple[str, str | None]] = []  # (name, what it is when no folder or file)
        for e in it:
            if e.is_dir(follow_symlinks=False):
                entries.append((e.name, None))
            elif not e.is_file(follow_symlinks=False):
                entries.append(
                    (
                        e.name,
                        "a symlink" if e.is_symlink() else safefs.kind(e.stat(follow_symlinks=False).st_mode),
                    )
                )
            elif level == 2 and here.endswith("/info") and e.name in ("alternates", "http-alternates"):
                raise InputError(
                    f"{shown(here)}/{e.name}: the repository borrows objects from elsewhere (alternates); "
                    "sftree reads only objects inside the run"
                )
    fanout = (
        level == 2 and len(here) >= 2 and re.fullmatch(r"[0-9a-f]{2}", here.rsplit("/", 1)[-1]) is not None
    )
    for name, bad in entries:
        where = f"{here}/{name}"
        if bad is None:
            if level < 3:
                sub = os.open(name, safefs.DIR_FLAGS, dir_fd=dfd)
                try:
                    _check_level(sub, where, level + 1, refused)
                finally:
                    os.close(sub)
        elif fanout and _HEX_NAME.match(name):
            oid = here.rsplit("/", 1)[-1] + name
            refused[oid] = f"{shown(where)}: {bad}, not a regular file (a loose object sftree does not read)"
        elif bad == "a symlink":
            raise InputError(f"{shown(where)}: a symlink in a git object folder; sftree will not follow it")
        else:
            raise InputError(
                f"{shown(where)}: {bad} in a git object folder, not a regular file; git would block on it or "
                "fail, so sftree does not read this run (remove it)"
            )


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
    once. `max_blob` bounds what one object may weigh; a larger one is refused on git's header, before its bytes
    are read (past SKIP_MAX by restarting git: cheaper than reading what is refused, and git streams such a blob
    rather than inflating it whole: `core.bigFileThreshold`). `refused`: objects never asked of git
    (`ObjectsDir.refused`). A watchdog thread ends a read that gets nothing for STALL_SECONDS."""

    TREE_CACHE_ENTRIES = 200_000  # entries kept over all cached trees
    CACHE_TREE_MAX = 256  # a tree with more entries (e.g. a run's attempts/) is read each time, not kept

    def __init__(self, git_dir: Path, fmt: str, max_blob: int, refused: dict[str, str] | None = None):
        self.git_dir, self.fmt, self.max_blob = Path(os.path.abspath(git_dir)), fmt, max_blob
        self.refused = refused or {}
        self.raw_len = 32 if fmt == "sha256" else 20
        self.min_entry = len(b"40000 x\0") + self.raw_len  # the shortest entry a tree can hold
        self._tree_re = re.compile(
            rb"([0-7]{5,6}) ([^\0/]{1,%d})\0(.{%d})" % (NAME_MAX_BYTES, self.raw_len), re.S
        )
        self._trees: dict[str, list[Entry]] = {}
        self._cached = 0
        self.reads = 0
        config = (*SAFE_CONFIG, f"core.bigFileThreshold={max(self.max_blob, SKIP_MAX)}")
        self.git = CatFile(self.git_dir, config=config, env=_env(self.git_dir), stall=STALL_SECONDS)

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.git.proc

    @property
    def restarts(self) -> int:
        return self.git.restarts

    def _restart(self, why: str) -> None:
        """A fresh git process (the old one is killed): after a refused large object, or when git died."""
        self.git.stop()
        self.git.restarts += 1
        if self.git.restarts > 2 * MAX_RESTARTS:  # only a git that keeps dying gets here (see _drop)
            raise InputError(
                f"git cat-file on {self.git_dir} had to be restarted more than {MAX_RESTARTS} times (the last: "
                f"{why}): the run's objects are broken or hostile"
            )
        self.git.start()

    def _ended(self, exc: Stopped, oid: str, what: str) -> Exception:
        """The error for a git that stopped answering: a stall ends the import, a crash refuses the object."""
        if exc.stalled is not None:
            return InputError(
                f"git cat-file sent nothing for {STALL_SECONDS:.0f} s while reading {exc.stalled} from "
                f"{self.git_dir}: a file of the run's object folders never ends (a FIFO put there after sftree "
                "checked them?); import a run once it has stopped"
            )
        self._restart(f"git stopped {what} {oid}")
        return ObjectError(f"{oid}: git cannot read it (git cat-file stopped {what} it)")

    def close(self) -> None:
        self.git.close()

    def __enter__(self) -> ObjectReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ask(self, oid: str) -> tuple[str, int]:
        """Send `oid` to git and read its header: (type, size); ObjectError when git does not have it."""
        if not HEX_RE.match(oid):
            raise ObjectError(f"{oid!r} is not an object hash")
        if oid in self.refused:
            raise ObjectError(self.refused[oid])
        self.reads += 1
        try:
            return self.git.ask(oid)
        except Stopped as exc:
            raise self._ended(exc, oid, "before answering for") from None
        except Missing as exc:
            raise ObjectError(f"{oid} is {exc.answer.split()[1].decode()}", missing=True) from None
        except BadAnswer as exc:
            raise InputError(
                f"git cat-file gave an unexpected answer for {oid}: {shown(exc.answer[:200])}"
            ) from None

    def read(self, oid: str, want: str | None = None, limit: int | None = None) -> tuple[str, bytes]:
        """(type, content) of object `oid`; ObjectError if it is missing, not `want`, or over `limit` bytes."""
        limit = self.max_blob if limit is None else limit
        kind, size = self._ask(oid)
        if want is not None and kind != want:
            self._drop(oid, size + 1)
            raise ObjectError(f"{oid} is a {kind}, not a {want}")
        if size > limit:
            self._drop(oid, size + 1)
            raise ObjectError(f"{oid} holds {size} bytes, more than the limit of {limit}")
        data = self._exactly(oid, size + 1)
        self.git.idle()
        return kind, bytes(data[:-1])

    def _chunk(self, oid: str, n: int) -> bytes:
        """Up to `n` bytes of the object git is sending (what is there, at least one byte)."""
        try:
            return self.git.chunk(oid, n)
        except Stopped as exc:
            raise self._ended(exc, oid, "in the middle of") from None

    def _exactly(self, oid: str, n: int) -> bytearray:
        data = bytearray()
        while len(data) < n:
            data += self._chunk(oid, min(n - len(data), 1 << 20))
        return data

    def _drop(self, oid: str, n: int) -> None:
        """Throw away the `n` bytes git is sending: read when few, else by restarting git (while restarts are
        left: a run of many large objects costs reading them, not the import)."""
        if n > SKIP_MAX and self.restarts < MAX_RESTARTS:
            self._restart(f"a refused object of {n} bytes")
            return
        while n:
            n -= len(self._chunk(oid, min(n, 1 << 20)))
        self.git.idle()

    def commit_tree(self, oid: str) -> str:
        """The tree of commit `oid`."""
        _, data = self.read(oid, "commit", limit=1 << 22)
        end = data.find(b"\n")
        if not data.startswith(b"tree ") or end < 0:
            raise ObjectError(f"commit {oid} has no tree line")
        tree = data[5:end].decode("ascii", "replace")
        if not HEX_RE.match(tree):
            raise ObjectError(f"commit {oid} names a malformed tree {shown(tree[:80])!r}")
        return tree

    def tree(self, oid: str, max_entries: int | None = None) -> list[Entry]:
        """The entries of tree `oid` in stored order; ObjectError for a malformed tree, TooManyEntries when it
        holds more than `max_entries` (found while reading: what follows is not read, nothing is parsed)."""
        hit = self._trees.get(oid)
        if hit is not None:
            return hit
        kind, size = self._ask(oid)
        if kind != "tree":
            self._drop(oid, size + 1)
            raise ObjectError(f"{oid} is a {kind}, not a tree")
        if size > TREE_MAX_BYTES:
            self._drop(oid, size + 1)
            raise ObjectError(f"tree {oid} holds {size} bytes, more than the limit of {TREE_MAX_BYTES}")
        if max_entries is not None and size > max_entries * self.min_entry:  # it may hold more: count
            data = self._counted(oid, size, max_entries)
        else:
            data = self._exactly(oid, size + 1)
            del data[-1:]
        self.git.idle()
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

    def _counted(self, oid: str, size: int, max_entries: int) -> bytearray:
        """The `size` bytes of tree `oid`, its entries counted as they arrive: past `max_entries` the rest is
        dropped and TooManyEntries raised, so memory holds at most the bytes of `max_entries` entries."""
        data = bytearray()
        match = self._tree_re.match
        pos = count = 0
        left = size + 1
        while left:
            chunk = self._chunk(oid, min(left, 1 << 20))
            left -= len(chunk)
            data += chunk
            end = size if not left else len(data)  # git's closing newline is not tree content
            while (m := match(data, pos, end)) is not None:
                pos = m.end()
                count += 1
            if count > max_entries:
                self._drop(oid, left)
                raise TooManyEntries(f"tree {oid} holds more than {max_entries} entries")
            if end - pos > NAME_MAX_BYTES + 64:  # no entry can start at `pos`: the tree is malformed
                self._drop(oid, left)
                raise ObjectError(f"tree {oid} is malformed at byte {pos}")
        del data[-1:]
        return data

    def walk(self, oid: str, prefix: bytes = b"") -> Iterator[tuple[bytes, Entry]]:
        """(path, entry) for every entry below tree `oid`, folders before what they hold."""
        for e in self.tree(oid):
            path = prefix + e.name
            yield path, e
            if e.mode == MODE_TREE:
                yield from self.walk(e.oid, path + b"/")
