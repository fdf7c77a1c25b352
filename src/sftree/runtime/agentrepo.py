"""The agent's own git repository in its worktree (`.git`), as a Coral worktree has one.

Coral's CLI runs git in the agent's worktree (`coral diff`, `coral checkout`, `coral revert`, `coral show`), so
the agent gets a repository of its own holding its branch's commits: the host's commits, with the same ids,
imported by `git fast-import` **inside the sandbox, as the sandbox user** (at the fork, and after each
`coral eval` by the `coral` client). The host never runs git there: it only writes the import stream, made
from its own store, and reads the branch's head back as bytes (`read_head`), which it uses only when it names
a commit the host knows.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import IO

from sftree.runtime import safefs
from sftree.runtime.objects import IDENTITY, ObjectDB, commit_object, flatten

BRANCH = "refs/heads/main"
# `git init -b main`, the names a code commit leaves out ($SFTREE_EXCLUDE) so `git status` shows what a commit
# would take, the import, then the index to HEAD's tree (a mixed reset: files are left as they are).
INIT_SCRIPT = (
    "git init -q -b main . && printf '%s' \"$SFTREE_EXCLUDE\" > .git/info/exclude && "
    "git fast-import --quiet --force && git reset -q"
)
UPDATE_SCRIPT = "git fast-import --quiet --force && git reset -q"
COMMIT_MARKS = 1 << 40
BLOB_BATCH = 512  # blobs per read round trip
_SHA = re.compile(rb"^[0-9a-f]{40}$")
_REF = re.compile(rb"^refs/heads/[A-Za-z0-9._/-]{1,200}$")


def quote_path(path: str) -> bytes:
    """A path as fast-import reads it: C-style quoted (any character is safe so)."""
    out = bytearray(b'"')
    for b in path.encode("utf-8", "surrogateescape"):
        if b in (0x22, 0x5C):
            out += b"\\" + bytes([b])
        elif b == 0x0A:
            out += b"\\n"
        elif b < 0x20 or b >= 0x7F:
            out += b"\\%03o" % b
        else:
            out.append(b)
    return bytes(out + b'"')


def chain(db: ObjectDB, commit: str, limit: int = 10000) -> list[str]:
    """The first-parent chain from the root commit to `commit`, oldest first."""
    out: list[str] = []
    at: str | None = commit
    while at and len(out) < limit:
        out.append(at)
        parents = db.commit(at)[1]
        at = parents[0] if parents else None
    return out[::-1]


def import_stream(db: ObjectDB, commits: list[str], have: str | None, out: IO[bytes]) -> None:
    """Write to `out` a fast-import stream that makes `commits` (oldest first, each the first parent of the next;
    the first one's parent `have` already in the repository, or none) on `refs/heads/main`, each commit object
    byte-identical to the store's, so its id is the same. Each distinct blob is sent once, streamed from the store
    a chunk at a time (`out` is a file of the host's: a graded file of any size is never held whole)."""
    marks: dict[str, int] = {}  # blob id -> mark
    cmarks: dict[str, int] = {}  # commit id -> mark (a commit made in this stream is named by its mark)
    prev_files: dict[str, tuple[str, str]] = flatten(db, db.commit_tree(have)) if have else {}
    prev = have
    for sha in commits:
        tree, parents, message = db.commit(sha)
        files = flatten(db, tree)
        changed = {p: v for p, v in files.items() if prev_files.get(p) != v}
        need = sorted({oid for _m, oid in changed.values() if oid not in marks})
        _write_blobs(db, need, marks, out)
        msg = commit_object(tree, parents, message).partition(b"\n\n")[2]
        cmarks[sha] = COMMIT_MARKS + len(cmarks)  # (blob marks count from 1: the two never meet)
        lines = [
            b"commit " + BRANCH.encode(),
            b"mark :%d" % cmarks[sha],
            b"author " + IDENTITY,
            b"committer " + IDENTITY,
            b"data %d" % len(msg),
        ]
        body = b"\n".join(lines) + b"\n" + msg
        if parents:
            if parents[0] != prev:
                raise ValueError(f"commit {sha}: its parent {parents[0]} is not the one before it")
            ref = b":%d" % cmarks[parents[0]] if parents[0] in cmarks else parents[0].encode()
            body += b"from " + ref + b"\n"
        for path in sorted(p for p in prev_files if p not in files):
            body += b"D " + quote_path(path) + b"\n"
        for path in sorted(changed):
            mode, oid = changed[path]
            body += b"M %s :%d %s\n" % (mode.encode(), marks[oid], quote_path(path))
        out.write(body + b"\n")
        prev, prev_files = sha, files


def _write_blobs(db: ObjectDB, oids: list[str], marks: dict[str, int], out: IO[bytes]) -> None:
    """Each blob as fast-import's `blob` command, marked next in `marks`, its content streamed from the store."""
    todo, first = iter(oids), len(marks) + 1

    def blob(_kind: str, size: int) -> Callable[[bytes], object]:
        mark = marks[next(todo)] = len(marks) + 1
        # the newline that ends the blob before (fast-import's optional LF after a `data`), then this one's head
        out.write(b"%sblob\nmark :%d\ndata %d\n" % (b"\n" if mark > first else b"", mark, size))
        return out.write

    for i in range(0, len(oids), BLOB_BATCH):
        db.read_each(oids[i : i + BLOB_BATCH], blob)
    if oids:
        out.write(b"\n")


def read_head(worktree: Path, limit: int = 1 << 20) -> str | None:
    """The commit the agent's repository is at, read as bytes without following a link (None: unreadable)."""
    try:
        head = safefs.read_bytes(worktree, ".git/HEAD", limit=4096).strip()
    except OSError:
        return None
    if _SHA.match(head):
        return head.decode()
    if not head.startswith(b"ref: "):
        return None
    ref = head[5:].strip()
    if not _REF.match(ref) or b".." in ref:
        return None
    try:
        sha = safefs.read_bytes(worktree, ".git/" + ref.decode(), limit=4096).strip()
        return sha.decode() if _SHA.match(sha) else None
    except OSError:
        pass
    try:
        packed = safefs.read_bytes(worktree, ".git/packed-refs", limit=limit)
    except OSError:
        return None
    for line in packed.splitlines():
        parts = line.split(b" ")
        if len(parts) == 2 and parts[1] == ref and _SHA.match(parts[0]):
            return parts[0].decode()
    return None
