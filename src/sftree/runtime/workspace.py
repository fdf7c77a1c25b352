"""Forkable per-tree workspaces: code in one git repository, shared knowledge in a second one.

Layout under a tree directory (docs/runtime.md):

    store/code.git        bare repository of the root's code/; every `coral eval` commits into it
    store/knowledge.git   bare repository of the root's shared/ (Coral's knowledge base); one commit per turn
    work/<edge>/code/     `git worktree add --detach` of the node's code commit = the agent's workspace
    work/<edge>/code/.opencode/  private checkout of the node's knowledge commit (git-excluded from code)
    work/<edge>/code/AGENTS.md   standing instructions (git-excluded from code)
    work/<edge>/knowledge.index  the edge's own index for knowledge.git (so parallel edges never share one)

A node's state is (code commit, knowledge commit, session file). Forking checks out both commits into a fresh
folder, so two branches never see each other's files. Every commit gets a ref under `refs/sftree/` so `git gc`
never drops it. Commit dates and identity are fixed, so equal content on equal parents gives equal hashes and a
rerun of a deterministic search reproduces its commit ids (the eval prompts quote them).

Hostile workspaces (docs/security.md): the agent controls every file under work/<edge>/code, including the
`.git` file a worktree normally finds its repository through. The host never lets git discover a repository
there: every call names the git dir (`--git-dir`, the worktree's admin folder under code.git/worktrees) and the
work tree, disables hooks and fsmonitor, and ignores the global and system config. Workspace content is never
followed through a symlink on the host: `.opencode` must be a real folder (else the edge fails with the
reason), a linked knowledge subfolder is replaced by an empty one at fork time, and AGENTS.md and .opencode are
taken out of every code commit whatever a `.gitignore` in the workspace says.

Thread safety: commands that touch shared repository metadata (worktree add/remove, update-ref) run under one
lock per store; commits inside a worktree and knowledge commits (own index file) need none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from sftree.errors import InputError, SftreeError
from sftree.runtime import attempts as attemptsmod
from sftree.runtime import gittrees, kcheckout, safefs
from sftree.runtime.kwatch import KnowledgeWatch
from sftree.runtime.sandbox import give_to, own, own_below

log = logging.getLogger(__name__)

# Files the agent's workspace holds that are not part of the code (never committed by `coral eval`).
CODE_EXCLUDES = ["/.opencode/", "/AGENTS.md", "__pycache__/", "*.pyc", ".pytest_cache/"]
# OpenCode's own files in .opencode/ (plugins, npm metadata) are not shared knowledge.
KNOWLEDGE_EXCLUDES = [
    "/node_modules/",
    "/package.json",
    "/package-lock.json",
    "/bun.lock",
    "/.gitignore",
    "/opencode.json",
    "/opencode.jsonc",
    "/plugin/",
    "/plugins/",
]
KNOWLEDGE_DIR = ".opencode"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "sftree",
    "GIT_AUTHOR_EMAIL": "sftree@localhost",
    "GIT_COMMITTER_NAME": "sftree",
    "GIT_COMMITTER_EMAIL": "sftree@localhost",
    # Fixed dates: deterministic commit ids (see module docstring).
    "GIT_AUTHOR_DATE": "1700000000 +0000",
    "GIT_COMMITTER_DATE": "1700000000 +0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
}
# On every host-side git call: nothing configured in a repository may run a program or change what is read.
GIT_SAFE_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.sshCommand=false",
    "core.pager=cat",
    "core.symlinks=true",
    "protocol.allow=never",
    "submodule.recurse=false",
)
SHA_RE = re.compile(r"^[0-9a-f]{4,64}$")


class GitError(SftreeError):
    """A git command failed; the message holds the command and its stderr."""


class UnsafeWorkspace(SftreeError):
    """Workspace content the host refuses to touch (a symlink out of it, a file where a folder belongs)."""


def check_sha(text: str, what: str = "commit") -> str:
    """Agent-controlled text used as a revision must be a hash (never an option like `--output=...`)."""
    if not isinstance(text, str) or not SHA_RE.match(text):
        raise UnsafeWorkspace(f"{what} {text!r} is not a commit hash")
    return text


def real_dir(path: Path, what: str) -> Path:
    """`path` as a real folder (created if missing); UnsafeWorkspace if it is a symlink or a file."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise UnsafeWorkspace(f"{what} {path} is a symlink or not a folder; the host will not follow it")
    path.mkdir(exist_ok=True)
    return path


