"""A tree's files (docs/architecture.md, "Explore: tree directory"): explore writes them, select-paths, export and the
report read them. Only this module opens them.

    tree.json        the finished tree, written once, atomically (schema: workflow/schemas/tree.schema.json)
    tree.live.json   while running: a snapshot of the tree, atomic, with the log generation it starts (`log_gen`)
    tree.log.jsonl   while running: one fsynced line per save after that snapshot

The tree's records, `Node`, `Edge` (with its `Turn`s) and the Select breakdown, are declared once, here, frozen: the
search's live state (`search/tree.py`) holds these same records and replaces one when it changes
(`dataclasses.replace`), and readers get a frozen, typed `Tree` of them (`read_tree`; `Tree.from_doc` for a document
already in memory). Their fields are in the order tree.json writes them; tests/test_records_tree_vocabulary.py
checks tree.schema.json against them, and the words a tree is written in (turn ends, prune, leaf and stop reasons,
statuses), defined once here as `Literal`s with their tuples, against its enums. The writer takes a plain JSON
object: `search/tree.py` decides what a live save writes. `validate_tree` is the one check of a tree document: the schema plus the links
between nodes and edges a schema cannot express; `upgrade` is the one place an older document is brought to
`VERSION`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, TypedDict, get_args

import jsonschema

from sftree.config import SCHEMA_DIR
from sftree.errors import InputError
from sftree.fileio import disk_full_named, read_json, write_json_atomic

log = logging.getLogger(__name__)

VERSION = 1
TREE_SCHEMA = SCHEMA_DIR / "tree.schema.json"
FINAL_NAME, LIVE_NAME, LOG_NAME = "tree.json", "tree.live.json", "tree.log.jsonl"


# --- the vocabularies (each defined once; the schema's enums are checked against them) -----------------------

Direction = Literal["maximize", "minimize"]
TreeStatus = Literal["running", "finished"]
StopReason = Literal["good_leaves", "edge_budget", "frontier_empty"]
NodeStatus = Literal["active", "expanded", "leaf", "closed"]
LeafReason = Literal["token_limit", "depth_limit", "no_room", "tree_stopped"]
# why an edge failed the hard-prune test (`fail_reason`) or was pruned (`prune_reason`): the same words
PruneReason = Literal["no_score", "tool_error_rate", "edge_error", "teacher_error", "tampered"]
# how a turn ended: a backend's own ends, and `edge_error` (the fork, the runtime or the backend's session broke)
# (agents/turn_end.py refines a turn without an eval from its model calls: no_tool_call .. teacher_stalled)
TurnEnd = Literal[
    "eval",
    "step_limit",
    "timeout",
    "no_eval",
    "no_tool_call",
    "cut_call",
    "malformed_call",
    "unknown_tool",
    "teacher_error",
    "teacher_stalled",
    "context_overflow",
    "edge_error",
    "tampered",
]

DIRECTIONS: tuple[Direction, ...] = get_args(Direction)
TREE_STATUSES: tuple[TreeStatus, ...] = get_args(TreeStatus)
STOP_REASONS: tuple[StopReason, ...] = get_args(StopReason)
NODE_STATUSES: tuple[NodeStatus, ...] = get_args(NodeStatus)
LEAF_REASONS: tuple[LeafReason, ...] = get_args(LeafReason)
PRUNE_REASONS: tuple[PruneReason, ...] = get_args(PruneReason)
TURN_ENDS: tuple[TurnEnd, ...] = get_args(TurnEnd)

# A document as its JSON schema types it (checked on read, or built to be written): its fields are read as the
# schema says, unlike sftree.jsontypes.JSONObject (foreign JSON, each value narrowed before use).
SchemaDoc = dict[str, Any]


def final_path(tree_dir: str | os.PathLike[str]) -> Path:
    """TREEDIR/tree.json."""
    return Path(tree_dir) / FINAL_NAME


def write_tree(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> None:
    """Write atomically (readers and a rerun see the old or the new tree, never half of one)."""
    write_json_atomic(path, doc)


def read_tree(path: str | os.PathLike[str], source: str | None = None, check: bool = True) -> Tree:
    """The typed tree of a file, upgraded to `VERSION` and checked (`validate_tree`; errors name `source`, default
    the path) unless `check` is False (a reader that wants whatever is there, such as the report over a half-made
    results folder: a field that is missing reads as its default)."""
    return Tree.from_doc(read_tree_doc(path, source, check), str(path) if source is None else source)


def read_tree_doc(path: str | os.PathLike[str], source: str | None = None, check: bool = True) -> SchemaDoc:
    """The tree document itself, upgraded and checked as `read_tree` does (the search rebuilds its own mutable
    state from it: `search.tree.Tree.from_dict`)."""
    where = str(path) if source is None else source
    doc = upgrade(read_json(path, "tree file"), where)
    if check:
        validate_tree(doc, where)
    if not isinstance(doc, dict):
        raise InputError(f"{where}: a tree file holds a JSON object")
    return doc


def upgrade(doc: Any, source: str = "tree") -> Any:
    """An older tree document brought to `VERSION` (the one place that knows the older shapes). Version 1 is the
    first and only one, so there is nothing to upgrade yet; a document from a newer sftree is refused."""
    if isinstance(doc, dict) and isinstance(doc.get("version"), int) and doc["version"] > VERSION:
        raise InputError(f"{source}: tree version {doc['version']} is newer than this sftree's ({VERSION})")
    return doc


# --- the tree's records (what the search holds and readers get) ----------------------------------------------


class Select(TypedDict):
    """Select = Q + alpha*T for one candidate, with its parts (search/mcts.py `select_breakdowns`, section 1.3)."""

    node: str
    score_rank: float
    best_rank: float
    process: float
    Q: float
    T: float
    select: float


@dataclass(frozen=True)
class Turn:
    """One rollout turn of an edge (tree.json `edges[].turns[]`; search/result.py's `TurnResult` writes it)."""

    turn: int
    score: float | None
    eval_status: str | None = None  # Coral's: improved|baseline|regressed|crashed|timeout|nothing_to_commit
    commit: str | None = None
    steps: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    knowledge: bool = False
    tokens: int = 0
    ended: TurnEnd | None = None
    feedback: str = ""
    eval_number: int | None = None
    error: str | None = None
    compacted: bool = False

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> Turn:
        return cls(
            turn=d.get("turn", 0),
            score=d.get("score"),
            eval_status=d.get("eval_status"),
            commit=d.get("commit"),
            steps=d.get("steps", 0),
            tool_calls=d.get("tool_calls", 0),
            tool_errors=d.get("tool_errors", 0),
            knowledge=d.get("knowledge", False),
            tokens=d.get("tokens", 0),
            ended=d.get("ended"),
            feedback=d.get("feedback", ""),
            eval_number=d.get("eval_number"),
            error=d.get("error"),
            compacted=d.get("compacted", False),
        )


@dataclass(frozen=True)
class Node:
    """A node of the tree (tree.json `nodes[]`). `state` is the fork point as written (code and knowledge commits,
    the session file, the host's Coral counters). `score` is raw (None when the exempt edge that made it had no
    numeric score), `path_best_score` the raw best on root..node, `max_token_total` the session's context length
    (root: 0, a fresh session); `path_valid`: no failed (exempt-kept) edge on root..node."""

    id: str
    parent: str | None
    edge: str | None
    depth: int
    score: float | None = None
    path_best_score: float | None = None
    max_token_total: int = 0
    valid_children: int = 0
    failed_expansions: int = 0
    status: NodeStatus | None = "active"  # (None: a node read from a partial tree without one)
    leaf_reason: LeafReason | None = None
    path_valid: bool = True
    state: SchemaDoc | None = None
    eval_count: int | None = None

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> Node:
        return cls(
            id=d["id"],
            parent=d.get("parent"),
            edge=d.get("edge"),
            depth=d.get("depth", 0),
            score=d.get("score"),
            path_best_score=d.get("path_best_score"),
            max_token_total=d.get("max_token_total", 0),
            valid_children=d.get("valid_children", 0),
            failed_expansions=d.get("failed_expansions", 0),
            status=d.get("status"),
            leaf_reason=d.get("leaf_reason"),
            path_valid=d.get("path_valid", True),
            state=d.get("state"),
            eval_count=d.get("eval_count"),
        )


@dataclass(frozen=True)
class Edge:
    """An edge (tree.json `edges[]`): one dispatch from `parent`, its turns, its measures and, when it made one,
    its `child`. The soft-score parts are None for an edge that made no node."""

    id: str
    parent: str
    depth: int = 0  # the depth of the child it would make
    attempt: int = 1
    slot: int | None = None
    exempt: bool = False
    select: SchemaDoc | None = None  # the Select breakdown logged when the edge was dispatched (a `Select`)
    child: str | None = None
    pruned: bool = False
    prune_reason: PruneReason | None = None
    failed: bool = False  # failed the hard-prune test (kept anyway when exempt)
    fail_reason: PruneReason | None = None
    turns: tuple[Turn, ...] = ()
    score: float | None = None
    steps: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_error_rate: float = 0.0
    tokens: int = 0
    knowledge: bool = False
    regressed_rate: float | None = None
    outcome: float | None = None
    cleanliness: float | None = None
    knowledge_score: float | None = None
    regression_stability: float | None = None
    soft: float | None = None
    transcript: str | None = None
    code_diff: str | None = None
    knowledge_diff: str | None = None
    error: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    wall_s: float | None = None

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> Edge:
        return cls(
            id=d["id"],
            parent=d.get("parent", ""),
            child=d.get("child"),
            depth=d.get("depth", 0),
            attempt=d.get("attempt", 1),
            slot=d.get("slot"),
            exempt=d.get("exempt", False),
            pruned=d.get("pruned", False),
            prune_reason=d.get("prune_reason"),
            failed=d.get("failed", False),
            fail_reason=d.get("fail_reason"),
            turns=tuple(Turn.from_doc(t) for t in d.get("turns") or ()),
            score=d.get("score"),
            steps=d.get("steps", 0),
            tool_calls=d.get("tool_calls", 0),
            tool_errors=d.get("tool_errors", 0),
            tool_error_rate=d.get("tool_error_rate", 0.0),
            tokens=d.get("tokens", 0),
            knowledge=d.get("knowledge", False),
            regressed_rate=d.get("regressed_rate"),
            outcome=d.get("outcome"),
            cleanliness=d.get("cleanliness"),
            knowledge_score=d.get("knowledge_score"),
            regression_stability=d.get("regression_stability"),
            soft=d.get("soft"),
            transcript=d.get("transcript"),
            code_diff=d.get("code_diff"),
            knowledge_diff=d.get("knowledge_diff"),
            error=d.get("error"),
            select=d.get("select"),
            started_at=d.get("started_at"),
            finished_at=d.get("finished_at"),
            wall_s=d.get("wall_s"),
        )


@dataclass(frozen=True)
class Tree:
    """A finished (or, read unchecked, a partial) tree as its readers see it: select-paths, export, the report
    and the trust figures. Open-ended records (`params`, `counters`, `teacher`, `coral`, `teacher_vocab`,
    `in_flight`) stay the JSON objects they are written as."""

    version: int
    task: str | None
    root: str | None
    direction: Direction | None
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    params: SchemaDoc | None = None
    status: TreeStatus | None = None
    stop_reason: StopReason | None = None
    counters: SchemaDoc | None = None
    next_edge: int | None = None
    in_flight: tuple[SchemaDoc, ...] = ()
    created_at: str | None = None
    updated_at: str | None = None
    sandbox: str | None = None
    teacher: SchemaDoc | None = None
    backend: str | None = None
    coral: SchemaDoc | None = None
    teacher_vocab: SchemaDoc | None = None  # {"sha256", "size", "source"}: the Teacher's, when known

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], source: str = "tree") -> Tree:
        """The typed form of a tree document (checked or not: a missing field reads as its default; the node
        and edge lists and their ids must be there)."""
        try:
            nodes = tuple(Node.from_doc(n) for n in _items(doc, "nodes"))
            edges = tuple(Edge.from_doc(e) for e in _items(doc, "edges"))
        except (KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"{source}: tree has no usable `nodes`/`edges` lists ({exc})") from None
        return cls(
            version=doc.get("version", VERSION),
            task=doc.get("task"),
            root=doc.get("root"),
            direction=doc.get("direction"),
            nodes=nodes,
            edges=edges,
            params=doc.get("params"),
            status=doc.get("status"),
            stop_reason=doc.get("stop_reason"),
            counters=doc.get("counters"),
            next_edge=doc.get("next_edge"),
            in_flight=tuple(doc.get("in_flight") or ()),
            created_at=doc.get("created_at"),
            updated_at=doc.get("updated_at"),
            sandbox=doc.get("sandbox"),
            teacher=doc.get("teacher"),
            backend=doc.get("backend"),
            coral=doc.get("coral"),
            teacher_vocab=doc.get("teacher_vocab"),
        )

    def node(self, node_id: str | None) -> Node | None:
        """The node with this id, or None."""
        return next((n for n in self.nodes if n.id == node_id), None)

    @property
    def root_node(self) -> Node | None:
        """The node without a parent (the first one, in a tree read unchecked)."""
        return next((n for n in self.nodes if n.parent is None), None)


