"""One edge's private world: a Coral run directory holding the agent's worktree and its copy of the knowledge.

Layout of an edge folder (docs/runtime.md; the agent sees `run/` at `agent.run_dir`, a stable Coral-shaped path):

    work/<edge>/run/agents/<agent>/    the worktree: the code, the agent's cwd, with what Coral puts in a
                                       worktree (AGENTS.md, .coral_dir, .coral_agent_id, .opencode/ with
                                       opencode.json and links to ../../../.coral/public/<item>) and .git,
                                       the agent's own repository (agentrepo.py)
    work/<edge>/run/.coral/public/     the shared knowledge (notes/, skills/, ...), the agent's to change
    work/<edge>/attempts/              the attempt records (.coral/public/attempts/ inside, read-only there):
                                       only the host writes them
    work/<edge>/host/                  what the host shows the sandbox read-only (.coral/config.yaml)

A node's state is (code commit, knowledge commit, session). A fork writes both commits into new folders
(checkout.py), so branches never share a file. Commits are made by the host from what it reads itself
(folderreader.py): no git, no file tool and no parser of the host ever runs over the workspace (docs/security.md,
"The host boundary"). What a commit holds of the worktree: every regular file and link but `.git` folders,
Python caches and the names Coral keeps out of a worktree's commits (its `.gitignore` entries); of the
knowledge: all of `public/` but `attempts/`, which is the host's own record.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from sftree.errors import InputError
from sftree.fileio import read_json
from sftree.jsontypes import JSONObject
from sftree.runtime import agentrepo, checkout, gittrees, safefs
from sftree.runtime.folderreader import FolderReader, Quota, QuotaExceeded, Reading, UnsafeWorkspace  # noqa: F401
from sftree.runtime.objects import ObjectDB, flatten, tree_from_files
from sftree.runtime.repos import TreeRepos

log = logging.getLogger(__name__)

# Coral's shared items, linked from a worktree's shared folder into .coral/public (coral/workspace/worktree.py).
CORAL_ITEMS = ("notes", "skills", "agents", "attempts", "logs", "heartbeat", "roles", "eval_logs")
SHARED_DIR = ".opencode"  # the shared folder's name in an OpenCode worktree
# What Coral keeps out of a worktree's commits (the entries it adds to the worktree's .gitignore).
CORAL_MANAGED = frozenset(
    {
        ".coral_agent_id",
        ".coral_dir",
        "CLAUDE.md",
        "AGENTS.md",
        ".claude",
        ".codex",
        ".cursor",
        ".opencode",
        ".venv",
    }
)
CACHE_DIRS = frozenset({"__pycache__", ".pytest_cache"})


def code_skip(rel: str, is_dir: bool) -> bool:
    """What a code commit leaves out (module docstring)."""
    name = rel.rpartition("/")[2]
    if name == ".git" or ("/" not in rel and name in CORAL_MANAGED):
        return True
    return name in CACHE_DIRS if is_dir else name.endswith(".pyc")


def knowledge_skip(rel: str, is_dir: bool) -> bool:
    return rel == "attempts" or rel.rpartition("/")[2] == ".git"


@dataclass(frozen=True)
class NodeState:
    """What a tree node is: a code commit, a knowledge commit, and the session that led there.

    `session` is a path relative to the tree directory (`sessions/<id>.json`, the exact message list), or None
    for a fresh session (the root: the Teacher does not inherit the Student's context). `counters`: the host's
    Coral counters at the node (`sftree.world.counters.CoralCounters.to_dict`; None at the root, whose come from its
    attempt records): statuses, bests, eval numbers and heartbeats of later evals come from them, never from
    files the agent can write."""

    code_commit: str
    knowledge_commit: str
    session: str | None = None
    counters: JSONObject | None = field(default=None, compare=False, hash=False)

    def to_dict(self) -> JSONObject:
        d: JSONObject = {
            "code_commit": self.code_commit,
            "knowledge_commit": self.knowledge_commit,
            "session": self.session,
        }
        if self.counters:
            d["counters"] = dict(self.counters)
        return d

    @classmethod
    def from_dict(cls, d: JSONObject) -> NodeState:
        """A node's state as `to_dict` wrote it (tree.json's `state`); an InputError for any other shape."""
        code, knowledge, session, counters = (
            d["code_commit"],
            d["knowledge_commit"],
            d.get("session"),
            d.get("counters"),
        )
        if not (isinstance(code, str) and isinstance(knowledge, str)):
            raise InputError(f"a node's state names no code and knowledge commits: {d!r:.200}")
        if not (session is None or isinstance(session, str)) or not (
            counters is None or isinstance(counters, dict)
        ):
            raise InputError(
                f"a node's state has a session that is no path or counters that are no object: {d!r:.200}"
            )
        return cls(code, knowledge, session, counters)


@dataclass(frozen=True)
class Paths:
    """Where the edge's world is: on the host (`run`), and as the agent sees it (`inside`)."""

    edge: Path  # work/<edge>
    run: Path  # work/<edge>/run
    agent_id: str
    inside: str  # the run directory as the agent sees it (agent.run_dir; the host path without a sandbox)
    attempts: Path  # the host's attempt records folder
    host: Path  # work/<edge>/host

    @property
    def worktree(self) -> Path:
        return self.run / "agents" / self.agent_id

    @property
    def public(self) -> Path:
        return self.run / ".coral" / "public"

    @property
    def worktree_inside(self) -> str:
        return f"{self.inside}/agents/{self.agent_id}"

    @property
    def coral_inside(self) -> str:
        return f"{self.inside}/.coral"


