"""A knowledge commit's tree from the last commit's tree and the few paths that changed (docs/runtime.md,
"Knowledge cost per edge").

`git write-tree` rebuilds every tree whose entries changed from the whole index: at 10k attempt records that is
an `attempts/` tree of 10k entries, built, hashed twice and written by git at each commit (~15-25 ms). Here the
new trees are the old ones (parsed once, then kept by id: the tree a commit writes is the next commit's old
one) with the changed entries replaced, encoded and written as loose objects in the store, in the format git
reads (`<mode> <name>\\0<20-byte id>` sorted by name, a folder's name compared as `name/`). The changes are what
the index holds for the staged paths, so the tree is the one `write-tree` would make (tested against it).
"""

from __future__ import annotations

import hashlib
import os
import threading
import zlib
from collections import OrderedDict
from operator import itemgetter
from pathlib import Path

TREE_MODE = "40000"
# name -> (mode, hex id, the entry as the tree object holds it): kept encoded, so a tree of 10k entries with a
# few changed is joined, not encoded again (~10 ms in Python at 10k).
Entries = dict[str, tuple[str, str, bytes]]


def entry(name: str, mode: str, oid: str) -> tuple[str, str, bytes]:
    return (mode, oid, f"{mode} {name}".encode() + b"\0" + bytes.fromhex(oid))


def object_id(kind: str, data: bytes) -> str:
    """Git's object id (SHA-1 of `<kind> <size>\\0<data>`)."""
    return hashlib.sha1(f"{kind} {len(data)}\0".encode() + data).hexdigest()


def _key(name: str, mode: str) -> str:
    return name + "/" if mode == TREE_MODE else name


def encode_tree(entries: Entries) -> bytes:
    """A tree object's content (what `git cat-file tree` prints)."""
    if TREE_MODE in map(itemgetter(0), entries.values()):  # (a scan in C: ~20x a generator's speed)
        names = sorted(entries, key=lambda n: _key(n, entries[n][0]))
    else:  # no folder: plain name order is git's (and nearly sorted input sorts in linear time)
        names = sorted(entries)
    return b"".join([entries[n][2] for n in names])


def parse_tree(data: bytes) -> Entries:
    """A tree object's content as {name: (mode, id)}. ValueError for a name that is no UTF-8 (git stores the
    bytes it is given): sorted as text it would be out of git's byte order, so such a tree is left to git."""
    out: Entries = {}
    i, n = 0, len(data)
    while i < n:
        sp = data.index(b" ", i)
        nul = data.index(b"\0", sp)
        out[data[sp + 1 : nul].decode("utf-8")] = (
            data[i:sp].decode(),
            data[nul + 1 : nul + 21].hex(),
            data[i : nul + 21],
        )
        i = nul + 21
    return out


def write_loose(git_dir: Path, kind: str, data: bytes) -> str:
    """Store an object as a loose file (if not there yet) and return its id. Large ones are stored without
    deflating (level 0: they are trees of many ids, which compress little); `git gc` packs them later."""
    oid = object_id(kind, data)
    folder = Path(git_dir) / "objects" / oid[:2]
    final = folder / oid[2:]
    if final.exists():
        return oid
    folder.mkdir(exist_ok=True)
    body = zlib.compress(f"{kind} {len(data)}\0".encode() + data, 0 if len(data) > 65536 else 1)
    tmp = folder / f"tmp_sftree_{os.getpid()}_{threading.get_ident()}"
    with open(tmp, "wb") as fh:
        fh.write(body)
    os.chmod(tmp, 0o444)
    os.replace(tmp, final)  # same content under the same name: a concurrent writer makes no difference
    return oid


class TreeCache:
    """Parsed trees by id (immutable, so shared by every edge of a store); the newest `limit` kept."""

    def __init__(self, limit: int = 64):
        self._trees: OrderedDict[str, Entries] = OrderedDict()
        self._lock = threading.Lock()
        self.limit = limit

    def get(self, oid: str) -> Entries | None:
        with self._lock:
            entries = self._trees.get(oid)
            if entries is not None:
                self._trees.move_to_end(oid)
            return entries

    def put(self, oid: str, entries: Entries) -> None:
        with self._lock:
            self._trees[oid] = entries
            self._trees.move_to_end(oid)
            while len(self._trees) > self.limit:
                self._trees.popitem(last=False)


def apply_changes(root: str, changes: dict[str, tuple[str, str] | None], load, store) -> str:
    """The id of tree `root` with `changes` applied ({path: (mode, id)} to set, None to remove; a folder left
    empty goes, as in git). `load(tree_id) -> Entries` reads a tree, `store(entries) -> id` writes one."""

    def rebuild(tree: str | None, here: dict[str, tuple[str, str] | None]) -> str | None:
        entries = dict(load(tree)) if tree else {}
        below: dict[str, dict] = {}
        for path, change in here.items():
            head, _, rest = path.partition("/")
            if rest:
                below.setdefault(head, {})[rest] = change
            elif change is None:
                entries.pop(head, None)
            else:
                entries[head] = entry(head, *change)
        for head, sub in below.items():
            now = entries.get(head)
            if now is not None and now[0] != TREE_MODE:
                if head in here:
                    continue  # a file now where a folder was: the folder's entries went with it
                now = None
            new = rebuild(now[1] if now else None, sub)
            if new is None:
                entries.pop(head, None)
            else:
                entries[head] = entry(head, TREE_MODE, new)
        if not entries:
            return None
        return store(entries)

    return rebuild(root, changes) or store({})
