"""The two bare repositories of one tree (`<tree_dir>/store`: code.git and knowledge.git) and its edges' folders
(`<tree_dir>/work`): what an edge's workspace writes into (commits, refs, parked attempt records) and how its
folder goes.

Below both store.py (which seeds the repositories and forks workspaces) and workspace.py (an edge's world, which
commits into them), so a workspace never reaches back into the store that made it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sftree.runtime import safefs
from sftree.runtime.objects import ObjectDB, git


class TreeRepos:
    """The repositories of one tree and the edge folders under `<tree_dir>/work`."""

    def __init__(self, tree_dir: str | os.PathLike[str]) -> None:
        self.tree_dir = Path(tree_dir).resolve()
        self.store_dir = self.tree_dir / "store"
        self.code_git = self.store_dir / "code.git"
        self.knowledge_git = self.store_dir / "knowledge.git"
        self.work_dir = self.tree_dir / "work"
        self.code = ObjectDB(self.code_git)
        self.knowledge = ObjectDB(self.knowledge_git)
        self._lock = threading.Lock()
        self._parked: list[tuple[Path, str]] = []  # attempts folders free for reuse, with the tree they hold
        self._parked_n = 0

    # ---- parked attempt records ----------------------------------------------------------------------------
    @property
    def pool_dir(self) -> Path:
        return self.work_dir / ".attempts-pool"

    def park_attempts(self, folder: Path, held: str) -> None:
        """Keep an attempts folder only the host wrote (holding the attempts/ tree `held`) for the next fork."""
        self.pool_dir.mkdir(exist_ok=True)
        with self._lock:
            self._parked_n += 1
            dest = self.pool_dir / str(self._parked_n)
            os.rename(folder, dest)
            self._parked.append((dest, held))

    def take_parked(self) -> tuple[Path, str] | None:
        """A parked attempts folder and the tree it holds, taken for a fork; None when none is free."""
        with self._lock:
            return self._parked.pop() if self._parked else None

    def forget_parked(self) -> None:
        """Drop the parked folders (their pool is being removed)."""
        with self._lock:
            self._parked = []

    # ---- refs, diffs, folders ------------------------------------------------------------------------------
    def keep_refs(self, repo: str, refs: dict[str, str]) -> None:
        """Point `refs/sftree/edges/<name>` at each commit (one git call)."""
        if not refs:
            return
        git_dir = self.code_git if repo == "code" else self.knowledge_git
        lines = "".join(f"update refs/sftree/edges/{name} {sha}\n" for name, sha in refs.items())
        with self._lock:
            git(git_dir, ["update-ref", "--stdin"], input=lines.encode())

    def diff(self, repo: str, a: str, b: str) -> str:
        """`git diff --binary a b` of two commits of the code or knowledge repository (objects the host wrote)."""
        git_dir = self.code_git if repo == "code" else self.knowledge_git
        return git(git_dir, ["diff", "--no-ext-diff", "--no-textconv", "--binary", a, b])

    def remove_edge_dir(self, edge_dir: Path) -> None:
        safefs.remove_all(edge_dir)  # (an agent may have nested folders thousands deep)
