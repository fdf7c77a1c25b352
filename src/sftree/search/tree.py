"""Tree state of one root's search: flat node and edge lists (docs/architecture.md, tree.json), load/save,
validation. No policy lives here; `search/mcts.py` decides what to expand and how a finished edge changes the tree.

The nodes and edges are the tree's frozen records (records/tree.py `Node`, `Edge`, declared once there): a change
replaces the record (`Tree.put_node`, `Tree.put_edge` with a `dataclasses.replace`d copy, as TreeQuest replaces
its frozen trials), and the tree notes which ones changed, so a live save appends only those (`LiveTree.save`).
"""

from __future__ import annotations

import datetime as _dt
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from sftree.errors import InputError
from sftree.jsontypes import JSONObject
from sftree.records.tree import (
    VERSION,
    Edge,
    LiveFiles,
    Node,
    SchemaDoc,
    StopReason,
    TreeStatus,
    Turn,
    normal_leaf,
    read_tree_doc,
    validate_tree,
    write_tree,
)
from sftree.settings import SearchSettings

_FIELDS = {cls: frozenset(f.name for f in fields(cls)) for cls in (Node, Edge, Turn)}


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


# What a tree written before these params were recorded ran with (params_of).
OLDER_TREE_PARAMS: dict[str, object] = {"seed": 0, "keep_workspaces": False}


def params_of(params: Mapping[str, object]) -> SearchSettings:
    """The config's `search:` a tree ran with, from its `params` (tree.json: written as `asdict` of the settings).
    A tree written before `seed` and `keep_workspaces` were recorded ran with seed 0 and kept no workspaces
    (tree.schema.json: optional)."""
    names = {f.name for f in fields(SearchSettings)}
    # (tree.schema.json checked the values' types)
    given: dict[str, Any] = {k: v for k, v in params.items() if k in names}
    return SearchSettings(**{**OLDER_TREE_PARAMS, **given})