def _no_host_files(_path: str) -> bool:
    return False


def _host_knowledge(path: str) -> bool:
    """What the host itself writes into the knowledge after an eval's checkpoint (the attempt records, Coral's
    eval counter): never the agent's, so never put back."""
    return path == "eval_count" or path.startswith("attempts/")


@dataclass
class EdgeWorkspace:
    """One edge's world (module docstring). Made by `TreeStore.fork`."""

    store: TreeRepos  # the tree's store (store.py's TreeStore), which forked it
    edge_id: str
    parent: NodeState
    paths: Paths
    uid: int | None  # the sandbox user owning what the agent may change (sftree is root), else None
    separate_attempts: bool  # the attempt records live outside run/ (a sandbox shows them read-only)
    quota: Quota
    session: list[JSONObject] = field(default_factory=list)  # the parent's messages (empty: a fresh session)
    last_turn: JSONObject | None = None  # the host's record of how the parent's last turn ended (prompts.py)
    closed: bool = False
    head: str = ""  # the code commit the worktree is at, by the host's records
    known: set[str] = field(default_factory=set)  # the code commits of this branch (the agent's repository)
    graded: list[str] = field(default_factory=list)  # commits graded in this edge, in order
    k_head: str = ""
    _k_tree: str = ""
    attempts_tree: str | None = None  # the attempts/ tree the attempts folder holds (None: none)
    _attempts_clean: bool = (
        True  # the attempts folder holds exactly `attempts_tree` (it may be parked for reuse)
    )
    _code_reader: FolderReader = field(init=False)
    _k_reader: FolderReader = field(init=False)

    def __post_init__(self) -> None:
        self.head = self.head or self.parent.code_commit
        self.k_head = self.k_head or self.parent.knowledge_commit
        self._code_reader = FolderReader(self.store.code, self.quota, code_skip)
        self._k_reader = FolderReader(self.store.knowledge, self.quota, knowledge_skip)

    @property
    def root(self) -> Path:
        """The worktree (the agent's cwd), on the host."""
        return self.paths.worktree

    @property
    def knowledge_dir(self) -> Path:
        return self.paths.public

    # ---- code -----------------------------------------------------------------------------------------------
    def parent_for_commit(self) -> str:
        """The commit a new code commit follows: the agent's repository's head when it names a commit of this
        branch (after `coral checkout`), else the host's own record."""
        sha = agentrepo.read_head(self.root)
        return sha if sha in self.known else self.head

    def commit_code(self, message: str) -> tuple[str | None, Reading]:
        """Commit what the worktree holds now (the host reads it: folderreader.py); (the commit, what was read), the
        commit None when the tree equals its parent's ("Nothing to commit"). QuotaExceeded past the quota."""
        parent = self.parent_for_commit()
        tree, info = self._code_reader.snapshot(self.root)
        if tree == self.store.code.commit_tree(parent):
            self.head = parent
            return None, info
        sha = self.store.code.write_commit(tree, [parent], message or "(no message)")
        self.head = sha
        self.known.add(sha)
        return sha, info

    def repo_update(self, commit: str, have: str | None) -> IO[bytes]:
        """The import stream that brings the agent's repository from `have` to `commit` (agentrepo.py), in an
        unnamed temporary file at its start (nothing of it outlives the process; the caller closes it)."""
        commits = agentrepo.chain(self.store.code, commit)
        if have in commits:
            commits = commits[commits.index(have) + 1 :]
        else:
            have = None
        out = tempfile.TemporaryFile()
        try:
            agentrepo.import_stream(self.store.code, commits, have, out)
            out.seek(0)
        except BaseException:
            out.close()
            raise
        return out

    # ---- knowledge ------------------------------------------------------------------------------------------
    def write_attempt(self, commit: str, data: bytes) -> None:
        """The host's attempt record `attempts/<commit>.json` (what the agent reads of its evals)."""
        name = f"{commit}.json"
        db = self.store.knowledge
        self._attempts_clean = False  # until it is written and recorded
        safefs.write_bytes_atomic(self.paths.attempts, name, data)
        entries = dict(db.tree(self.attempts_tree)) if self.attempts_tree else {}  # (a copy in C)
        entries[name] = gittrees.entry(name, "100644", db.write("blob", data))
        self.attempts_tree = db.write_tree_from(self.attempts_tree, entries, [name])
        self._attempts_clean = self.separate_attempts

    def commit_knowledge(self, message: str) -> str:
        """Commit the knowledge as it is now (a new commit only when it changed); the current knowledge commit.
        Knowledge past the quota is not taken: the last commit stands (a tree must always be able to finish)."""
        try:
            files, _info = self._k_reader.files(self.paths.public)
        except QuotaExceeded as exc:
            log.warning("edge %s: the knowledge is not committed: %s", self.edge_id, exc)
            return self.k_head
        extra = {"attempts": (gittrees.TREE_MODE, self.attempts_tree)} if self.attempts_tree else {}
        tree = tree_from_files(self.store.knowledge, files, extra)
        if tree != self._k_tree:
            self.k_head = self.store.knowledge.write_commit(tree, [self.k_head], message)
            self._k_tree = tree
        return self.k_head

    # ---- the end --------------------------------------------------------------------------------------------
    def restore(self, code: str, knowledge: str | None) -> list[str]:
        """Put the worktree and the knowledge back to exactly what an eval took: its graded `code` commit and
        the `knowledge` commit Coral's checkpoint made when it was submitted (a turn ends at its eval, and what
        the agent did after it, in the same call or reply, reaches nothing: DESIGN.md). Only the paths that
        differ are rewritten, no link followed; the attempt records are the host's and stay. What was restored
        ("code", "knowledge"), for the log."""
        done = []
        # (what, its reader, its folder, its store, the commit to restore, which paths are the host's own)
        targets: list[tuple[str, FolderReader, Path, ObjectDB, str, Callable[[str], bool]]] = [
            ("code", self._code_reader, self.root, self.store.code, code, _no_host_files)
        ]
        if knowledge:
            targets.append(
                (
                    "knowledge",
                    self._k_reader,
                    self.paths.public,
                    self.store.knowledge,
                    knowledge,
                    _host_knowledge,
                )
            )
        for what, reader, folder, db, commit, hosts in targets:
            try:
                now, _info = reader.files(folder)
            except (QuotaExceeded, UnsafeWorkspace, OSError):
                now = None  # unreadable as it is: every path of the commit is written anew
            want = {p: v for p, v in flatten(db, db.commit_tree(commit)).items() if not hosts(p)}
            if now is not None:
                now = {p: v for p, v in now.items() if not hosts(p)}
                if now == want:
                    continue
            gone = sorted(p for p in (now or want) if p not in want or (now or {}).get(p) != want[p])
            write = {p: v for p, v in want.items() if now is None or now.get(p) != v}
            checkout.apply_difference(db, folder, gone, write, uid=self.uid)
            done.append(what)
        self.head = code
        return done

    def state(self, session: str | None, counters: JSONObject | None = None) -> NodeState:
        """The child's state (module docstring of search/edge.py): the code of the edge's last graded commit (the
        score belongs to it), else what the worktree holds; the knowledge as it is. Writes the refs that keep
        the edge's commits."""
        code = self.graded[-1] if self.graded else None
        if code is None:
            try:
                code = self.commit_code("sftree: the worktree at the end of the edge")[0] or self.head
            except QuotaExceeded as exc:  # the worktree past its quota: the last commit the host made stands
                log.warning("edge %s: the worktree at the end is not committed: %s", self.edge_id, exc)
                code = self.head
        knowledge = self.commit_knowledge("sftree: end of edge")
        refs = {f"{self.edge_id}/{c[:12]}": c for c in [*self.graded, code]}
        self.store.keep_refs("code", refs)
        self.store.keep_refs("knowledge", {self.edge_id: knowledge})
        return NodeState(code, knowledge, session, counters)

    def close(self) -> None:
        """Remove the edge's folder (the commits stay in the store); an attempts folder only the host wrote is
        kept for the next fork."""
        if self.closed:
            return
        self.closed = True
        if self._attempts_clean and self.separate_attempts and self.attempts_tree is not None:
            try:
                self.store.park_attempts(self.paths.attempts, self.attempts_tree)
            except OSError as exc:
                log.warning("edge %s: attempt records not kept for reuse: %s", self.edge_id, exc)
        self.store.remove_edge_dir(self.paths.edge)


