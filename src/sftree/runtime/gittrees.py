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

import bisect
import hashlib
import os
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from operator import itemgetter
from pathlib import Path
from typing import Literal, overload

TREE_MODE = "40000"
# name -> (mode, hex id, the entry as the tree object holds it): kept encoded, so a tree of 10k entries with a
# few changed is joined, not encoded again (~10 ms in Python at 10k).
Entry = tuple[str, str, bytes]
Entries = dict[str, Entry]
# a large tree's entries' sort keys in git's order, where each entry starts in the encoding, and the encoding
Layout = tuple[list[str], list[int], bytes]


def entry(name: str, mode: str, oid: str) -> tuple[str, str, bytes]:
    return (mode, oid, f"{mode} {name}".encode() + b"\0" + bytes.fromhex(oid))


def object_id(kind: str, data: bytes) -> str:
    """Git's object id (SHA-1 of `<kind> <size>\\0<data>`)."""
    return hashlib.sha1(f"{kind} {len(data)}\0".encode() + data).hexdigest()


def _key(name: str, mode: str) -> str:
    return name + "/" if mode == TREE_MODE else name


LAYOUT_MIN = 1024  # trees with this many entries keep their encoding laid out, to be spliced (`splice`)


class Tree(dict[str, Entry]):
    """Entries; a large tree also keeps `layout`: its entries' sort keys in git's order, where each entry starts
    in the encoding, and the encoding. The next tree, a few entries away (a commit adds an attempt record to an
    `attempts/` of 10k), is then the old encoding with those entries spliced in: copies in C, where encoding
    every entry again is ~5 ms of Python per tree at 10k."""

    __slots__ = ("layout",)

    def __init__(self, entries: Mapping[str, Entry] = {}, layout: Layout | None = None) -> None:  # noqa: B006 (read only)
        super().__init__(entries)
        self.layout = layout


@overload
def encode_tree(entries: Entries, *, laid_out: Literal[False] = False) -> bytes: ...
@overload
def encode_tree(entries: Entries, *, laid_out: Literal[True]) -> tuple[bytes, Layout | None]: ...
def encode_tree(entries: Entries, *, laid_out: bool = False) -> bytes | tuple[bytes, Layout | None]:
    """A tree object's content (what `git cat-file tree` prints); with `laid_out`, also its layout (Tree) when
    it is large enough to keep one."""
    if TREE_MODE in map(itemgetter(0), entries.values()):  # (a scan in C: ~20x a generator's speed)
        names = sorted(entries, key=lambda n: _key(n, entries[n][0]))
    else:  # no folder: plain name order is git's (and nearly sorted input sorts in linear time)
        names = sorted(entries)
    raws = [entries[n][2] for n in names]
    data = b"".join(raws)
    if not laid_out:
        return data
    if len(names) < LAYOUT_MIN:
        return data, None
    offsets: list[int] = []
    at = 0
    for raw in raws:
        offsets.append(at)
        at += len(raw)
    return data, ([_key(n, entries[n][0]) for n in names], offsets, data)


def splice(base: Entries, entries: Entries, changed: Iterable[str]) -> tuple[bytes, Layout | None] | None:
    """The encoding and layout of `entries`, which differ from the laid-out tree `base` in the names `changed`
    alone (each name once, however often `changed` names it); None when `base` has no layout (or does not
    match it)."""
    lay = base.layout if isinstance(base, Tree) else None
    if lay is None:
        return None
    keys, offs, data = lay
    edits: list[tuple[int, int, str, bytes]] = []  # (old index, 0: insert before it | 1: drop it, key, entry)
    for name in set(changed):  # a name twice would insert its entry twice
        old, new = base.get(name), entries.get(name)
        if old is not None:
            k = _key(name, old[0])
            i = bisect.bisect_left(keys, k)
            if i == len(keys) or keys[i] != k:
                return None
            edits.append((i, 1, k, b""))
        if new is not None:
            k = _key(name, new[0])
            edits.append((bisect.bisect_left(keys, k), 0, k, new[2]))
    edits.sort()
    n = len(keys)
    out: list[bytes] = []
    out_keys: list[str] = []
    out_offs: list[int] = []
    pos = size = 0  # old entries taken so far; bytes written so far

    def take(j: int) -> None:  # old entries pos..j-1, unchanged
        nonlocal pos, size
        if j > pos:
            a, b = offs[pos], offs[j] if j < n else len(data)
            out.append(data[a:b])
            out_keys.extend(keys[pos:j])
            shift = size - a
            out_offs.extend([o + shift for o in offs[pos:j]] if shift else offs[pos:j])
            size += b - a
            pos = j

    for i, drop, k, raw in edits:
        take(i)
        if drop:
            pos = i + 1
        else:
            out.append(raw)
            out_keys.append(k)
            out_offs.append(size)
            size += len(raw)
    take(n)
    encoded = b"".join(out)
    return encoded, ((out_keys, out_offs, encoded) if len(out_keys) >= LAYOUT_MIN else None)


