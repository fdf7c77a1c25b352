"""The store of one tree (`<tree_dir>/store`: code.git and knowledge.git, bare) and its edges' folders (`work/`).

The root commit of each repository is the root snapshot's `code/` and `shared/`, read by the host like any
workspace (folderreader.py: the Student's files are as untrusted as the Teacher's). Every commit gets a ref under
`refs/sftree/`. A fork (`fork`) writes a node's commits into a new edge folder (workspace.py); the attempt
records, a Coral run's largest part (one file per eval: 10k+ in a long run), come from a parked folder moved by
the difference of two trees when one is free (`park_attempts`), so a fork writes the few records that differ.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypeAlias

from sftree.errors import InputError
from sftree.runtime import checkout, safefs
from sftree.runtime.folderreader import FolderReader, Quota, Skip
from sftree.runtime.objects import ObjectDB, git, init_bare, tree_from_files
from sftree.runtime.repos import TreeRepos
from sftree.runtime.workspace import (
    EdgeWorkspace,
    NodeState,
    Paths,
    attempt_entries,
    attempts_difference,
    code_skip,
    fresh_dir,
    load_last_turn,
    load_session,
    make_folders,
    split_knowledge,
    write_code,
)
from sftree.settings import AgentSettings, schema_defaults

log = logging.getLogger(__name__)

StrPath: TypeAlias = str | os.PathLike[str]

LOOSE_PACK_KIB = 16 * 1024
ROOT_QUOTA = Quota(files=2_000_000, bytes=64 << 30, file_bytes=4 << 30, depth=256)  # the Student's own files


def _root_skip(rel: str, is_dir: bool) -> bool:
    return rel.rpartition("/")[2] == ".git"


class TreeStore(TreeRepos):
    """The repositories of one tree and the edge folders under `<tree_dir>/work` (repos.py: what a workspace
    writes into), seeded from a root snapshot and forked into edge workspaces."""

    def __init__(self, tree_dir: str | os.PathLike[str], task_cfg: Mapping[str, object]) -> None:
        super().__init__(tree_dir)
        self.task_cfg = task_cfg

    # ---- creation and resume -------------------------------------------------------------------------------
    @classmethod
    def create(
        cls, tree_dir: StrPath, root_snapshot_dir: StrPath, task_cfg: Mapping[str, object]
    ) -> tuple[TreeStore, NodeState]:
        """Seed the store from the root snapshot's `code/` and `shared/`; return it and the root's state.
        Idempotent: a store that already holds a root (a resumed run) is returned with that root unchanged."""
        self = cls(tree_dir, task_cfg)
        if (self.code_git / "refs" / "sftree" / "root").exists():
            return self, self.root_state()
        root_dir = Path(root_snapshot_dir)
        # The root's own top-level links, which select-roots made to the Student's snapshot (explore checked
        # them, docs/select_roots.md), are the only links the host follows; below them, none.
        code_src, shared_src = (Path(os.path.realpath(root_dir / name)) for name in ("code", "shared"))
        if not code_src.is_dir():
            raise InputError(f"root snapshot {root_dir} has no code/ folder")
        for repo in (self.code_git, self.knowledge_git):
            if repo.exists():
                safefs.remove_all(repo)  # a half-made store from a killed run
            init_bare(repo)
        code = self._import_dir(self.code, code_src, "root snapshot code", code_skip)
        shared = shared_src if shared_src.is_dir() else None
        knowledge = self._import_dir(self.knowledge, shared, "root snapshot shared knowledge", _root_skip)
        # One pack instead of a loose object per attempt record.
        git(self.knowledge_git, ["repack", "-a", "-d", "-q"])
        git(self.knowledge_git, ["update-ref", "refs/sftree/root", knowledge])
        git(self.code_git, ["update-ref", "refs/sftree/root", code])  # last: its presence marks a whole store
        self.work_dir.mkdir(exist_ok=True)
        log.info("store seeded from %s: code %s, knowledge %s", root_dir, code[:12], knowledge[:12])
        return self, NodeState(code, knowledge, None)

    @classmethod
    def open(cls, tree_dir: StrPath, task_cfg: Mapping[str, object]) -> TreeStore:
        self = cls(tree_dir, task_cfg)
        if not (self.code_git / "refs" / "sftree" / "root").exists():
            raise InputError(f"no tree store under {self.store_dir} (create it first)")
        self.work_dir.mkdir(exist_ok=True)
        return self

    def root_state(self) -> NodeState:
        code = git(self.code_git, ["rev-parse", "refs/sftree/root"]).strip()
        knowledge = git(self.knowledge_git, ["rev-parse", "refs/sftree/root"]).strip()
        return NodeState(code, knowledge, None)

    @staticmethod
    def _import_dir(db: ObjectDB, src: Path | None, what: str, skip: Skip) -> str:
        """A root commit of what `src` holds (read by the host without following links; `skip` left out)."""
        files = FolderReader(db, ROOT_QUOTA, skip).files(src)[0] if src is not None else {}
        return db.write_commit(tree_from_files(db, files), [], f"sftree: {what}")

    # ---- forks ---------------------------------------------------------------------------------------------
    def fork(
        self,
        state: NodeState,
        edge_id: str,
        *,
        agent_id: str = "agent-1",
        inside: str | None = None,
        uid: int | None = None,
        quota: Quota | None = None,
    ) -> EdgeWorkspace:
        """A new edge folder at `state` (workspace.py): the code and the knowledge written from their commits,
        the attempt records from a parked folder when one is free. `inside`: where the sandbox shows the run
        directory (None: no sandbox, the agent sees host paths). `uid` owns what the agent may change."""
        edge = self.work_dir / edge_id
        if edge.exists():
            self.remove_edge_dir(edge)  # a stale one from a killed run
        edge.mkdir(parents=True)
        separate = inside is not None
        run = edge / "run"
        paths = Paths(
            edge=edge,
            run=run,
            agent_id=agent_id,
            inside=inside if inside is not None else str(run),
            attempts=edge / "attempts" if separate else run / ".coral" / "public" / "attempts",
            host=edge / "host",
        )
        ws = EdgeWorkspace(
            store=self,
            edge_id=edge_id,
            parent=state,
            paths=paths,
            uid=uid,
            separate_attempts=separate,
            quota=quota or Quota.from_settings(schema_defaults(AgentSettings).quota),
        )
        try:
            make_folders(ws)
            write_code(ws)
            from sftree.runtime.agentrepo import chain

            ws.known = set(chain(self.code, state.code_commit))
            files, att_tree = split_knowledge(self.knowledge, state.knowledge_commit)
            checkout.write_files(self.knowledge, files, paths.public, uid=uid)
            ws.attempts_tree = att_tree
            ws._k_tree = self.knowledge.commit_tree(state.knowledge_commit)
            self._place_attempts(ws)
            ws.session = load_session(self.tree_dir, state.session)
            ws.last_turn = load_last_turn(self.tree_dir, state.session)
        except BaseException:
            self.remove_edge_dir(edge)
            raise
        return ws

    def _place_attempts(self, ws: EdgeWorkspace) -> None:
        """Fill the edge's attempts folder: a parked one moved by the tree difference, else written in full."""
        parked = self.take_parked() if ws.separate_attempts else None
        if parked is not None:
            folder, held = parked
            try:
                safefs.remove_all(ws.paths.attempts)
                os.rename(folder, ws.paths.attempts)
                gone, write = attempts_difference(self.knowledge, held, ws.attempts_tree)
                checkout.apply_difference(self.knowledge, ws.paths.attempts, gone, write)
                return
            except OSError as exc:
                log.warning("parked attempt records %s not reused: %s", folder, exc)
                safefs.remove_all(ws.paths.attempts)
                fresh_dir(ws.paths.attempts)
        checkout.write_files(
            self.knowledge, attempt_entries(self.knowledge, ws.attempts_tree), ws.paths.attempts
        )

    # ---- cleanup --------------------------------------------------------------------------------------------
    def cleanup_stale(self, keep: set[str]) -> None:
        """Remove the edge folders not in `keep` (half-done edges of a killed run) and the parked records."""
        if not self.work_dir.is_dir():
            return
        self.forget_parked()
        safefs.remove_all(self.pool_dir)
        for d in sorted(self.work_dir.iterdir()):
            if d.is_dir() and d.name not in keep:
                log.info("removing stale workspace %s", d)
                self.remove_edge_dir(d)

    def close(self) -> None:
        """Remove every edge folder (the store keeps all commits) and stop the object readers."""
        self.cleanup_stale(set())
        self.code.close()
        self.knowledge.close()

    def pack_loose(self, min_kib: int = LOOSE_PACK_KIB) -> bool:
        """Pack the knowledge store's loose objects once they pass `min_kib` (attempts/ trees of 10k entries are
        ~730 KB each loose; the trees of one search differ in a few entries and delta against each other)."""
        out = git(self.knowledge_git, ["count-objects", "-v"], check=False)
        sizes = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
        try:
            loose_kib = int(sizes.get("size", "0"))
        except ValueError:
            return False
        if loose_kib < min_kib:
            return False
        try:
            git(self.knowledge_git, ["repack", "-d", "-q"])
        except Exception as exc:  # noqa: BLE001 - a failed pack only leaves the objects loose
            log.warning("knowledge store %s: repack failed, objects stay loose: %s", self.knowledge_git, exc)
            return False
        log.info("knowledge store packed: %.1f MiB of loose objects", loose_kib / 1024)
        return True
