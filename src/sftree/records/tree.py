"""A tree's files (docs/architecture.md, "Explore: tree directory"): explore writes them, select-paths, export and the
report read them. Only this module opens them.

    tree.json        the finished tree, written once, atomically (schema: workflow/schemas/tree.schema.json)
    tree.live.json   while running: a snapshot of the tree, atomic, with the log generation it starts (`log_gen`)
    tree.log.jsonl   while running: one fsynced line per save after that snapshot

The documents are plain JSON objects here; `search/tree.py` turns them into its state (`Tree.to_dict`/`from_dict`)
and decides what a live save writes. `validate_tree` is the one check of a tree document: the schema plus the
links between nodes and edges a schema cannot express.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema

from sftree.config import SCHEMA_DIR
from sftree.errors import InputError
from sftree.fileio import read_json, write_json_atomic

log = logging.getLogger(__name__)

VERSION = 1
TREE_SCHEMA = SCHEMA_DIR / "tree.schema.json"
FINAL_NAME, LIVE_NAME, LOG_NAME = "tree.json", "tree.live.json", "tree.log.jsonl"


def final_path(tree_dir: str | os.PathLike) -> Path:
    """TREEDIR/tree.json."""
    return Path(tree_dir) / FINAL_NAME


def write_tree(path: str | os.PathLike, doc: dict) -> None:
    """Write atomically (readers and a rerun see the old or the new tree, never half of one)."""
    write_json_atomic(path, doc)


def read_tree(path: str | os.PathLike, source: str | None = None, check: bool = True) -> dict:
    """A tree document, checked (`validate_tree`; errors name `source`, default the path) unless `check` is False
    (a reader that wants whatever is there, such as the report over a half-made results folder)."""
    doc = read_json(path, "tree file")
    if check:
        validate_tree(doc, str(path) if source is None else source)
    return doc


# Leaf reasons that are normal whatever the path (1.8: the node exists, so every edge on its path passed hard
# prune or was kept by the layer-1 fallback / depth-2 exemption) and those that need a valid path (1.9 item 3).
LIMIT_REASONS = ("token_limit", "depth_limit")
NO_ROOM_REASONS = ("no_room", "tree_stopped")


def normal_leaf(leaf_reason: str | None, path_valid: bool, depth: int) -> bool:
    """The one definition of a normal leaf (seed 1.8, 1.9, 3.1), used by the stop rule and by path selection.

    Normal: the token or depth limit was reached, or the node had no room left (two failed expansions, or the
    tree stopped before it could grow) and its path is valid (no edge on root..node was kept only by the
    depth-2 exemption or the layer-1 fallback after failing). **Choice**: the root is never a leaf of a path
    (a root-to-leaf path needs at least one logical edge).
    """
    if depth < 1 or leaf_reason is None:
        return False
    if leaf_reason in LIMIT_REASONS:
        return True
    return leaf_reason in NO_ROOM_REASONS and path_valid


class LiveFiles:
    """`tree.live.json` and `tree.log.jsonl` of one tree folder: the bytes of the live state (what goes in them and
    how the log is replayed is `search.tree.LiveTree`'s). A torn last log line (kill -9 mid-write) is the save that
    never happened and is skipped; a bad line elsewhere is an InputError naming file and line."""

    def __init__(self, out_dir: str | os.PathLike):
        self.dir = Path(out_dir)
        self.snapshot_path, self.log_path = self.dir / LIVE_NAME, self.dir / LOG_NAME
        self._log = None

    def exists(self) -> bool:
        return self.snapshot_path.exists()

    def write_snapshot(self, doc: dict) -> None:
        """The snapshot (atomic), then an empty log for the lines after it."""
        write_json_atomic(self.snapshot_path, doc)
        if self._log is not None:
            self._log.close()
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - held open between saves

    @property
    def log_open(self) -> bool:
        return self._log is not None

    def append(self, entry: dict) -> None:
        """One log line, flushed and fsynced (a save is on disk when this returns)."""
        self._log.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self._log.flush()
        os.fsync(self._log.fileno())

    def read_snapshot(self) -> Any:
        return read_json(self.snapshot_path, "tree file")

    def log_entries(self) -> Iterator[tuple[int, dict]]:
        """(line number, entry) of each complete log line."""
        if not self.log_path.exists():
            return
        data = self.log_path.read_bytes()
        lines = data.split(b"\n")
        torn = lines.pop()  # after the last newline: empty, or a line cut by a kill
        for lineno, raw in enumerate(lines, 1):
            try:
                entry = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise InputError(f"{self.log_path} line {lineno}: not valid JSON ({exc})") from None
            if not isinstance(entry, dict):
                raise InputError(f"{self.log_path} line {lineno}: not a JSON object")
            yield lineno, entry
        if torn.strip():
            log.warning("%s: ignoring a torn last line (the save it held never completed)", self.log_path)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def remove(self) -> None:
        self.close()
        self.snapshot_path.unlink(missing_ok=True)
        self.log_path.unlink(missing_ok=True)


# --- validation ----------------------------------------------------------------------------------------

_schema_cache: dict | None = None


def tree_schema() -> dict:
    global _schema_cache
    if _schema_cache is None:
        with open(TREE_SCHEMA, encoding="utf-8") as fh:
            _schema_cache = json.load(fh)
    return _schema_cache


def validate_tree(obj: Any, source: str = "tree") -> None:
    """JSON Schema plus the links a schema cannot express; raises InputError naming the file and field."""
    validator = jsonschema.Draft202012Validator(tree_schema())
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        lines = [f"{'.'.join(str(p) for p in e.path) or '<top>'}: {e.message}" for e in errors[:10]]
        raise InputError(f"{source} is not a valid tree (schema):\n  " + "\n  ".join(lines))
    problems = _link_problems(obj)
    if problems:
        raise InputError(f"{source} is not a valid tree:\n  " + "\n  ".join(problems[:10]))


def _link_problems(obj: dict) -> list[str]:
    out: list[str] = []
    nodes = {n["id"]: n for n in obj["nodes"]}
    edges = {e["id"]: e for e in obj["edges"]}
    if len(nodes) != len(obj["nodes"]):
        out.append("nodes: duplicate node id")
    if len(edges) != len(obj["edges"]):
        out.append("edges: duplicate edge id")
    for i, n in enumerate(obj["nodes"]):
        where = f"nodes[{i}] ({n['id']})"
        if n["parent"] is None:
            if n["depth"] != 0 or n["edge"] is not None:
                out.append(f"{where}: a node without parent must be the root at depth 0")
            continue
        parent = nodes.get(n["parent"])
        if parent is None:
            out.append(f"{where}.parent: unknown node {n['parent']}")
        elif n["depth"] != parent["depth"] + 1:
            out.append(f"{where}.depth: {n['depth']} is not parent depth + 1")
        e = edges.get(n["edge"])
        if e is None or e["child"] != n["id"] or e["parent"] != n["parent"]:
            out.append(f"{where}.edge: {n['edge']} does not link {n['parent']} -> {n['id']}")
    roots = [n for n in obj["nodes"] if n["parent"] is None]
    if len(roots) != 1:
        out.append(f"nodes: expected exactly one root, found {len(roots)}")
    for i, e in enumerate(obj["edges"]):
        where = f"edges[{i}] ({e['id']})"
        if e["parent"] not in nodes:
            out.append(f"{where}.parent: unknown node {e['parent']}")
        if e["child"] is not None and e["child"] not in nodes:
            out.append(f"{where}.child: unknown node {e['child']}")
        if e["child"] is None and not e["pruned"]:
            out.append(f"{where}: an edge that made no node must be pruned")
    return out