def _items(doc: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """A list of objects (absent: none, as in a partial tree read unchecked)."""
    items = doc.get(key, [])
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise TypeError(f"`{key}` is not a list of objects")
    return items


# Leaf reasons that are normal whatever the path (1.8: the node exists, so every edge on its path passed hard
# prune or was kept by the layer-1 fallback / depth-2 exemption) and those that need a valid path (1.9 item 3).
LIMIT_REASONS: tuple[LeafReason, ...] = ("token_limit", "depth_limit")
NO_ROOM_REASONS: tuple[LeafReason, ...] = ("no_room", "tree_stopped")


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

    def __init__(self, out_dir: str | os.PathLike[str]):
        self.dir = Path(out_dir)
        self.snapshot_path, self.log_path = self.dir / LIVE_NAME, self.dir / LOG_NAME
        self._log: IO[bytes] | None = None

    def exists(self) -> bool:
        return self.snapshot_path.exists()

    def write_snapshot(self, doc: Mapping[str, Any]) -> None:
        """The snapshot (atomic), then an empty log for the lines after it."""
        write_json_atomic(self.snapshot_path, doc)
        if self._log is not None:
            self._log.close()
        with disk_full_named(self.log_path):
            self._log = open(self.log_path, "wb", buffering=0)  # noqa: SIM115 - held open between saves

    @property
    def log_open(self) -> bool:
        return self._log is not None

    def append(self, entry: Mapping[str, Any]) -> None:
        """One log line, flushed and fsynced (a save is on disk when this returns)."""
        if self._log is None:
            raise RuntimeError(f"{self.log_path}: a log line before the snapshot it follows")
        line = (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")
        fd = self._log.fileno()
        end = os.lseek(fd, 0, os.SEEK_END)
        with disk_full_named(self.log_path):
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except (
                OSError
            ):  # a full disk: the part written goes, the save did not happen (no torn line stays)
                os.ftruncate(fd, end)
                raise

    def read_snapshot(self) -> Any:
        return read_json(self.snapshot_path, "tree file")

    def log_entries(self) -> Iterator[tuple[int, SchemaDoc]]:
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

_schema_cache: SchemaDoc | None = None


def tree_schema() -> SchemaDoc:
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


def _link_problems(obj: SchemaDoc) -> list[str]:
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
