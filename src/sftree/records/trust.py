"""What says whether to trust the data: per root and selected path the score gain, snapshots skipped, sandbox mode.

Shared by the dataset card (`dataset/card.py`, through `dataset/merge.py`) and the report (`report/html.py`): what
the records say about trust, so both say the same. Pure functions over already-read documents, plus `read_task`
at the edge that reads one task's results folder through the records' own readers (stages.tsv's typed rows:
records/stages.py).

- gain = leaf score - root score, oriented so that positive is better (`records.scores.signed_gain`); a selected path
  whose gain is negative ends below its root and is flagged.
- pending snapshots (no `eval_ok`: the grader never wrote back) are skipped by select_roots, which writes their
  number into each chosen root's `metadata.json` (`snapshots_pending`); failed evals (`eval_ok` false) are rows
  of stages.tsv that cannot be roots.
- the sandbox mode is tree.json's `sandbox` field (`unknown` when the tree does not record it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sftree.records.paths import Paths, paths_path, read_paths
from sftree.records.root import META_NAME, read_root_meta
from sftree.records.scores import signed_gain
from sftree.records.stages import StageRow, read_stages, stages_path, task_tables
from sftree.records.tree import FINAL_NAME, Tree, read_tree


@dataclass
class PathTrust:
    rank: int
    leaf: str
    leaf_score: float | None
    gain: float | None

    @property
    def below_root(self) -> bool:
        return self.gain is not None and self.gain < 0


@dataclass
class RootTrust:
    task: str
    root: str
    direction: str | None
    root_score: float | None
    sandbox: str
    paths: list[PathTrust] = field(default_factory=list)  # selected paths, best rank first

    @property
    def best_gain(self) -> float | None:
        gains = [p.gain for p in self.paths if p.gain is not None]
        return max(gains) if gains else None

    @property
    def below_root(self) -> int:
        return sum(p.below_root for p in self.paths)


@dataclass
class TaskTrust:
    task: str
    snapshots: int = 0  # rows of stages.tsv (candidates)
    failed_evals: int = 0  # candidates with eval_ok false: never roots
    pending: int | None = None  # skipped before stages.tsv; None when select_roots did not record it
    roots: list[RootTrust] = field(default_factory=list)

    @property
    def sandboxes(self) -> list[str]:
        return sorted({r.sandbox for r in self.roots})


def root_trust(task: str, root: str, tree: Tree, paths: Paths | None) -> RootTrust:
    """The trust figures of one root: its tree, and its paths.json when select-paths has run (else the tree's own
    direction and root score, and no selected paths)."""
    direction = paths.direction if paths else tree.direction
    root_node = tree.root_node
    root_score = paths.root_score if paths else (root_node.score if root_node else None)
    out = RootTrust(task, root, direction, root_score, sandbox_mode(tree.sandbox))
    for p in paths.selected if paths else ():
        leaf = tree.node(p.leaf)
        leaf_score = leaf.score if leaf else None
        out.paths.append(
            PathTrust(p.rank, p.leaf, leaf_score, signed_gain(root_score, leaf_score, direction))
        )
    return out


def sandbox_mode(sandbox: object) -> str:
    """tree.json `sandbox` as a mode: the schema's string (bwrap | none), or the `mode` of an object holding a mode
    plus details (as a tree read unchecked may); `unknown` when the tree records none. The one place the field is
    read whatever its shape."""
    if isinstance(sandbox, dict):
        sandbox = sandbox.get("mode")
    return str(sandbox) if sandbox else "unknown"


def skipped_counts(task_dir: Path, stage_rows: list[StageRow]) -> tuple[int, int, int | None]:
    """(snapshots, failed evals, pending) of one task from its stages.tsv rows and a chosen root's metadata."""
    failed = sum(1 for r in stage_rows if not r.eval_ok)
    pending = None
    for meta_file in sorted(task_dir.glob(f"roots/*/{META_NAME}")):
        pending = read_root_meta(meta_file.parent).snapshots_pending
        break
    return len(stage_rows), failed, pending


def read_task(task_dir: Path) -> TaskTrust:
    """One task's trust summary from `results/<task>/` (stages.tsv, the chosen roots' tree.json and paths.json)."""
    tsv = stages_path(task_dir)
    rows = read_stages(tsv) if tsv.is_file() else []
    out = TaskTrust(task_dir.name)
    out.snapshots, out.failed_evals, out.pending = skipped_counts(task_dir, rows)
    chosen = {r.snapshot for r in rows if r.selected}
    for tf in sorted(task_dir.glob(f"trees/*/{FINAL_NAME}")):
        if rows and tf.parent.name not in chosen:
            continue  # a tree left over from an earlier config
        pf = paths_path(tf.parent)
        paths = read_paths(pf) if pf.is_file() else None
        out.roots.append(root_trust(task_dir.name, tf.parent.name, read_tree(tf, check=False), paths))
    return out


def read_results(results: Path, tasks: list[str] | None = None) -> list[TaskTrust]:
    names = tasks if tasks is not None else [p.parent.name for p in task_tables(results)]
    return [read_task(results / t) for t in names]