# ---- writing the world ---------------------------------------------------------------------------------------
def write_world(ws: EdgeWorkspace, files: dict[str, bytes]) -> None:
    """Write what Coral puts in a worktree beside the code: `files` ({path in the worktree: bytes}, e.g.
    AGENTS.md, .opencode/opencode.json), `.coral_agent_id`, `.coral_dir` and the shared folder's links. The
    worktree was just made by the host; every entry is replaced, never written through."""
    p = ws.paths
    base = {".coral_agent_id": p.agent_id.encode(), ".coral_dir": p.coral_inside.encode()}
    for rel, data in {**base, **files}.items():
        safefs.write_bytes_atomic(p.worktree, rel, data)
        _own(p.worktree, rel, ws.uid)
    with safefs.open_dir(p.worktree, SHARED_DIR, create=True) as dfd:
        if ws.uid is not None:
            os.chown(dfd, ws.uid, ws.uid)
        for item in CORAL_ITEMS:
            try:
                os.unlink(item, dir_fd=dfd)
            except FileNotFoundError:
                pass
            os.symlink(f"../../../.coral/public/{item}", item, dir_fd=dfd)
            if ws.uid is not None:
                os.chown(item, ws.uid, ws.uid, dir_fd=dfd, follow_symlinks=False)


def _own(root: Path, rel: str, uid: int | None) -> None:
    if uid is None:
        return
    parts = Path(rel).parts
    with safefs.open_dir(root, Path(*parts[:-1]) if len(parts) > 1 else "") as dfd:
        os.chown(parts[-1], uid, uid, dir_fd=dfd, follow_symlinks=False)