def parse_tree(data: bytes) -> Tree:
    """A tree object's content as {name: (mode, id)}. ValueError for a name that is no UTF-8 (git stores the
    bytes it is given): sorted as text it would be out of git's byte order, so such a tree is left to git."""
    out = Tree()
    keys: list[str] = []
    offsets: list[int] = []
    i, n = 0, len(data)
    while i < n:
        sp = data.index(b" ", i)
        nul = data.index(b"\0", sp)
        name, mode = data[sp + 1 : nul].decode("utf-8"), data[i:sp].decode()
        out[name] = (mode, data[nul + 1 : nul + 21].hex(), data[i : nul + 21])
        keys.append(_key(name, mode))
        offsets.append(i)
        i = nul + 21
    if len(keys) >= LAYOUT_MIN:
        out.layout = (keys, offsets, data)
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


def write_loose_stream(git_dir: Path, read: Callable[[int], bytes], size: int) -> str:
    """Store a blob of `size` bytes given by `read(n)` (chunks until b"") without holding it in memory; ValueError
    when it gives other than `size` bytes (the file changed while read)."""
    sha = hashlib.sha1(f"blob {size}\0".encode())
    comp = zlib.compressobj(1)
    folder = Path(git_dir) / "objects"
    tmp = folder / f"tmp_sftree_{os.getpid()}_{threading.get_ident()}_stream"
    got = 0
    try:
        with open(tmp, "wb") as fh:
            fh.write(comp.compress(f"blob {size}\0".encode()))
            while chunk := read(1 << 20):
                got += len(chunk)
                if got > size:
                    break
                sha.update(chunk)
                fh.write(comp.compress(chunk))
            fh.write(comp.flush())
        if got != size:
            raise ValueError(f"{got} bytes where {size} were expected")
        oid = sha.hexdigest()
        (folder / oid[:2]).mkdir(exist_ok=True)
        os.chmod(tmp, 0o444)
        os.replace(tmp, folder / oid[:2] / oid[2:])
        return oid
    finally:
        tmp.unlink(missing_ok=True)


def layout_cost(layout: Layout) -> int:
    """About the bytes a layout holds beyond its tree's entries: the encoding, and per entry a list slot for its
    key (the name itself, shared with the entries) and an offset (a slot and an int object)."""
    return len(layout[2]) + 44 * len(layout[1])


class TreeCache:
    """Parsed trees by id (immutable, so shared by every edge of a store); the newest `limit` kept. Layouts
    (Tree) are kept for the most recently used within `layout_bytes`: ~1.2 MB a tree at 10k attempt records,
    where the entries of a tree a commit made share all but a few with its base (~0.2 MB): 64 layouts at 10k
    would be ~75 MB, and 10x that at 100k. A tree whose layout was dropped is encoded in full when it is a base
    again (a few ms at 10k)."""

    def __init__(self, limit: int = 64, layout_bytes: int = 32 << 20):
        self._trees: OrderedDict[str, Entries] = OrderedDict()
        self._laid: OrderedDict[str, int] = OrderedDict()  # id -> layout_cost, of the trees keeping one
        self._lock = threading.Lock()
        self.limit = limit
        self.layout_bytes = layout_bytes
        self.layout_total = 0

    def get(self, oid: str) -> Entries | None:
        with self._lock:
            entries = self._trees.get(oid)
            if entries is not None:
                self._trees.move_to_end(oid)
                if oid in self._laid:
                    self._laid.move_to_end(oid)
            return entries

    def put(self, oid: str, entries: Entries) -> None:
        with self._lock:
            self._forget_layout(oid)
            self._trees[oid] = entries
            self._trees.move_to_end(oid)
            layout = entries.layout if isinstance(entries, Tree) else None
            if layout is not None:
                self._laid[oid] = cost = layout_cost(layout)
                self.layout_total += cost
            while len(self._trees) > self.limit:
                self._forget_layout(self._trees.popitem(last=False)[0])
            while self.layout_total > self.layout_bytes and self._laid:
                old = next(iter(self._laid))
                self._forget_layout(old)
                laid = self._trees[old]
                if isinstance(laid, Tree):  # (every tree keeping a layout is one)
                    laid.layout = None  # splice reads it once: a splice under way keeps its copy

    def _forget_layout(self, oid: str) -> None:
        self.layout_total -= self._laid.pop(oid, 0)


def apply_changes(
    root: str,
    changes: dict[str, tuple[str, str] | None],
    load: Callable[[str], Entries],
    store: Callable[[Entries, Entries, Iterable[str]], str],
) -> str:
    """The id of tree `root` with `changes` applied ({path: (mode, id)} to set, None to remove; a folder left
    empty goes, as in git). `load(tree_id) -> Entries` reads a tree, `store(entries, base, changed) -> id`
    writes one (`base`: the tree it was made from, `changed`: the names that may differ from it)."""

    def rebuild(tree: str | None, here: dict[str, tuple[str, str] | None]) -> str | None:
        base = load(tree) if tree else {}
        entries = dict(base)
        below: dict[str, dict[str, tuple[str, str] | None]] = {}
        changed = set()
        for path, change in here.items():
            head, _, rest = path.partition("/")
            changed.add(head)
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
        return store(entries, base, changed)

    return rebuild(root, changes) or store({}, {}, ())