@dataclass
class Tree:
    task: str
    root: str
    direction: str
    params: SearchSettings  # config `search:`, as tree.json `params` records it
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    status: TreeStatus = "running"
    stop_reason: StopReason | None = None
    next_edge: int = 1  # a resumed run takes the ids above its last finished edge again (explore._resume)
    in_flight: list[JSONObject] = field(
        default_factory=list
    )  # dispatches started, not finished (`Dispatch.to_dict`)
    created_at: str = field(default_factory=now_iso)
    updated_at: str | None = None
    version: int = VERSION
    sandbox: str | None = None  # how the agent and graded code were confined: bwrap | none (docs/security.md)
    teacher: Mapping[str, object] | None = None  # the Teacher client's counters and incidents (its `report`)
    backend: str | None = None  # the agent backend that made the edges: native | opencode | mixed (resumed)
    coral: JSONObject | None = (
        None  # the Teacher's world: {"mode": coral | stand-in, ...} (sftree.world.World.describe)
    )
    # the Teacher's vocabulary: {"sha256", "size", "source"} (teacher/vocabulary.py), None when not known
    teacher_vocab: JSONObject | None = None
    _index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)  # node id -> its place
    _edge_index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    # the nodes and edges added or replaced since the last live save (LiveTree.save appends those)
    _changed_nodes: set[str] = field(default_factory=set, repr=False, compare=False)
    _changed_edges: set[str] = field(default_factory=set, repr=False, compare=False)

    # --- construction and lookup -------------------------------------------------------------------

    @classmethod
    def new(
        cls,
        task: str,
        root: str,
        direction: str,
        params: SearchSettings,
        root_score: float | None,
        root_state: JSONObject | None = None,
        eval_count: int | None = None,
    ) -> Tree:
        tree = cls(task=task, root=root, direction=direction, params=params)
        tree.add_node(
            Node(
                id="n0",
                parent=None,
                edge=None,
                depth=0,
                score=root_score,
                path_best_score=root_score,
                max_token_total=0,
                state=root_state,
                eval_count=eval_count,
            )
        )
        return tree

    def add_node(self, node: Node) -> Node:
        self._index[node.id] = len(self.nodes)
        self.nodes.append(node)
        self._changed_nodes.add(node.id)
        return node

    def add_edge(self, edge: Edge) -> Edge:
        self._edge_index[edge.id] = len(self.edges)
        self.edges.append(edge)
        self._changed_edges.add(edge.id)
        return edge

    def put_node(self, node: Node) -> Node:
        """`node` in place of the node with its id (a changed copy: `dataclasses.replace`)."""
        self.nodes[self._index[node.id]] = node
        self._changed_nodes.add(node.id)
        return node

    def put_edge(self, edge: Edge) -> Edge:
        """`edge` in place of the edge with its id (a changed copy: `dataclasses.replace`)."""
        self.edges[self._edge_index[edge.id]] = edge
        self._changed_edges.add(edge.id)
        return edge

    def node(self, node_id: str) -> Node:
        return self.nodes[self._index[node_id]]

    def edge(self, edge_id: str) -> Edge:
        return self.edges[self._edge_index[edge_id]]

    def take_changes(self) -> tuple[list[Node], list[Edge]]:
        """The nodes and edges added or replaced since the last call, in tree order; none are noted after it."""
        nodes = [n for n in self.nodes if n.id in self._changed_nodes] if self._changed_nodes else []
        edges = [e for e in self.edges if e.id in self._changed_edges] if self._changed_edges else []
        self._changed_nodes, self._changed_edges = set(), set()
        return nodes, edges

    @property
    def root_node(self) -> Node:
        return self.nodes[0]

    def new_node_id(self) -> str:
        return f"n{len(self.nodes)}"

    def take_edge_id(self) -> str:
        eid = f"e{self.next_edge}"
        self.next_edge += 1
        return eid

    def children(self, node_id: str) -> list[Node]:
        return [n for n in self.nodes if n.parent == node_id]

    def path(self, node_id: str) -> list[Node]:
        """Nodes root..node_id."""
        out = []
        cur: str | None = node_id
        while cur is not None:
            n = self.node(cur)
            out.append(n)
            cur = n.parent
        return out[::-1]

    def path_edges(self, node_id: str) -> list[Edge]:
        return [self.edge(n.edge) for n in self.path(node_id) if n.edge is not None]

    # --- derived numbers ---------------------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        return {
            "edges": len(self.edges),
            "valid_edges": sum(1 for e in self.edges if e.child is not None),
            "pruned_edges": sum(1 for e in self.edges if e.pruned),
            "failed_edges": sum(1 for e in self.edges if e.failed),
            "good_leaves": sum(1 for n in self.nodes if is_good_leaf(n)),
            "leaves": sum(1 for n in self.nodes if n.status == "leaf"),
            "in_flight": len(self.in_flight),
        }

    # --- serialization -----------------------------------------------------------------------------

    def to_dict(self) -> JSONObject:
        return {
            "version": self.version,
            "task": self.task,
            "root": self.root,
            "direction": self.direction,
            "params": asdict(self.params),
            "status": self.status,
            "stop_reason": self.stop_reason,
            "counters": self.counters(),
            "next_edge": self.next_edge,
            "in_flight": list(self.in_flight),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "sandbox": self.sandbox,
            "teacher": self.teacher,
            "backend": self.backend,
            "coral": self.coral,
            "teacher_vocab": self.teacher_vocab,
            "nodes": [asdict(n) for n in self.nodes],
            "edges": [edge_doc(e) for e in self.edges],
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, object], source: str = "tree") -> Tree:
        validate_tree(doc, source)
        obj: dict[str, Any] = dict(doc)  # checked against tree.schema.json: the values have the fields' types
        tree = cls(
            task=obj["task"],
            root=obj["root"],
            direction=obj["direction"],
            params=params_of(obj["params"]),
            status=obj["status"],
            stop_reason=obj.get("stop_reason"),
            next_edge=obj.get("next_edge", len(obj["edges"]) + 1),
            in_flight=list(obj.get("in_flight", [])),
            created_at=obj.get("created_at") or now_iso(),
            updated_at=obj.get("updated_at"),
            version=obj["version"],
            sandbox=obj.get("sandbox"),
            teacher=obj.get("teacher"),
            backend=obj.get("backend"),
            coral=obj.get("coral"),
            teacher_vocab=obj.get("teacher_vocab"),
        )
        for n in obj["nodes"]:
            tree.add_node(Node(**_fields_of(Node, n)))
        for e in obj["edges"]:
            tree.add_edge(Edge(**_edge_fields(e)))
        return tree


