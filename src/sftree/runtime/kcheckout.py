"""Move a reused knowledge checkout to another commit by writing what differs, without git's index
(docs/runtime.md, "Knowledge cost per edge").

A checkout parked by a closed edge was exact at the commit its fork made it (`exact_at`); since then only the
paths its watch reported (`touched`, kwatch.py) may differ from that commit. So the files that can differ from
the next fork's commit are the tree diff between the two commits plus the touched paths: those are removed and
written again from the store, everything else stays as it is. The work is proportional to what changed; git's
index (a walk and a rewrite of all A attempt entries per call) is never read.

This holds only when nothing could change a file unseen: no hard link to a checkout file can exist (a write
through another name raises no event on the checkout's folders). The caller uses it only for checkouts whose
every edge ran in the sandbox, where link(2) is refused (runtime/sandbox.py); any other checkout takes git's
way, index and stat sweep included. Every file written here is a new inode (the old name is unlinked first).

Paths are walked one component at a time without following links (safefs); anything unexpected (a link or a
file on the way, a submodule, a name that is no UTF-8, a missing object) raises, and the caller then falls back
to git's way, which repairs whatever was half done.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sftree.runtime import gittrees, safefs
from sftree.runtime.kwatch import MAX_DEPTH

MAX_BYTES = 256 << 20  # more blob bytes than this to write: git's way (a checkout of that size is git's job)

Load = Callable[[str], gittrees.Entries]


class Unplannable(Exception):
    """A tree this module does not handle (a submodule); the caller takes git's way."""


@dataclass(frozen=True)
class Plan:
    """What to do on disk: `remove` paths (files, links or whole folders) first, then `write` files and links
    ((path, mode, blob id), parents created as needed)."""

    remove: list[str]
    write: list[tuple[str, str, str]]

    def touched(self) -> set[str]:
        """Every path this plan removes or writes, with the folders above the written ones (made if missing)."""
        out = set(self.remove)
        for path, _m, _o in self.write:
            parts = path.split("/")
            out.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
        return out


def _check_depth(prefix: str) -> None:
    # One `git cat-file` per tree read: a chain of thousands of folders is git's job (one `read-tree`), as it
    # is the watch's limit too (kwatch.MAX_DEPTH).
    if prefix.count("/") > MAX_DEPTH:
        raise Unplannable(f"folders nested deeper than {MAX_DEPTH}: {prefix[:200]}...")


def _no_attributes(entries: gittrees.Entries, folder: str) -> None:
    # Git's checkout converts what a `.gitattributes` names (`ident`, `eol`, `working-tree-encoding`); the
    # move writes blobs as they are. Below one, git writes the files, so that every way to a commit agrees.
    if ".gitattributes" in entries:
        raise Unplannable(
            f".gitattributes in {folder or 'the root'}/: git's checkout converts the files below"
        )


def _files_under(tree: str, prefix: str, load: Load) -> list[tuple[str, str, str]]:
    out, todo = [], [(prefix, tree)]
    while todo:
        base, oid = todo.pop()
        _check_depth(f"{base}/")
        entries = load(oid)
        _no_attributes(entries, base)
        for name, (mode, sub, _raw) in entries.items():
            path = f"{base}/{name}"
            if mode == gittrees.TREE_MODE:
                todo.append((path, sub))
            elif mode == "160000":
                raise Unplannable(f"submodule at {path}")
            else:
                out.append((path, mode, sub))
    return out


def _lookup(root: str, path: str, load: Load) -> tuple[str, str] | None:
    """(mode, id) of `path` in tree `root`, or None when it is not there (or a file lies on the way)."""
    mode, oid, folders = gittrees.TREE_MODE, root, []
    for part in path.split("/"):
        if mode != gittrees.TREE_MODE:
            return None
        folders.append(load(oid))
        got = folders[-1].get(part)
        if got is None:
            return None
        mode, oid = got[0], got[1]
    for entries in folders:  # it is written: no folder on its way may hold attributes
        _no_attributes(entries, path.rpartition("/")[0])
    return mode, oid


