"""Section 3: rank a tree's root-to-leaf paths by PathScore and keep the top k (`sftree select-paths`).

A candidate is the path to a normal leaf (`records.tree.normal_leaf`, the same predicate the search's stop rule counts,
seed 1.8/1.9/3.1: token or depth limit reached, or no room left with a valid path, i.e. no edge on it that was
kept only by the depth-2 exemption or the layer-1 fallback after failing; path validity is re-derived here from
the edges' `failed` flags) whose logical nodes all have a numeric score and whose edges all have `cleanliness`
and `knowledge_score` (3.1: all four metrics computable). The root is not one of a path's logical nodes (its
score is the Student's, not the Teacher's). Metrics are averaged at full precision (tree.json stores full
floats). Ranks are taken among this tree's candidates on oriented scores (minimize tasks negated), with mid-ranks
for ties:

    PathScore = .35 max_score_rank + .25 avg_score_rank + .20 avg_cleanliness + .20 avg_knowledge

**Choice** (tie-break, deterministic): PathScore desc, then oriented max_score desc, then oriented avg_score
desc, then leaf creation order (node number ascending). PathScores equal to 12 decimals count as tied, so
floating-point noise from summation order never decides a rank.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sftree.errors import InputError
from sftree.records.paths import PATHS_VERSION, Excluded, PathCounts, Paths, RankedPath, write_paths
from sftree.records.scores import best_of, oriented, percentile_rank
from sftree.records.tree import DIRECTIONS, Edge, LeafReason, Node, Tree, normal_leaf, read_tree
from sftree.settings import SelectPathsSettings, schema_defaults

log = logging.getLogger("sftree.dataset.select_paths")

W_MAX_RANK, W_AVG_RANK, W_CLEAN, W_KNOW = 0.35, 0.25, 0.20, 0.20


def path_score(
    max_score_rank: float, avg_score_rank: float, avg_cleanliness: float, avg_knowledge: float
) -> float:
    return (
        W_MAX_RANK * max_score_rank
        + W_AVG_RANK * avg_score_rank
        + W_CLEAN * avg_cleanliness
        + W_KNOW * avg_knowledge
    )


def _num(x: Any) -> float | None:
    """A usable number, or None (null, bool, NaN and strings are not scores)."""
    if isinstance(x, bool) or not isinstance(x, int | float) or math.isnan(x):
        return None
    return float(x)


@dataclass
class Candidate:
    leaf: str
    leaf_reason: LeafReason
    nodes: list[str]
    edges: list[str]
    scores: list[float]  # raw node scores, root excluded
    cleanliness: list[float]
    knowledge: list[float]


def _known(values: list[float | None]) -> list[float]:
    """The figures of a path none of whose figures is missing (`candidate_paths` excludes any other)."""
    return [_number(v) for v in values]


def _number(value: float | None) -> float:
    """A figure of a candidate path, whose scores are all numbers: never None (`candidate_paths`)."""
    if value is None:
        raise ValueError("a candidate path's figure is not a number")
    return value


def _node_number(node_id: str) -> tuple[int, str]:
    m = re.search(r"(\d+)$", node_id)
    return (int(m.group(1)) if m else 1 << 30, node_id)


def _index_tree(tree: Tree, source: str) -> tuple[dict[str, Node], dict[str, Edge], str]:
    nodes = {n.id: n for n in tree.nodes}
    edges = {e.id: e for e in tree.edges}
    roots = [n.id for n in nodes.values() if n.parent is None]
    if len(roots) != 1:
        raise InputError(f"{source}: expected exactly one root node (parent null), found {roots}")
    return nodes, edges, roots[0]


def _edge_into(node: Node, edges: dict[str, Edge], child_edge: dict[str, Edge], source: str) -> Edge:
    eid = node.edge
    edge = edges.get(eid) if eid else child_edge.get(node.id)
    if edge is None:
        raise InputError(f"{source}: node {node.id} has no edge leading into it")
    return edge


def _chain(node: Node, nodes: dict[str, Node], root: str, source: str) -> list[Node]:
    """The logical nodes root (excluded)..node."""
    chain: list[Node] = []
    cur = node
    while cur.id != root:
        chain.append(cur)
        parent = cur.parent
        if parent not in nodes:
            raise InputError(f"{source}: node {cur.id} has unknown parent {parent!r}")
        if len(chain) > len(nodes):
            raise InputError(f"{source}: parent links of node {node.id} form a cycle")
        cur = nodes[parent]
    chain.reverse()
    return chain


def candidate_paths(tree: Tree, source: str = "tree.json") -> tuple[list[Candidate], list[Excluded]]:
    """Every path to a normal leaf with all four metrics computable, and the excluded leaves with why."""
    nodes, edges, root = _index_tree(tree, source)
    child_edge = {e.child: e for e in edges.values() if e.child}
    has_child = {n.parent for n in nodes.values()}
    candidates: list[Candidate] = []
    excluded: list[Excluded] = []
    for nid in sorted(nodes, key=_node_number):
        node = nodes[nid]
        if nid == root or nid in has_child:
            continue
        if not node.leaf_reason:
            excluded.append(Excluded(nid, f"not a normally ended leaf (status {node.status})"))
            continue
        chain = _chain(node, nodes, root, source)
        path_edges = [_edge_into(n, edges, child_edge, source) for n in chain]
        failed = [e.id for e in path_edges if e.failed]
        not_normal = []
        if not normal_leaf(node.leaf_reason, not failed, len(chain)):
            why = f"below failed edge {', '.join(failed)}" if failed else "is not a leaf reason"
            not_normal = [f"not a normal leaf: {node.leaf_reason} {why}"]
        scores = [_num(n.score) for n in chain]
        clean = [_num(e.cleanliness) for e in path_edges]
        know = [_num(e.knowledge_score) for e in path_edges]
        missing = (
            not_normal
            + [f"missing score on {n.id}" for n, s in zip(chain, scores, strict=True) if s is None]
            + [f"missing cleanliness on {e.id}" for e, c in zip(path_edges, clean, strict=True) if c is None]
            + [
                f"missing knowledge_score on {e.id}"
                for e, k in zip(path_edges, know, strict=True)
                if k is None
            ]
        )
        if missing:
            excluded.append(Excluded(nid, "; ".join(missing)))
            continue
        candidates.append(
            Candidate(
                leaf=nid,
                leaf_reason=node.leaf_reason,
                nodes=[n.id for n in chain],
                edges=[e.id for e in path_edges],
                scores=_known(scores),
                cleanliness=_known(clean),
                knowledge=_known(know),
            )
        )
    return candidates, excluded


def score_paths(candidates: list[Candidate], direction: str, top_k: int) -> list[RankedPath]:
    """The seven fields of 3.4 for each candidate, sorted by PathScore (tie-break above), top k selected."""
    avg_scores = [sum(c.scores) / len(c.scores) for c in candidates]
    max_scores = [_number(best_of(c.scores, direction)) for c in candidates]
    o_avg = [_number(oriented(s, direction)) for s in avg_scores]
    o_max = [_number(oriented(s, direction)) for s in max_scores]
    records = []
    for i, c in enumerate(candidates):
        avg_rank = percentile_rank(o_avg[i], o_avg)
        max_rank = percentile_rank(o_max[i], o_max)
        avg_clean = sum(c.cleanliness) / len(c.cleanliness)
        avg_know = sum(c.knowledge) / len(c.knowledge)
        records.append(
            RankedPath(
                rank=0,
                selected=False,
                leaf=c.leaf,
                leaf_reason=c.leaf_reason,
                nodes=tuple(c.nodes),
                edges=tuple(c.edges),
                avg_cleanliness=avg_clean,
                avg_knowledge=avg_know,
                avg_score=avg_scores[i],
                avg_score_rank=avg_rank,
                max_score=max_scores[i],
                max_score_rank=max_rank,
                path_score=path_score(max_rank, avg_rank, avg_clean, avg_know),
            )
        )
    keys = [
        (-round(r.path_score, 12), -o_max[i], -o_avg[i], _node_number(r.leaf)) for i, r in enumerate(records)
    ]
    order = sorted(range(len(records)), key=keys.__getitem__)
    return [replace(records[i], rank=n + 1, selected=n < top_k) for n, i in enumerate(order)]


def select_paths(tree: Tree, top_k: int, source: str = "tree.json") -> Paths:
    """The paths.json of one tree (see docs/architecture.md)."""
    if top_k < 1:
        raise InputError(f"--top-k must be at least 1, got {top_k}")
    direction = tree.direction
    if direction not in DIRECTIONS:
        raise InputError(f"{source}: `direction` must be maximize or minimize, got {direction!r}")
    candidates, excluded = candidate_paths(tree, source)
    records = score_paths(candidates, direction, top_k)
    nodes, _, root = _index_tree(tree, source)
    return Paths(
        version=PATHS_VERSION,
        task=tree.task,
        root=tree.root,
        direction=direction,
        root_score=_num(nodes[root].score),
        top_k=top_k,
        counts=PathCounts(
            candidates=len(records), selected=sum(r.selected for r in records), excluded=len(excluded)
        ),
        paths=tuple(records),
        excluded=tuple(excluded),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tree", required=True, help="TREEDIR/tree.json written by `sftree explore`")
    parser.add_argument("--out", required=True, help="paths.json to write (normally TREEDIR/paths.json)")
    top_k = schema_defaults(SelectPathsSettings).top_k
    parser.add_argument(
        "--top-k", type=int, default=top_k, help="paths to select (all if fewer; default %(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    # checked: a wrong-typed field would otherwise read as "no paths" and exit 0; fail naming the field instead
    tree = read_tree(args.tree, source=f"tree file {args.tree}")
    if tree.status not in (None, "finished"):
        log.warning("%s: tree status is %r, not finished; ranking what is there", args.tree, tree.status)
    paths = select_paths(tree, args.top_k, source=str(args.tree))
    write_paths(Path(args.out), paths)
    c = paths.counts
    best = paths.paths[0].path_score if paths.paths else None
    log.info(
        "%s: %d candidate paths, %d selected, %d excluded, best PathScore %s -> %s",
        args.tree,
        c.candidates,
        c.selected,
        c.excluded,
        f"{best:.4f}" if best is not None else "-",
        args.out,
    )
    return 0