def _fields_of(cls: type[Node] | type[Edge] | type[Turn], row: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `cls` a tree document's (or a log line's) object gives (checked by the schema: of their
    types); a missing required one makes the constructor raise."""
    names = _FIELDS[cls]
    return {k: v for k, v in row.items() if k in names}


def _edge_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    d = _fields_of(Edge, row)
    if "turns" in d:
        d["turns"] = tuple(Turn(**_fields_of(Turn, t)) for t in d["turns"])
    return d


def edge_doc(edge: Edge) -> SchemaDoc:
    """An edge as tree.json holds it (its turns a JSON array)."""
    doc = asdict(edge)
    doc["turns"] = [asdict(t) for t in edge.turns]
    return doc


def is_good_leaf(node: Node) -> bool:
    """A node that counts toward `target_good_leaves` (1.9 `good_leaf_count`): a normal leaf."""
    return node.status == "leaf" and normal_leaf(node.leaf_reason, node.path_valid, node.depth)


# --- files ---------------------------------------------------------------------------------------------


def save(tree: Tree, path: str | Path) -> None:
    """Write atomically (readers and a rerun see the old or the new tree, never half of one)."""
    tree.updated_at = now_iso()
    write_tree(path, tree.to_dict())


def load(path: str | Path) -> Tree:
    return Tree.from_dict(read_tree_doc(path, check=False), source=str(path))  # from_dict checks it


# --- the live tree: a snapshot plus an append-only log ---------------------------------------------------

SNAPSHOT_MIN = 64  # log lines before a snapshot is due (at least; see LiveTree)
# The tree's own fields a log line carries: those that change while it grows. `sandbox`, `backend`, `coral` and
# `teacher_vocab` are set once per run, before its first save, which is always a snapshot (a new LiveTree has no
# log open), so the snapshot carries them.
_HEADER = ("status", "stop_reason", "next_edge", "in_flight", "updated_at", "teacher")


class LiveTree:
    """The running tree on disk: `tree.live.json` (a snapshot) and `tree.log.jsonl` (one line per `save`).

    Rewriting the whole tree after every edge costs O(tree) per edge, so `save` appends only the nodes and edges
    that changed since the last save, with the tree's own fields, and fsyncs that one line. A new snapshot is
    written when the log holds as many lines as the tree has edges (at least SNAPSHOT_MIN): amortised O(1) per
    edge, and loading reads O(tree). Each snapshot names a fresh log generation and each line carries it, so lines
    written before the newest snapshot are never replayed onto it (a kill between the snapshot and the log's
    truncation loses nothing). Replaying is upserting whole objects. A torn last line (kill -9 mid-write) is the
    save that never happened and is skipped; a bad line elsewhere is an InputError naming file and line.
    """

    def __init__(self, out_dir: str | Path, snapshot_min: int = SNAPSHOT_MIN) -> None:
        self.files = LiveFiles(out_dir)
        self.dir, self.snapshot_path, self.log_path = (
            self.files.dir,
            self.files.snapshot_path,
            self.files.log_path,
        )
        self.snapshot_min = snapshot_min
        self._gen: str | None = None
        self._lines = 0

    def exists(self) -> bool:
        return self.files.exists()

    def save(self, tree: Tree) -> None:
        tree.updated_at = now_iso()
        if not self.files.log_open or self._lines >= max(self.snapshot_min, len(tree.edges)):
            self.snapshot(tree)
            return
        head: JSONObject = {"status": tree.status, "stop_reason": tree.stop_reason, "next_edge": tree.next_edge,
                     "in_flight": tree.in_flight, "updated_at": tree.updated_at, "teacher": tree.teacher,
                     "params": asdict(tree.params)}  # fmt: skip
        nodes, edges = tree.take_changes()
        entry: JSONObject = {
            "gen": self._gen,
            "tree": head,
            "nodes": [asdict(n) for n in nodes],
            "edges": [edge_doc(e) for e in edges],
        }
        self.files.append(entry)
        self._lines += 1

    def snapshot(self, tree: Tree) -> None:
        self._gen = uuid.uuid4().hex
        self.files.write_snapshot({**tree.to_dict(), "log_gen": self._gen})
        self._lines = 0
        tree.take_changes()  # all of them are in the snapshot

    def load(self) -> Tree:
        """The tree as of the last save: the snapshot with the log replayed, validated as a whole."""
        snap = self.files.read_snapshot()
        tree = Tree.from_dict(snap, source=str(self.snapshot_path))
        gen = snap.get("log_gen") if isinstance(snap, dict) else None
        replayed = 0
        for lineno, entry in self.files.log_entries():
            if gen is None or entry.get("gen") != gen:
                continue  # written before this snapshot (already in it)
            try:
                _apply(tree, entry)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise InputError(f"{self.log_path} line {lineno}: not a tree log entry ({exc})") from None
            replayed += 1
        if replayed:
            validate_tree(tree.to_dict(), f"{self.snapshot_path} + {replayed} line(s) of {self.log_path}")
        return tree

    def close(self) -> None:
        self.files.close()

    def remove(self) -> None:
        """Drop the live state (the tree was written out as tree.json)."""
        self.files.remove()


def _apply(tree: Tree, line: Mapping[str, object]) -> None:
    entry: dict[str, Any] = dict(line)  # a line LiveTree.save wrote; one that is not raises (load names it)
    head = entry["tree"]
    for k in _HEADER:
        if k in head or k != "teacher":  # lines written before `teacher` existed lack it
            setattr(tree, k, head[k])
    tree.params = params_of(head["params"])
    # A new node or edge is added, a known one takes the line's fields (the whole tree is checked after).
    for row in entry["nodes"]:
        d = _fields_of(Node, row)
        if d["id"] in tree._index:
            tree.put_node(replace(tree.node(d["id"]), **d))
        else:
            tree.add_node(Node(**d))
    for row in entry["edges"]:
        d = _edge_fields(row)
        if d["id"] in tree._edge_index:
            tree.put_edge(replace(tree.edge(d["id"]), **d))
        else:
            tree.add_edge(Edge(**d))