def plan(old_root: str, new_root: str, touched: Iterable[str], load: Load) -> Plan:
    """The plan that turns a folder holding tree `old_root`, except for the `touched` paths (anything there, or
    under them), into exactly tree `new_root`. `load(tree id) -> Entries` reads a tree (kept ones are cheap)."""
    actions: dict[str, tuple[str, str] | None] = {}  # path -> (mode, id) to make it, None to remove it

    # A stack, not recursion: an agent can commit folders nested deeper than Python's recursion limit.
    todo = [(old_root, new_root, "")] if old_root != new_root else []
    while todo:
        a, b, prefix = todo.pop()
        _check_depth(prefix)
        ea, eb = load(a), load(b)
        _no_attributes(eb, prefix.rstrip("/"))
        # The names whose entries differ, by a set operation in C (trees of 10k attempts differ in a few).
        for name in {n for n, _e in ea.items() ^ eb.items()}:
            old, new = ea.get(name), eb.get(name)
            path = f"{prefix}{name}"
            if old is not None and new is not None and old[0] == new[0] == gittrees.TREE_MODE:
                todo.append((old[1], new[1], path + "/"))
            else:
                actions[path] = None if new is None else new[:2]
    for path in touched:
        if path and path not in actions:
            actions[path] = _lookup(new_root, path, load)
    # A path under one handled as a whole (removed, replaced, or a folder written in full) is done with it.
    done: set[str] = set()
    remove: list[str] = []
    write: list[tuple[str, str, str]] = []
    for path in sorted(actions):
        parts = path.split("/")
        if any("/".join(parts[:i]) in done for i in range(1, len(parts))):
            continue
        done.add(path)
        remove.append(path)  # whatever is there now goes (a new inode for every file written)
        target = actions[path]
        if target is None:
            continue
        mode, oid = target
        if mode == gittrees.TREE_MODE:
            write.extend(_files_under(oid, path, load))
        elif mode == "160000":
            raise Unplannable(f"submodule at {path}")
        else:
            write.append((path, mode, oid))
    return Plan(remove, write)


def read_blobs(repo: Path, oids: set[str], git) -> dict[str, bytes]:
    """The blobs' contents, in one `git cat-file --batch` (after a `--batch-check` of their sizes: more than
    MAX_BYTES in all is left to git, which streams them). `git` is workspace.git (the host's hardened git)."""
    if not oids:
        return {}
    order = sorted(oids)
    ask = "".join(f"{o}\n" for o in order).encode()
    sizes = git(["cat-file", "--batch-check"], git_dir=repo, input=ask).stdout.split()
    if len(sizes) != 3 * len(order) or sizes[1::3] != ["blob"] * len(order):
        raise Unplannable(f"objects missing or not blobs in {repo}")
    if sum(int(n) for n in sizes[2::3]) > MAX_BYTES:
        raise Unplannable("too much to write")
    data = git(["cat-file", "--batch"], git_dir=repo, input=ask, binary=True).stdout
    blobs, i = {}, 0
    for oid in order:
        nl = data.index(b"\n", i)
        head = data[i:nl].split()
        if len(head) != 3 or head[0].decode() != oid or head[1] != b"blob":
            raise Unplannable(f"object {oid} is not a blob in {repo}: {data[i:nl][:200]!r}")
        size = int(head[2])
        blobs[oid] = data[nl + 1 : nl + 1 + size]
        i = nl + 1 + size + 1
    return blobs


def _clear(dfd: int, name: str) -> None:
    """Remove `name` in folder `dfd`, whatever it is, never following a link."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        safefs.remove_tree(dfd, name)  # fd-based: never follows a link inside
    else:
        os.unlink(name, dir_fd=dfd)


def _write(dfd: int, name: str, mode: str, data: bytes) -> None:
    if mode == "120000":
        os.symlink(data, os.fsencode(name), dir_fd=dfd)
        return
    perm = 0o777 if mode == "100755" else 0o666  # what git creates (the umask applies)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, perm, dir_fd=dfd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def apply(kdir: Path, todo: Plan, blobs: dict[str, bytes]) -> None:
    """Carry out `todo` in folder `kdir` (raises on anything unexpected: the caller takes git's way)."""
    for path in todo.remove:
        parent, _, name = path.rpartition("/")
        try:
            with safefs.open_dir(kdir, parent) as dfd:
                _clear(dfd, name)
        except FileNotFoundError:
            continue  # its folder is gone: nothing to remove
    for path, mode, oid in todo.write:
        parent, _, name = path.rpartition("/")
        with safefs.open_dir(kdir, parent, create=True) as dfd:
            _clear(dfd, name)  # a path written twice, or a leftover the plan did not know of
            _write(dfd, name, mode, blobs[oid])


def move(
    kdir: Path, repo: Path, old_root: str, new_root: str, touched: Iterable[str], load: Load, git
) -> Plan:
    """Plan, read the blobs, apply; the plan carried out."""
    todo = plan(old_root, new_root, touched, load)
    oids = {oid for _p, _m, oid in todo.write}
    blobs = read_blobs(repo, oids, git)
    apply(kdir, todo, blobs)
    return todo