def load_session(tree_dir: Path, session: str | None) -> list[JSONObject]:
    """A node's session (`sessions/<id>.json`, the exact message list the search wrote)."""
    if not session:
        return []
    messages: list[JSONObject] = read_json(Path(tree_dir) / session)
    return messages


def load_last_turn(tree_dir: Path, session: str | None) -> JSONObject | None:
    """The host's record of how the session's edge ended its last turn (`edges/<edge>/last_turn.json`)."""
    if not session:
        return None
    path = Path(tree_dir) / "edges" / Path(session).stem / "last_turn.json"
    if not path.is_file():
        return None
    record: JSONObject = read_json(path, "last turn record")
    return record


def fresh_dir(path: Path, uid: int | None = None, mode: int = 0o755) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def make_folders(ws: EdgeWorkspace) -> None:
    """The run directory's folders: the host's (0755, the agent cannot add beside them) and the agent's."""
    p = ws.paths
    for d in (p.run, p.run / "agents", p.run / ".coral", p.host):
        fresh_dir(d)
    fresh_dir(p.worktree, ws.uid)
    fresh_dir(p.public, ws.uid)
    for item in CORAL_ITEMS:
        if item != "attempts":
            fresh_dir(p.public / item, ws.uid)
    if ws.separate_attempts:
        fresh_dir(p.public / "attempts")  # the mount point of the read-only records
    fresh_dir(p.attempts)


def split_knowledge(db: ObjectDB, commit: str) -> tuple[dict[str, tuple[str, str]], str | None]:
    """A knowledge commit's files but attempts/, and its attempts/ tree."""
    tree = db.commit_tree(commit)
    entries = db.tree(tree)
    att = entries.get("attempts")
    files = {}
    for name, (mode, oid, _raw) in entries.items():
        if name == "attempts":
            continue
        if mode == gittrees.TREE_MODE:
            files.update(flatten(db, oid, name + "/"))
        else:
            files[name] = (mode, oid)
    return files, (att[1] if att and att[0] == gittrees.TREE_MODE else None)


def attempt_entries(db: ObjectDB, tree: str | None) -> dict[str, tuple[str, str]]:
    """The attempt records of an attempts/ tree {name: (mode, id)} (files directly in it; folders left out)."""
    if not tree:
        return {}
    return {n: (m, o) for n, (m, o, _r) in db.tree(tree).items() if m != gittrees.TREE_MODE}


def attempts_difference(
    db: ObjectDB, old: str | None, new: str | None
) -> tuple[list[str], dict[str, tuple[str, str]]]:
    """What moves a folder holding attempts/ tree `old` to tree `new`: (names to remove, {name: (mode, id)} to
    write); set operations on the kept entries, so two trees of 10k records a few apart cost ~1 ms."""
    a = db.tree(old) if old else {}
    b = db.tree(new) if new else {}
    changed = set(b.items()) - set(a.items())
    gone = [n for n in a.keys() - b.keys()]
    write = {n: (m, o) for n, (m, o, _r) in changed if m != gittrees.TREE_MODE}
    return gone, write


def write_code(ws: EdgeWorkspace) -> None:
    checkout.write_files(
        ws.store.code, flatten(ws.store.code, ws.store.code.commit_tree(ws.head)), ws.root, uid=ws.uid
    )