def git(
    args: list[str],
    *,
    git_dir: Path | None = None,
    cwd: Path | None = None,
    env: dict | None = None,
    input: bytes | None = None,
    check: bool = True,
    binary: bool = False,
) -> subprocess.CompletedProcess:
    """Run git with a clean, fixed identity; return the CompletedProcess (stdout as text, or bytes if
    `binary`)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    full_env.update(GIT_ENV)
    full_env["HOME"] = full_env.get("HOME", "/tmp")
    # Defence in depth (every call names its git dir): git never walks up from where it runs to a repository
    # above it (a workspace's parent, the project checkout), nor across a filesystem. The ceiling is the
    # parent: git ignores a ceiling equal to the folder it runs in.
    here = os.path.realpath(cwd if cwd is not None else os.getcwd())
    full_env["GIT_CEILING_DIRECTORIES"] = os.path.dirname(here)
    full_env["GIT_DISCOVERY_ACROSS_FILESYSTEM"] = "0"
    if env:
        full_env.update(env)
    cmd = ["git", "-c", "core.quotepath=off", "-c", "gc.auto=0", "-c", "advice.detachedHead=false"]
    for kv in GIT_SAFE_CONFIG:
        cmd += ["-c", kv]
    if git_dir is not None:
        cmd += ["--git-dir", str(git_dir)]
    cmd += args
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, input=input, capture_output=True)
    out = subprocess.CompletedProcess(
        proc.args,
        proc.returncode,
        proc.stdout if binary else proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )
    if check and proc.returncode != 0:
        raise GitError(f"git {' '.join(args[:3])} failed ({proc.returncode}): {out.stderr.strip()[-2000:]}")
    return out


@dataclass(frozen=True)
class NodeState:
    """What a tree node is: a code commit, a knowledge commit, and the session that led there.

    `session` is a path relative to the tree directory (`sessions/<id>.json`, the exact message list), or None
    for a fresh session (the root: the Teacher does not inherit the Student's context).
    """

    code_commit: str
    knowledge_commit: str
    session: str | None = None

    def to_dict(self) -> dict:
        return {
            "code_commit": self.code_commit,
            "knowledge_commit": self.knowledge_commit,
            "session": self.session,
        }

    @classmethod
    def from_dict(cls, d: dict) -> NodeState:
        return cls(d["code_commit"], d["knowledge_commit"], d.get("session"))


@dataclass
class EdgeWorkspace:
    """One edge's private working copy: `root` is the agent's workspace (code worktree + .opencode + AGENTS.md)."""

    store: TreeStore
    edge_id: str
    parent: NodeState
    dir: Path  # work/<edge>
    root: Path  # work/<edge>/code
    session: list[dict] = field(default_factory=list)  # parent's messages (empty for a fresh session)
    last_turn: dict | None = None  # the host's record of how the parent's last turn ended (prompts.py)
    git_dir: Path | None = None  # the worktree's admin folder in code.git (never read from the workspace)
    closed: bool = False
    _code_commits: list[str] = field(default_factory=list)
    _k_head: str = ""  # the knowledge commit the checkout is at (set by fork)
    _k_tree: str | None = None
    _index_at: str | None = None  # the knowledge commit whose tree the edge's index holds (None: unknown)
    # Paths that may be in the checkout but not in the index (touched and never staged, or committed without
    # the index); None: unknown. The fork left none, so the next fork removes those the index (then at its
    # commit) does not hold instead of a `git clean` of the whole folder.
    _unstaged: set[str] | None = field(default_factory=set)
    attempt_view: attemptsmod.AttemptView | None = None  # the checkout's attempt records (attempts.py)
    # Every command of the edge ran where link(2) fails (runtime/sandbox.py), so no file of the checkout can
    # be changed through another name, unseen by its watch (set by the fork, lowered by the edge's runner).
    links_fenced: bool = False
    # The checkout was exactly this commit when the fork handed it over; `_since`: the paths touched since
    # (None: unknown); `_trusted`: no edge without the fence has used it. The next fork moves a trusted
    # checkout by writing those paths and the tree diff alone (kcheckout.py).
    _exact_at: str = ""
    _since: set[str] | None = None
    _trusted: bool = False
    # The sandbox uid owning every entry of the checkout but `_host_wrote` (what the fork wrote) and the paths
    # the watch reported since (None: unknown): `hand_to` then hands over only those.
    _owner: int | None = None
    _host_wrote: set[str] | None = None

    def __post_init__(self):
        self._k_head = self._k_head or self.parent.knowledge_commit
        self._index_at = self._k_head  # the fork made the index match the commit

    @property
    def knowledge_dir(self) -> Path:
        return self.root / KNOWLEDGE_DIR

    @property
    def index_file(self) -> Path:
        return self.dir / "knowledge.index"

    def _git(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        """git on this worktree through the host's own admin folder, never the workspace's `.git`."""
        return git(["--work-tree", str(self.root), *args], git_dir=self.git_dir, cwd=self.root, **kw)

    def head(self) -> str:
        """The worktree's commit. Read from its detached HEAD file (a git call fewer per commit)."""
        try:
            sha = (self.git_dir / "HEAD").read_text().strip()
            if len(sha) == 40 and all(c in "0123456789abcdef" for c in sha):
                return sha
        except OSError:
            pass
        return self._git(["rev-parse", "HEAD"]).stdout.strip()

    def dirty(self) -> bool:
        """Uncommitted changes in the worktree (excluded files do not count)."""
        return bool(self._git(["status", "--porcelain", "--untracked-files=all"]).stdout.strip())

    def store_git(self, args: list[str]) -> str:
        """A read-only git query on the code store; stripped stdout, "" when it fails."""
        proc = git(args, git_dir=self.store.code_git, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def commit_code(self, message: str) -> str | None:
        """`git add -A` + commit in the worktree; the new commit id, or None when there is nothing to commit."""
        self._git(["add", "-A", "--", "."])
        # A `.gitignore` in the workspace can un-ignore these; they are never code.
        self._git(["rm", "-r", "-q", "--cached", "--ignore-unmatch", "--", "AGENTS.md", ".opencode"])
        proc = self._git(["commit", "-q", "--no-verify", "-m", message or "(no message)"], check=False)
        if proc.returncode != 0:
            if self._git(["diff", "--cached", "--quiet"], check=False).returncode == 0:
                return None
            raise GitError(
                f"git commit failed in {self.root}: {(proc.stderr or proc.stdout).strip()[-2000:]}"
            )
        sha = self.head()
        self._code_commits.append(sha)
        return sha

    def commit_knowledge(self, message: str) -> str:
        """Snapshot .opencode/ into knowledge.git (a new commit only if it changed); the current commit id."""
        # Missing: the agent deleted it (an empty knowledge base). A link: refused (it would carry its target).
        real_dir(self.knowledge_dir, "the knowledge folder")
        watch = self.attempt_view.watch if self.attempt_view is not None else None
        if watch is not None and self._k_tree is not None and not watch.changed():
            return self._k_head  # nothing under .opencode changed since the last commit (kwatch.py)
        touched = watch.committed() if watch is not None else None  # later changes count next time
        if touched is None or self._since is None or len(self._since) + len(touched) > _MAX_SINCE:
            self._since = None
        else:
            self._since |= touched
        index_was, self._index_at = self._index_at, None  # until the commit is made, the index is part way
        if touched is None:
            self._unstaged = None  # a full `add` may leave ignored paths out: unknown
        try:
            head, index_now = self._commit_knowledge(message, touched, index_was)
        except BaseException:
            if watch is not None:
                watch.invalidate()
            raise
        self._index_at = head if index_now else index_was
        return head

    def _commit_knowledge(
        self, message: str, touched: set[str] | None, index_at: str | None
    ) -> tuple[str, bool]:
        """Commit; (the commit, whether the index now holds its tree).

        The short way, when the watch told what changed and those are plain files and links: their blobs are
        written from the files (never through a link) and the tree is the last commit's with those entries
        (gittrees.py); git's index is left as it was (the next fork moves it by a tree diff and its stat sweep
        stands). Otherwise git's way: the index is brought to the last commit, then `add` and `write-tree`."""
        repo, env = self.store.knowledge_git, knowledge_index_env(self.index_file)
        if self._k_tree is None:
            self._k_tree = self.store.commit_tree(self._k_head)
        names = None if touched is None else self._touched_names(touched)
        try:
            changes = None if names is None else self._plain_changes(names)
        except ValueError:  # a committed name that is no UTF-8 (gittrees.parse_tree): git's way
            changes = None
        tree = None
        if changes is not None:
            try:
                tree = gittrees.apply_changes(
                    self._k_tree, changes, self.store.load_tree, self.store.store_tree
                )
            except (OSError, GitError, ValueError):
                tree = None
            added = "".join(f"add '{p}'\n" for p in sorted(changes))
            if tree is not None and self._unstaged is not None:
                self._unstaged.update(changes)  # on disk, not in the index: the next fork checks them
        index_now = tree is None
        if tree is None:
            if index_at != self._k_head:
                self._sync_index(index_at)
            added = None
            if names is not None:
                self._unstaged = None  # `add` leaves ignored paths out
                added = self._add_paths(names)
            if added is None:  # everything: the paths are unknown, or git refused the short way
                added = git(
                    ["--work-tree", str(self.knowledge_dir), "add", "-A", "-v", "--", "."],
                    git_dir=repo,
                    env=env,
                ).stdout
            # --missing-ok: every blob in this index was written by our own `add`; skipping git's lookup of
            # each of them is a good part of a tree rewrite's cost at 10k attempts. Level 0: the new
            # `attempts/` tree object (A entries, ~730 KB at 10k) is written loose without deflating it.
            tree = git(["-c", "core.looseCompression=0", "write-tree", "--missing-ok"], git_dir=repo, env=env)
            tree = tree.stdout.strip()
        if self.attempt_view is not None and added:
            # What was staged under attempts/ is read again by the attempt view, whatever inotify reported (a
            # change made through a hard link from elsewhere raises no event).
            self.attempt_view.mark_dirty(_attempt_names(added))
        if tree != self._k_tree:
            self._k_head = git(
                ["commit-tree", tree, "-p", self._k_head, "-m", message], git_dir=repo
            ).stdout.strip()
            self._k_tree = self.store.commit_trees[self._k_head] = tree
        return self._k_head, index_now

    def _sync_index(self, index_at: str | None) -> None:
        """Bring the index (at `index_at`, or unknown) to the last commit, stat data kept where unchanged."""
        if self.store._move_index(self.index_file, index_at, self._k_head) is None:
            git(
                ["--work-tree", str(self.knowledge_dir), "read-tree", "--reset", self._k_head],
                git_dir=self.store.knowledge_git,
                env=knowledge_index_env(self.index_file),
            )

    def _touched_names(self, touched: set[str]) -> set[str]:
        """The reported paths to commit: never those under the root's excluded names (kept as unstaged, for the
        next fork to remove)."""
        names = set()
        for path in touched:
            if not path or path.split("/", 1)[0] in _KNOWLEDGE_EXCLUDED_NAMES or "\0" in path:
                if path and self._unstaged is not None:
                    self._unstaged.add(path)
                continue
            names.add(path)
        return names

    def _plain_changes(self, names: set[str]) -> dict[str, tuple[str, str] | None] | None:
        """{path: (mode, blob id) or None (gone)} for the reported paths, the blobs written; None when git's own
        rules may apply (a FIFO, a nested repository, a `.gitignore` or `.gitattributes` on the way, a path
        beyond a link): then git stages them. A present folder stands for the files under it, a gone one for
        the last commit's files under it."""
        kdir, repo = self.knowledge_dir, self.store.knowledge_git
        paths: set[str] = set()
        for path in names:
            try:
                mode = os.lstat(kdir / path).st_mode
            except FileNotFoundError:
                paths.add(path)
                paths.update(self._committed_under(path))
                continue
            except OSError:
                return None
            if stat.S_ISDIR(mode):
                found = _plain_files(kdir, path)
                if found is None:
                    return None
                paths.update(found)
                paths.update(self._committed_under(path))  # files gone from it meanwhile
            else:
                paths.add(path)
        if not paths or not _no_git_rules(kdir, paths):
            return None if paths else {}
        changes: dict[str, tuple[str, str] | None] = {}
        try:
            for path in sorted(paths):
                parent, _, name = path.rpartition("/")
                try:
                    with safefs.open_dir(kdir, parent) as dfd:
                        changes[path] = _blob_of(repo, dfd, name)
                except FileNotFoundError:
                    changes[path] = None  # its folder is gone
        except (OSError, _NotPlain):  # safefs.UnsafePath is an OSError
            return None
        return changes

    def _committed_under(self, folder: str) -> list[str]:
        """The last commit's file paths under `folder` (from the kept trees)."""
        entries = self.store.load_tree(self._k_tree)
        parts = folder.split("/")
        for part in parts:
            got = entries.get(part)
            if got is None or got[0] != gittrees.TREE_MODE:
                return []
            entries = self.store.load_tree(got[1])
        out, todo = [], [(folder, entries)]
        while todo:
            prefix, ents = todo.pop()
            for name, (mode, oid, _raw) in ents.items():
                if mode == gittrees.TREE_MODE:
                    todo.append((f"{prefix}/{name}", self.store.load_tree(oid)))
                else:
                    out.append(f"{prefix}/{name}")
        return out

    def _add_paths(self, names: set[str]) -> str | None:
        """The general way: gone paths unstaged with `rm --cached -r --ignore-unmatch` (a literal pathspec that
        matches nothing, like the temp file every attempt record is written through, makes `git add` fail);
        present ones added with `add -A`, whose exit code 1 with only its "paths are ignored" message is no
        failure (an ignored path is never committed)."""
        repo, env = self.store.knowledge_git, knowledge_index_env(self.index_file)
        wt = ["--work-tree", str(self.knowledge_dir)]
        present, gone = [], []
        for p in sorted(names):
            (present if os.path.lexists(self.knowledge_dir / p) else gone).append(f":(literal){p}")
        spec = ["--pathspec-from-file=-", "--pathspec-file-nul"]
        if gone:
            proc = git(
                [*wt, "rm", "--cached", "-r", "-q", "--ignore-unmatch", *spec],
                git_dir=repo, env=env, input="\0".join(gone).encode("utf-8", "surrogateescape"), check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                return None
        if not present:
            return ""
        proc = git(
            [*wt, "add", "-A", "-v", *spec],
            git_dir=repo,
            env=env,
            input="\0".join(present).encode("utf-8", "surrogateescape"),
            check=False,
        )
        if proc.returncode == 0 or (proc.returncode == 1 and _only_ignored(proc.stderr)):
            return proc.stdout
        return None

    def hand_to(self, uid: int | None) -> None:
        """Give the workspace to the sandbox uid so the agent can write it (sandbox.give_to; sftree is root). The
        code tree in full (a new worktree per fork); the knowledge checkout, when it was handed to this uid
        before and what the host wrote since is known, by those paths alone (a walk of every file costs ~130 ms
        at 10k attempts, per turn), else in full. A chown raises an inotify event, so an entry already owned is
        left alone (sandbox.own)."""
        if uid is None:
            return
        give_to(self.root, uid, skip=KNOWLEDGE_DIR)
        kdir = self.knowledge_dir
        watch = self.attempt_view.watch if self.attempt_view is not None else None
        with watch.owners_only() if watch is not None else contextlib.nullcontext():
            # Read after owners_only has taken in what came before it (a host write in between is reported).
            now = watch.touched_now() if watch is not None else None
            if self._owner == uid and None not in (self._host_wrote, self._since, now):
                # The fork listed every file it wrote with the folders above them: those alone.
                _hand_paths(kdir, self._host_wrote, uid, walk=False)
                _hand_paths(kdir, (self._since | now) - self._host_wrote, uid, walk=True)
            elif kdir.is_dir():  # (give_to never walks through a link the agent may have left)
                give_to(kdir, uid)
        # Every entry is the uid's now but what is reported from here on (and `_since`, which keeps growing).
        self._owner, self._host_wrote = uid, set()

    def state(self, session: str | None) -> NodeState:
        """The workspace's current state (commits whatever is left uncommitted, so the state is complete).

        Also writes the refs that keep this edge's commits (one `update-ref --stdin` per repository).
        """
        code = (
            self.dirty() and self.commit_code("sftree: uncommitted work at the end of the edge")
        ) or self.head()
        knowledge = self.commit_knowledge("sftree: end of edge")
        self.store.keep_refs("code", {f"{self.edge_id}/{c[:12]}": c for c in self._code_commits})
        self.store.keep_refs("knowledge", {self.edge_id: knowledge})
        return NodeState(code, knowledge, session)

    def close(self) -> None:
        """Remove the worktree and the edge's folder (the commits stay in the store)."""
        if not self.closed:
            try:
                self.store.park_knowledge(self)
            except OSError as exc:  # a checkout that cannot be moved is simply not reused
                log.warning("edge %s: knowledge checkout not kept for reuse: %s", self.edge_id, exc)
            if self.attempt_view is not None:  # not parked
                attemptsmod.unregister(self.attempt_view)
                self.attempt_view.close()
                self.attempt_view = None
            self.store.remove_worktree(self.dir)
            self.closed = True


class _Moved(NamedTuple):
    """How a fork left a knowledge checkout (TreeStore._checkout_knowledge)."""

    trusted: bool  # no edge without the link fence has used it
    index_at: str | None  # the commit whose tree the index holds (None: unknown)
    unstaged: set[str] | None  # paths perhaps on disk but not in the index (None: unknown)
    owner: int | None = None  # the uid owning every entry but `wrote` (None: unknown)
    wrote: set[str] | None = None  # the paths the fork removed or wrote, with the folders above them


class _Parked(NamedTuple):
    """A closed edge's knowledge checkout kept for the next fork (TreeStore.park_knowledge)."""

    folder: Path  # holds `knowledge` and `knowledge.index`
    view: attemptsmod.AttemptView | None
    index_at: str | None  # the commit whose tree the index holds (None: unknown)
    unstaged: set[str] | None  # paths perhaps on disk but not in the index (None: unknown)
    at: str  # the commit the folder is at
    exact_at: str  # the commit the folder was exactly when its edge began
    since: set[str] | None  # paths touched since (None: unknown)
    trusted: bool  # every edge that used it had the link fence (EdgeWorkspace.links_fenced)
    owner: int | None  # the uid it was last handed to (EdgeWorkspace.hand_to)


LOOSE_PACK_KIB = 16 * 1024  # below this a tree's loose objects are left as they are
_MAX_SINCE = 4096  # more paths touched in one edge than this: its checkout is moved by git's way


def knowledge_index_env(index: Path) -> dict[str, str]:
    """An edge's own knowledge index, in format 4 (path prefixes compressed: about half the bytes to read,
    hash and write at every git call on a checkout of many attempt records)."""
    return {"GIT_INDEX_FILE": str(index), "GIT_INDEX_VERSION": "4"}


# Root names of KNOWLEDGE_EXCLUDES: never shared knowledge, never staged.
_KNOWLEDGE_EXCLUDED_NAMES = {p.strip("/") for p in KNOWLEDGE_EXCLUDES}


def _only_ignored(stderr: str) -> bool:
    """`git add`'s stderr holds nothing but its report of ignored paths (and their hints)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("hint:")]
    return (
        bool(lines)
        and lines[0].startswith("The following paths are ignored")
        and not any(ln.startswith(("fatal:", "error:")) for ln in lines)
    )


# Files that change what `git add` does with the paths below them (ignore and attribute rules, a nested
# repository).
_GIT_RULE_NAMES = (".gitignore", ".gitattributes", ".git")
MAX_BLOB = 64 << 20  # a larger file is left to git


class _NotPlain(Exception):
    """A path that is no regular file or link (or too large): git's own way."""


def _hand_paths(kdir: Path, paths, uid: int, *, walk: bool) -> None:
    """Give each of `paths` (relative to `kdir`) to `uid`, never following a link; with `walk`, a folder with
    all it holds (a folder made meanwhile may hold files its watch came too late to report)."""
    for rel in sorted(paths):
        parent, _, name = rel.rpartition("/")
        try:
            with safefs.open_dir(kdir, parent) as dfd:
                st = own(name, uid, dfd)
                if walk and stat.S_ISDIR(st.st_mode):
                    sub = os.open(name, safefs.DIR_FLAGS, dir_fd=dfd)  # never follows a link
                    try:
                        own_below(sub, uid)  # a loop: os.fwalk recurses before Python 3.12
                    finally:
                        os.close(sub)
        except (FileNotFoundError, NotADirectoryError, safefs.UnsafePath):
            continue  # gone, or beyond a link: nothing of the checkout to hand over


def _blob_of(repo: Path, dfd: int, name: str) -> tuple[str, str] | None:
    """(mode, id) of the file or link `name` in folder `dfd` as git would stage it, the blob written; None when
    it is gone. Never follows a link: a link's blob is its target, as git stores it."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != 40:  # ELOOP: a link
            raise
        return "120000", gittrees.write_loose(repo, "blob", os.fsencode(os.readlink(name, dir_fd=dfd)))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BLOB:
            raise _NotPlain(name)
        # Read no more than the limit: the file may still be growing (a process of the agent writing to it).
        chunks, left = [], MAX_BLOB + 1
        while left > 0 and (chunk := os.read(fd, min(1 << 20, left))):
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise _NotPlain(name)
    finally:
        os.close(fd)
    mode = "100755" if st.st_mode & stat.S_IXUSR else "100644"
    return mode, gittrees.write_loose(repo, "blob", b"".join(chunks))


def _no_git_rules(base: Path, paths) -> bool:
    """No folder on the way to any of `paths` holds a `.gitignore` or `.git`: then `update-index` stages what
    `add` would (the only other ignore rules are the root's excluded names, filtered by the caller)."""
    seen: set[str] = set()
    for p in paths:
        parts = p.split("/")
        if parts[-1] in _GIT_RULE_NAMES:
            return False
        for i in range(len(parts)):
            d = "/".join(parts[:i])
            if d in seen:
                continue
            seen.add(d)
            if any(os.path.lexists(base / d / n) for n in _GIT_RULE_NAMES):
                return False
    return True


def _plain_files(base: Path, rel: str, limit: int = 256) -> list[str] | None:
    """The files and links under folder `base/rel` (relative to `base`), never following a link; None when
    something else is there (a FIFO, a socket, a nested repository), there are more than `limit`, or it cannot
    be read."""
    out: list[str] = []
    todo = [rel]
    try:
        while todo:
            d = todo.pop()
            with os.scandir(base / d) as it:
                for e in it:
                    sub = f"{d}/{e.name}"
                    if e.name in _GIT_RULE_NAMES:
                        return None
                    if e.is_symlink() or e.is_file(follow_symlinks=False):
                        out.append(sub)
                    elif e.is_dir(follow_symlinks=False):
                        todo.append(sub)
                    else:
                        return None
                    if len(out) + len(todo) > limit:
                        return None
    except OSError:
        return None
    return out


_ADD_LINE = re.compile(r"^(?:add|remove) '(.*)'$", re.M)


def _attempt_names(add_verbose: str) -> list[str]:
    """File names directly under attempts/ in `git add -v` output (`add 'path'` / `remove 'path'` lines)."""
    out = []
    for m in _ADD_LINE.finditer(add_verbose):
        path = m.group(1)
        if path.startswith("attempts/"):
            out.append(path[len("attempts/") :])
    return out


class TreeStore:
    """The repositories of one tree under `<tree_dir>/store`, and the edge worktrees under `<tree_dir>/work`."""

    def __init__(self, tree_dir: str | os.PathLike, task_cfg: dict):
        self.tree_dir = Path(tree_dir).resolve()
        self.task_cfg = task_cfg
        self.store_dir = self.tree_dir / "store"
        self.code_git = self.store_dir / "code.git"
        self.knowledge_git = self.store_dir / "knowledge.git"
        self.work_dir = self.tree_dir / "work"
        self._lock = threading.Lock()
        # Knowledge checkouts of closed edges, with their attempt views (park_knowledge).
        self._parked: list[_Parked] = []
        self._parked_n = 0
        self._trees = gittrees.TreeCache()  # knowledge trees by id (gittrees.py)
        self.commit_trees: dict[str, str] = {}  # knowledge commit -> its tree (40 + 40 characters each)

    # ---- creation and resume -------------------------------------------------------------------------------
    @classmethod
    def create(cls, tree_dir, root_snapshot_dir, task_cfg: dict) -> tuple[TreeStore, NodeState]:
        """Seed the store from the root snapshot's `code/` and `shared/`; return it and the root's state.

        Idempotent: if the store already holds a root (a resumed run), that root is returned unchanged.
        """
        self = cls(tree_dir, task_cfg)
        root_dir = Path(root_snapshot_dir)
        if (self.code_git / "refs" / "sftree" / "root").exists():
            return self, self.root_state()
        code_src, shared_src = root_dir / "code", root_dir / "shared"
        if not code_src.is_dir():
            raise InputError(f"root snapshot {root_dir} has no code/ folder")
        self.store_dir.mkdir(parents=True, exist_ok=True)
        for repo in (self.code_git, self.knowledge_git):
            if repo.exists():
                shutil.rmtree(repo)  # a half-made store from a killed run
            git(["init", "-q", "--bare", str(repo)])
        self._write_excludes()
        code = self._import_dir(self.code_git, code_src, "root snapshot code")
        shared_src_dir = shared_src if shared_src.is_dir() else None
        knowledge = self._import_dir(self.knowledge_git, shared_src_dir, "root snapshot shared knowledge")
        # One pack instead of a loose object per attempt file: each knowledge commit's write-tree checks that
        # every blob exists, a lookup in a pack index rather than a file per object.
        git(["repack", "-a", "-d", "-q"], git_dir=self.knowledge_git)
        # The root ref is written last: its presence marks a complete store.
        git(["update-ref", "refs/sftree/root", knowledge], git_dir=self.knowledge_git)
        git(["update-ref", "refs/sftree/root", code], git_dir=self.code_git)
        self.work_dir.mkdir(exist_ok=True)
        log.info("store seeded from %s: code %s, knowledge %s", root_dir, code[:12], knowledge[:12])
        return self, NodeState(code, knowledge, None)

    @classmethod
    def open(cls, tree_dir, task_cfg: dict) -> TreeStore:
        """Open an existing store (resume)."""
        self = cls(tree_dir, task_cfg)
        if not (self.code_git / "refs" / "sftree" / "root").exists():
            raise InputError(f"no tree store under {self.store_dir} (create it first)")
        self._write_excludes()
        self.work_dir.mkdir(exist_ok=True)
        return self

    def _write_excludes(self) -> None:
        for repo, patterns in ((self.code_git, CODE_EXCLUDES), (self.knowledge_git, KNOWLEDGE_EXCLUDES)):
            (repo / "info").mkdir(exist_ok=True)
            (repo / "info" / "exclude").write_text("\n".join(patterns) + "\n")

    def root_state(self) -> NodeState:
        code = git(["rev-parse", "refs/sftree/root"], git_dir=self.code_git).stdout.strip()
        knowledge = git(["rev-parse", "refs/sftree/root"], git_dir=self.knowledge_git).stdout.strip()
        return NodeState(code, knowledge, None)

    def _import_dir(self, repo: Path, src: Path | None, what: str) -> str:
        """Commit the files of `src` (or nothing) as a root commit of `repo`, without touching `src`."""
        index = repo / "sftree-import.index"
        env = {"GIT_INDEX_FILE": str(index)}
        if src is not None:
            git(["--work-tree", str(src), "add", "-A", "--", "."], git_dir=repo, env=env)
        tree = git(["write-tree"], git_dir=repo, env=env).stdout.strip()
        index.unlink(missing_ok=True)
        return git(["commit-tree", tree, "-m", f"sftree: {what}"], git_dir=repo).stdout.strip()

    # ---- forks ---------------------------------------------------------------------------------------------
    def fork(self, state: NodeState, edge_id: str, *, links_fenced: bool = False) -> EdgeWorkspace:
        """A fresh workspace at `state`: worktree of the code commit, private knowledge checkout, session copy.
        `links_fenced`: every command of the edge will run where link(2) fails (EdgeWorkspace.links_fenced)."""
        from sftree.fileio import read_json

        edge_dir = self.work_dir / edge_id
        if edge_dir.exists():
            self.remove_worktree(edge_dir)  # a stale one from a killed run
        edge_dir.mkdir(parents=True)
        root = edge_dir / "code"
        with self._lock:
            git(["worktree", "add", "-q", "--detach", str(root), state.code_commit], git_dir=self.code_git)
            git(
                ["update-ref", f"refs/sftree/edges/{edge_id}", state.knowledge_commit],
                git_dir=self.knowledge_git,
            )
        # Read once, now, while the host alone has touched the workspace.
        admin = Path((root / ".git").read_text().strip().removeprefix("gitdir:").strip()).resolve()
        if not admin.is_relative_to(self.code_git.resolve() / "worktrees"):
            raise GitError(f"git worktree add made an unexpected admin folder {admin}")
        ws = EdgeWorkspace(self, edge_id, state, edge_dir, root, git_dir=admin, links_fenced=links_fenced)
        kdir = ws.knowledge_dir
        if kdir.is_symlink() or kdir.is_file():  # a code commit cannot carry .opencode, but be sure
            kdir.unlink()
        view, moved = self._checkout_knowledge(kdir, ws.index_file, state.knowledge_commit)
        for sub in ("notes", "skills", "attempts", "roles", "logs"):
            d = kdir / sub
            if d.is_symlink() or (d.exists() and not d.is_dir()):
                # A link (dangling or not) committed by an earlier edge: never followed, never fatal to forks.
                log.warning(
                    "fork %s: knowledge %s is a link or a file; replaced by an empty folder", edge_id, sub
                )
                d.unlink()
            d.mkdir(exist_ok=True)
        if view is None:
            view = attemptsmod.AttemptView(root, KnowledgeWatch(root, KNOWLEDGE_DIR))
        else:
            view.rebind(root)
        ws.attempt_view = view
        ws._exact_at, ws._trusted = state.knowledge_commit, moved.trusted
        ws._index_at, ws._unstaged = moved.index_at, moved.unstaged
        ws._owner, ws._host_wrote = moved.owner, moved.wrote
        if links_fenced and view.watch is not None and view.watch.exact():
            # The checkout is exactly the commit now (nothing of the agent runs yet), and only what the watch
            # reports from here on can make it differ (the fork's own writes are forgotten).
            ws._since = set()
        attemptsmod.register(view)
        if state.session:
            messages = read_json(self.tree_dir / state.session, "session file")
            if not isinstance(messages, list):
                raise InputError(f"session file {self.tree_dir / state.session}: expected a list of messages")
            ws.session = messages
            # The host's record of how that session's last turn ended (search/edge.py writes it with the session).
            record = self.tree_dir / "edges" / Path(state.session).stem / "last_turn.json"
            last = read_json(record, "last-turn record") if record.is_file() else None
            ws.last_turn = last if isinstance(last, dict) else None
        return ws

    # ---- knowledge checkouts: reused, so a fork writes what differs, not every attempt file ------------------
    @property
    def pool_dir(self) -> Path:
        return self.work_dir / ".knowledge-pool"  # under work/: cleanup_stale drops it with the worktrees

    def _checkout_knowledge(
        self, kdir: Path, index: Path, commit: str
    ) -> tuple[attemptsmod.AttemptView | None, _Moved]:
        """Make `kdir` exactly `commit`'s files. A parked checkout of an earlier edge is moved in and brought to
        `commit`: a trusted one by writing the tree diff and the paths its edge touched (kcheckout.py, no
        index), any other by git with `index` (the files that differ written, a stat sweep against hard links,
        the extras removed by name or by `clean`: docs/runtime.md). Else a full checkout. Returns the parked
        checkout's attempt view (its watch sees what was rewritten), or None, and the state of the index."""
        repo, env = self.knowledge_git, knowledge_index_env(index)
        wt = ["--work-tree", str(kdir)]
        taken = self._take_parked(commit)
        if taken is None:
            kdir.mkdir()
            git([*wt, "read-tree", commit], git_dir=repo, env=env)
            git([*wt, "checkout-index", "-a", "-f", "-u"], git_dir=repo, env=env)
            return None, _Moved(True, commit, set())
        view, index_at, unstaged = taken.view, taken.index_at, taken.unstaged
        os.rename(taken.folder / "knowledge", kdir)
        os.rename(taken.folder / "knowledge.index", index)
        shutil.rmtree(taken.folder, ignore_errors=True)
        # What changed since the last commit (after it, or while parked) is untracked or stale: to remove or
        # restore below. Taken before anything is written, so no change by anyone else is missed.
        pending = None
        if view is not None and view.watch is not None:
            view.rebind(kdir.parent)
            pending = view.watch.committed()
        if taken.trusted and taken.since is not None and pending is not None:
            try:
                done = kcheckout.move(
                    kdir,
                    repo,
                    self.commit_tree(taken.exact_at),
                    self.commit_tree(commit),
                    taken.since | pending,
                    self.load_tree,
                    git,
                )
                # The index still holds `index_at`'s tree; files it does not list may be on disk now.
                return view, _Moved(True, index_at, None, taken.owner, done.touched())
            except (OSError, GitError, ValueError, kcheckout.Unplannable) as exc:
                # Half done, perhaps: git's way below repairs it (rewritten files fail the stat sweep).
                log.info("knowledge checkout moved by git instead: %s", exc)
                pending = None
        leftover = None if unstaged is None or pending is None else unstaged | pending
        dropped = [] if index_at == commit else self._move_index(index, index_at, commit)
        if dropped is None:
            git([*wt, "read-tree", "--reset", "-u", commit], git_dir=repo, env=env)
        # Files that differ from the index: those the move above changed (their entries carry no stat data)
        # and those changed after the parked index last saw them (e.g. through a hard link): write them.
        # Paths as bytes, passed on as they are (a name may be no UTF-8).
        stale = git([*wt, "diff-files", "--name-only", "-z"], git_dir=repo, env=env, binary=True).stdout
        if stale:
            git(
                [*wt, "checkout-index", "-f", "-u", "-z", "--stdin"],
                git_dir=repo,
                env=env,
                input=stale,
            )
        # Untracked and ignored files (what the last agent added, OpenCode's housekeeping) go too: those the
        # watch reported and the move dropped from the index alone when every change since the checkout was
        # last clean is known, else a `git clean` of everything.
        if leftover is None or not self._clean_paths(kdir, index, leftover, dropped or []):
            git([*wt, "clean", "-f", "-f", "-d", "-x", "-q"], git_dir=repo, env=env)
        return view, _Moved(taken.trusted, commit, set())

    def commit_tree(self, commit: str) -> str:
        """A knowledge commit's tree id (kept for the commits made here; else asked of git once)."""
        tree = self.commit_trees.get(commit)
        if tree is None:
            tree = git(
                ["rev-parse", f"{check_sha(commit)}^{{tree}}"], git_dir=self.knowledge_git
            ).stdout.strip()
            self.commit_trees[commit] = tree
        return tree

    def _clean_paths(self, kdir: Path, index: Path, leftover: set[str], dropped: list[str]) -> bool:
        """Remove what of `leftover` (paths touched, never staged) is not in the index now, and the files of
        `dropped` (entries the move took out of the index) with their folders left empty. False when a path
        leads through a link or is a folder holding tracked files (or a folder where a dropped file was: the new
        commit may hold files under it), or git fails: then the caller cleans everything."""
        candidates = sorted(p for p in leftover if p)
        tracked: set[str] = set()
        if candidates:
            proc = git(
                ["--work-tree", str(kdir), "ls-files", "-z", "--", *(f":(literal){p}" for p in candidates)],
                git_dir=self.knowledge_git,
                env=knowledge_index_env(index),
                check=False,
                binary=True,
            )
            if proc.returncode != 0:
                return False
            tracked = {os.fsdecode(p) for p in proc.stdout.split(b"\0")}  # as the candidates: no UTF-8 kept
        try:
            for rel in [p for p in candidates if p not in tracked] + dropped:
                parent, _, name = rel.rpartition("/")
                # Gone already (or its folder): nothing to do.
                with contextlib.suppress(FileNotFoundError), safefs.open_dir(kdir, parent) as dfd:
                    if not stat.S_ISDIR(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                        os.unlink(name, dir_fd=dfd)
                    elif rel in dropped or any(t.startswith(rel + "/") for t in tracked):
                        return False  # a folder that may hold tracked files: git sorts it out
                    else:  # nothing in it is tracked (rmtree never follows a link inside)
                        shutil.rmtree(name, dir_fd=dfd)
                while parent:  # folders the removal left empty go, as `clean -d` would take them
                    parent, _, name = parent.rpartition("/")
                    with safefs.open_dir(kdir, parent) as dfd:
                        try:
                            os.rmdir(name, dir_fd=dfd)
                        except OSError:
                            break
        except (OSError, safefs.UnsafePath):
            return False
        return True

    def _move_index(self, index: Path, old: str | None, new: str, limit: int = 2000) -> list[str] | None:
        """Set the entries of `index` (at commit `old`) that differ in commit `new` from their tree diff, in
        work proportional to that diff where `read-tree --reset` walks all A entries. Entries set this way have
        no stat data, so the `diff-files` after it lists them and the fork writes them; paths gone from the
        index are left on disk for the caller to remove: returned. None (nothing done) when `old` is unknown or
        the diff is large or holds a submodule: then `read-tree` moves it."""
        if old is None:
            return None
        repo, env = self.knowledge_git, knowledge_index_env(index)
        out = git(
            ["diff-tree", "-r", "-z", "--raw", "--no-renames", old, new], git_dir=repo, binary=True
        ).stdout
        fields = [os.fsdecode(f) for f in out.split(b"\0")]  # a name that is no UTF-8 keeps its bytes
        lines, dropped = [], []
        for i in range(0, len(fields) - 1, 2):  # ":oldmode newmode oldsha newsha status", path
            meta, path = fields[i].split(" "), fields[i + 1]
            if len(meta) != 5 or "160000" in (meta[0].lstrip(":"), meta[1]):
                return None
            if meta[4] == "D":
                lines.append(f"0 {'0' * 40}\t{path}\0")
                dropped.append(path)
            else:
                lines.append(f"{meta[1]} {meta[3]}\t{path}\0")
            if len(lines) > limit:
                return None
        if lines:
            git(
                ["update-index", "-z", "--index-info"],
                git_dir=repo,
                env=env,
                input=os.fsencode("".join(lines)),
            )
        return dropped

    def park_knowledge(self, ws: EdgeWorkspace) -> None:
        """Keep a closing edge's knowledge checkout for the next fork (a real folder only: never a link),
        with its attempt view (the watch stays on the folder's inode through the moves)."""
        kdir, index, view = ws.knowledge_dir, ws.index_file, ws.attempt_view
        ws.attempt_view = None
        if view is not None:
            attemptsmod.unregister(view)
        if kdir.is_symlink() or not kdir.is_dir() or index.is_symlink() or not index.is_file():
            if view is not None:
                view.close()
            return
        with self._lock:
            self._parked_n += 1
            dest = self.pool_dir / f"k{self._parked_n}"
        try:
            dest.mkdir(parents=True)
            os.rename(kdir, dest / "knowledge")
            os.rename(index, dest / "knowledge.index")
        except OSError:
            if view is not None:
                view.close()
            raise
        with self._lock:
            self._parked.append(
                _Parked(
                    dest, view, ws._index_at, ws._unstaged, ws._k_head, ws._exact_at, ws._since,
                    ws._trusted and ws.links_fenced,
                    # Fork writes no handover gave (an edge that ended before its first turn) are root's:
                    # the owner is then unknown, and the next handover walks in full.
                    ws._owner if ws._host_wrote == set() else None,
                )
            )  # fmt: skip

    def _take_parked(self, commit: str) -> _Parked | None:
        """A parked checkout, preferring one at `commit` (the fewest files to write), else the newest."""
        with self._lock:
            for i in range(len(self._parked) - 1, -1, -1):
                if self._parked[i].at == commit:
                    return self._parked.pop(i)
            return self._parked.pop() if self._parked else None

    def load_tree(self, oid: str) -> gittrees.Entries:
        """A knowledge tree's entries (kept: the tree a commit writes is the next commit's starting point)."""
        entries = self._trees.get(check_sha(oid, "tree"))
        if entries is None:
            entries = gittrees.parse_tree(
                git(["cat-file", "tree", oid], git_dir=self.knowledge_git, binary=True).stdout
            )
            self._trees.put(oid, entries)
        return entries

    def store_tree(self, entries: gittrees.Entries, base: gittrees.Entries | None = None, changed=()) -> str:
        """Write a tree (spliced into the encoding of `base` when that is a large kept one: gittrees.splice)."""
        done = gittrees.splice(base, entries, changed) if base else None
        data, layout = done if done is not None else gittrees.encode_tree(entries, laid_out=True)
        oid = gittrees.write_loose(self.knowledge_git, "tree", data)
        self._trees.put(oid, gittrees.Tree(entries, layout))
        return oid

    def keep_refs(self, repo: str, refs: dict[str, str]) -> None:
        """Point `refs/sftree/edges/<name>` at each commit so `git gc` never drops it (one git call)."""
        if not refs:
            return
        git_dir = self.code_git if repo == "code" else self.knowledge_git
        lines = "".join(f"update refs/sftree/edges/{name} {sha}\n" for name, sha in refs.items())
        with self._lock:
            git(["update-ref", "--stdin"], git_dir=git_dir, input=lines.encode())

    def diff(self, repo: str, a: str, b: str) -> str:
        """`git diff a b` in the code or knowledge repository ("code" | "knowledge")."""
        git_dir = self.code_git if repo == "code" else self.knowledge_git
        return git(["diff", "--binary", a, b], git_dir=git_dir).stdout

    def remove_worktree(self, edge_dir: Path) -> None:
        # Deleting the folder and pruning is `git worktree remove --force` in one git call fewer.
        safefs.remove_all(edge_dir)  # (an agent may have nested folders thousands deep)
        with self._lock:
            git(["worktree", "prune"], git_dir=self.code_git, check=False)

    def cleanup_stale(self, keep: set[str]) -> None:
        """Remove the worktrees of edges not in `keep` (half-done edges of a killed run)."""
        if not self.work_dir.is_dir():
            return
        with self._lock:
            parked, self._parked = self._parked, []
        for p in parked:
            if p.view is not None:
                p.view.close()
        safefs.remove_all(self.pool_dir)
        for d in sorted(self.work_dir.iterdir()):
            if d.is_dir() and d.name not in keep:
                log.info("removing stale workspace %s", d)
                self.remove_worktree(d)

    def close(self) -> None:
        """Remove every worktree (the store keeps all commits)."""
        self.cleanup_stale(set())

    def pack_loose(self, min_kib: int = LOOSE_PACK_KIB) -> bool:
        """Pack the knowledge store's loose objects once they pass `min_kib`; True if it packed.

        Knowledge commits write their trees loose and uncompressed (runtime/gittrees.py), about 730 KB each at
        10k attempts, two per edge, and the store runs with gc.auto=0. Trees of one tree's edges differ in a few
        entries, so packed with deltas they take almost nothing (80 such trees: 80 MB loose, 1.5 MB packed in
        1.7 s). A failure only leaves the objects loose."""
        out = git(["count-objects", "-v"], git_dir=self.knowledge_git, check=False)
        sizes = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
        try:
            loose_kib = int(sizes.get("size", "0"))
        except ValueError:
            return False
        if out.returncode != 0 or loose_kib < min_kib:
            return False
        done = git(["repack", "-d", "-q"], git_dir=self.knowledge_git, check=False)
        if done.returncode != 0:
            log.warning(
                "knowledge store %s: repack failed, objects stay loose: %s", self.knowledge_git, done.stderr
            )
            return False
        log.info("knowledge store packed: %.1f MiB of loose objects", loose_kib / 1024)
        return True
