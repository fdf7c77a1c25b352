"""The token-aware MCTS of seed section 1: a stateless policy over `tree.Tree` and the loop that drives it.

    ask(tree, n)            -> up to n Expansions: while the root's layer is pending, its directions (first
                               tries, then fallbacks); after that the highest Select = Q + alpha*T candidates,
                               counting the expansions already in flight against each node's child limit
                               (virtual visits)
    begin(tree, expansion)  -> Dispatch: takes an edge id and marks it in flight
    tell(tree, dispatch, r) -> applies one finished edge: attach a child or prune, update counters and leaves
    stop_reason(tree)       -> the first stop rule of 1.9 that holds, or None
    finish(tree, reason)    -> closes the tree: tree_stopped leaves, statuses

`run_search` is the loop: select, fork, run two turns, verify, attach or prune, persist; `parallel_width`
expansions at once, refilled as each finishes (`schedule: async`) or in the seed's batch rounds (`rounds`).
Choices where the seed is silent are listed in docs/search.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from typing import Any

from sftree.agents.turn_end import TEACHER_DOWN
from sftree.errors import TeacherUnavailable
from sftree.jsontypes import JSONObject
from sftree.records.scores import best_of
from sftree.records.tree import Edge, Node, PruneReason, Select, StopReason
from sftree.search import scoring
from sftree.search.result import EdgeResult
from sftree.search.tree import Tree, is_good_leaf, now_iso

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Expansion:
    """One proposed expansion of `node` (no edge id yet)."""

    node: str
    depth: int  # depth of the child it would make
    slot: int | None  # root direction 0..root_children-1; None below the root
    attempt: (
        int  # root: 1 = first try of the direction, 2 = its fallback; else the n-th expansion of the node
    )
    exempt: bool  # kept even when it fails the hard-prune test (layer-1 fallback, depth-2 edges)
    select: Select  # the Select breakdown: node, score_rank, best_rank, process, Q, T, select


@dataclass(frozen=True)
class Dispatch:
    """An expansion that is running: everything the worker thread needs, copied out of the tree."""

    edge: str
    node: str
    depth: int
    slot: int | None
    attempt: int
    exempt: bool
    select: Select
    parent_score: float | None
    parent_state: JSONObject | None
    parent_eval_count: int | None
    started_at: str

    def to_dict(self) -> JSONObject:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Dispatch:
        fields_: dict[str, Any] = dict(d)  # a dispatch `to_dict` wrote (tree.json `in_flight`)
        return cls(**fields_)


# --- capacity: what a node may still take -------------------------------------------------------------


def _in_flight_by_node(tree: Tree) -> dict[str, list[JSONObject]]:
    out: dict[str, list[JSONObject]] = {}
    for d in tree.in_flight:
        out.setdefault(str(d["node"]), []).append(d)
    return out


def _root_tries(tree: Tree) -> dict[int, list[Edge]]:
    """The finished edges of each root direction (slot), in dispatch order."""
    root = tree.root_node.id
    out: dict[int, list[Edge]] = {slot: [] for slot in range(tree.params.root_children)}
    for e in tree.edges:
        if e.parent == root and e.slot in out:
            out[e.slot].append(e)
    return out


def _root_open_slots(tree: Tree, running: list[JSONObject]) -> list[tuple[int, int]]:
    """(slot, next attempt) of every root direction that has no child yet, nothing running, and a try left.

    First tries come before fallbacks (each in slot order): the root's directions start together (1.10 step 2),
    then a failed first try is retried (1.6). So the dispatch order is the same at every `parallel_width`.
    """
    busy = {d["slot"] for d in running}
    out = []
    for slot, tries in _root_tries(tree).items():
        if slot in busy or any(e.child is not None for e in tries) or len(tries) >= 2:
            continue
        out.append((slot, len(tries) + 1))
    return sorted(out, key=lambda sa: (sa[1], sa[0]))


def root_layer_pending(tree: Tree) -> bool:
    """True while a root direction is unresolved: no child yet, and a try running or left (1.2, 1.6).

    While it holds, only the root's directions are dispatched (root first, 1.10 steps 2 and 5); a direction is
    resolved when it has a child or has been lost (two tries without one: the fallback broke, `edge_error`).
    """
    root = tree.root_node
    if root.depth >= tree.params.max_depth or root.max_token_total >= tree.params.hard_token_limit:
        return False
    busy = {d["slot"] for d in tree.in_flight if d["node"] == root.id}
    for slot, tries in _root_tries(tree).items():
        if any(e.child is not None for e in tries):
            continue
        if slot in busy or len(tries) < 2:
            return True
    return False


def can_grow(tree: Tree, node: Node) -> bool:
    """The seed's active-candidate test, ignoring in-flight expansions (a node that may ever take another)."""
    p = tree.params
    if node.depth >= p.max_depth or node.max_token_total >= p.hard_token_limit:
        return False
    if node.parent is None:  # the root is governed by its directions and their one fallback each
        return bool(_root_open_slots(tree, []))
    return node.valid_children < p.max_children and node.failed_expansions < p.max_failed_expansions


def capacity(tree: Tree, node: Node, running: list[JSONObject]) -> int:
    """How many more expansions `node` may take now, in-flight ones counted against its child limit."""
    if node.status != "active" or not can_grow(tree, node):
        return 0
    if node.parent is None:
        return len(_root_open_slots(tree, running))
    p, busy = tree.params, len(running)
    # Running expansions might fail too: they count against the failure budget as well as the child limit.
    return max(
        0,
        min(
            p.max_children - node.valid_children - busy,
            p.max_failed_expansions - node.failed_expansions - busy,
        ),
    )


# --- the policy ---------------------------------------------------------------------------------------


def select_breakdowns(tree: Tree, candidates: list[Node]) -> dict[str, Select]:
    """Select = Q + alpha*T for each candidate, with its parts (1.3)."""
    d = tree.direction
    # Rank tables sorted once per call (O(n log n)), not a scan of every node per candidate (O(n^2)).
    score_rank = scoring.score_ranks([n.score for n in tree.nodes], d)
    best_rank = scoring.score_ranks([n.path_best_score for n in tree.nodes], d)
    token_reward = scoring.token_rewards([n.max_token_total for n in candidates])
    out: dict[
        str, Select
    ] = {}  # full floats (rounded only in the log line): near-ties keep their exact order
    for n in candidates:
        sr = score_rank(n.score)
        br = best_rank(n.path_best_score)
        pr = scoring.process([e.soft for e in tree.path_edges(n.id)])
        q = scoring.q_value(sr, br, pr)
        t = token_reward(n.max_token_total)
        out[n.id] = {
            "node": n.id,
            "score_rank": sr,
            "best_rank": br,
            "process": pr,
            "Q": q,
            "T": t,
            "select": scoring.select_value(q, t, tree.params.alpha),
        }
    return out


# Select values equal to this many decimals are a tie: summation-order noise never decides between two nodes.
TIE_DECIMALS = 12


def select_order(candidates: list[Node], sel: dict[str, Select]) -> list[Node]:
    """Candidates by Select, highest first; ties (equal to TIE_DECIMALS) go to the older node (creation order,
    i.e. the order of `candidates`, which is `tree.nodes` order), so a run is reproducible."""
    keyed = [(-round(sel[n.id]["select"], TIE_DECIMALS), i, n) for i, n in enumerate(candidates)]
    return [n for _, _, n in sorted(keyed, key=lambda k: (k[0], k[1]))]


def ask(tree: Tree, n: int) -> list[Expansion]:
    """Up to `n` expansions. While the root's layer is pending only root directions are given (root first);
    after that, best Select first among the other nodes, each taking as many as its remaining room allows.
    """
    if n <= 0 or tree.status != "running":
        return []
    running = _in_flight_by_node(tree)
    room = {node.id: capacity(tree, node, running.get(node.id, [])) for node in tree.nodes}
    candidates = [node for node in tree.nodes if room[node.id] > 0]
    if not candidates:
        return []
    sel = select_breakdowns(tree, candidates)
    root = tree.root_node
    if root_layer_pending(tree):  # root first: its directions and their fallbacks before any deeper node
        slots = _root_open_slots(tree, running.get(root.id, []))[:n] if room[root.id] > 0 else []
        return [Expansion(root.id, 1, slot, attempt, attempt >= 2, sel[root.id]) for slot, attempt in slots]
    out: list[Expansion] = []
    for node in select_order(candidates, sel):
        if node.parent is None:  # not reached: a resolved root layer leaves the root no room
            continue
        take = min(room[node.id], n - len(out))
        started = sum(1 for e in tree.edges if e.parent == node.id) + len(running.get(node.id, []))
        depth = node.depth + 1
        for k in range(take):
            out.append(Expansion(node.id, depth, None, started + k + 1, depth == 2, sel[node.id]))
        if len(out) >= n:
            break
    return out


def begin(tree: Tree, exp: Expansion) -> Dispatch:
    """Give the expansion an edge id and mark it in flight (persisted, so a resumed run can discard it)."""
    parent = tree.node(exp.node)
    d = Dispatch(
        edge=tree.take_edge_id(),
        node=exp.node,
        depth=exp.depth,
        slot=exp.slot,
        attempt=exp.attempt,
        exempt=exp.exempt,
        select=exp.select,
        parent_score=parent.score,
        parent_state=dict(parent.state) if parent.state else None,
        parent_eval_count=parent.eval_count,
        started_at=now_iso(),
    )
    tree.in_flight.append(d.to_dict())
    return d


def fail_reason(result: EdgeResult, threshold: float) -> PruneReason | None:
    """Why the edge fails the hard-prune test (1.5), or None: no numeric score on a turn, or too many tool errors."""
    if result.tampered:
        return "tampered"  # its session broke the chain (agents/chain.py): never kept, never continued
    if result.child_state is None:
        return "edge_error"  # the fork or the runtime broke: there is no state to attach
    if not result.valid:
        return "no_score"
    if result.tool_error_rate > threshold:
        return "tool_error_rate"
    return None


def tell(tree: Tree, d: Dispatch, result: EdgeResult) -> Edge:
    """Apply one finished edge to the tree: attach its child or prune it, then update the parent's status."""
    p = tree.params
    tree.in_flight = [x for x in tree.in_flight if x["edge"] != d.edge]
    parent = tree.node(d.node)
    reason = fail_reason(result, p.prune_tool_error_rate)
    keep = reason is None or (d.exempt and reason not in ("edge_error", "tampered"))
    knowledge = bool(result.knowledge)
    b = None
    child: str | None = None
    if keep:
        b = scoring.soft_breakdown(
            result.score,
            parent.score,
            tree.direction,
            result.tool_error_rate,
            knowledge,
            result.regressed_rate,
        )
        child = _make_child(tree, parent, d.edge, result, failed=reason is not None).id
        parent = tree.put_node(replace(parent, valid_children=parent.valid_children + 1))
    else:
        parent = tree.put_node(replace(parent, failed_expansions=parent.failed_expansions + 1))
    edge = tree.add_edge(
        Edge(
            id=d.edge,
            parent=d.node,
            depth=d.depth,
            attempt=d.attempt,
            slot=d.slot,
            exempt=d.exempt,
            select=dict(d.select),
            child=child,
            pruned=not keep,
            prune_reason=None if keep else reason,
            failed=reason is not None,
            fail_reason=reason,
            turns=tuple(result.turns),
            score=result.score,
            steps=result.steps,
            tool_calls=result.tool_calls,
            tool_errors=result.tool_errors,
            tool_error_rate=result.tool_error_rate,
            tokens=result.tokens,
            knowledge=knowledge,
            regressed_rate=result.regressed_rate,
            # full floats: path selection averages them (3.2), so rounding here could reorder near-ties
            outcome=b.outcome if b else None,
            cleanliness=b.cleanliness if b else None,
            knowledge_score=b.knowledge_score if b else None,
            regression_stability=b.regression_stability if b else None,
            soft=b.soft if b else None,
            transcript=result.transcript,
            code_diff=result.code_diff,
            knowledge_diff=result.knowledge_diff,
            error=result.error,
            started_at=d.started_at,
            finished_at=now_iso(),
            wall_s=round(result.wall_s, 3) if result.wall_s is not None else None,
        )
    )
    _settle(tree, parent)
    return edge


def _make_child(tree: Tree, parent: Node, edge_id: str, result: EdgeResult, failed: bool) -> Node:
    p = tree.params
    state = result.child_state.to_dict() if result.child_state is not None else None
    evals = result.evals
    child = Node(
        id=tree.new_node_id(),
        parent=parent.id,
        edge=edge_id,
        depth=parent.depth + 1,
        score=result.score,
        path_best_score=best_of([parent.path_best_score, result.score], tree.direction),
        max_token_total=int(result.tokens),
        path_valid=parent.path_valid and not failed,
        state=state,
        eval_count=(parent.eval_count or 0) + (evals if evals is not None else len(result.turns))
        if parent.eval_count is not None
        else None,
    )
    # 1.8: a child is a normal leaf at the token or depth limit, else it joins the candidates.
    if child.max_token_total >= p.hard_token_limit:
        child = replace(child, status="leaf", leaf_reason="token_limit")
    elif child.depth >= p.max_depth:
        child = replace(child, status="leaf", leaf_reason="depth_limit")
    return tree.add_node(child)


def _settle(tree: Tree, node: Node) -> None:
    """A node that can take no more expansions and has none running stops being active."""
    if node.status != "active" or can_grow(tree, node):
        return
    if any(d["node"] == node.id for d in tree.in_flight):
        return
    if node.valid_children > 0:
        tree.put_node(replace(node, status="expanded"))
    else:  # two failed expansions (or every root direction lost): no room left
        tree.put_node(replace(node, status="leaf", leaf_reason="no_room"))


def has_candidates(tree: Tree) -> bool:
    running = _in_flight_by_node(tree)
    return any(capacity(tree, n, running.get(n.id, [])) > 0 for n in tree.nodes)


def stop_reason(tree: Tree) -> StopReason | None:
    """The stop rules of 1.9, in the seed's order; an empty frontier counts only when nothing is running."""
    p = tree.params
    c = tree.counters()
    if c["good_leaves"] >= p.target_good_leaves:
        return "good_leaves"
    if c["valid_edges"] > p.max_valid_edges:
        return "edge_budget"
    if not tree.in_flight and not has_candidates(tree):
        return "frontier_empty"
    return None


def finish(tree: Tree, reason: StopReason | None) -> None:
    """Close the tree: childless nodes that could still grow become tree_stopped leaves (valid path) or closed."""
    for n in list(tree.nodes):
        if n.status != "active":
            continue
        if n.valid_children > 0:
            tree.put_node(replace(n, status="expanded"))
        elif n.path_valid:
            tree.put_node(replace(n, status="leaf", leaf_reason="tree_stopped"))
        else:
            tree.put_node(replace(n, status="closed"))
    tree.status, tree.stop_reason = "finished", reason


# --- the loop -----------------------------------------------------------------------------------------

RunEdge = Callable[[Dispatch], EdgeResult]


@dataclass
class LoopStats:
    started: float
    tokens: int = 0
    best: float | None = None
    _scanned: int = 0  # nodes already folded into `best` (nodes are only appended; a score never changes)

    def line(self, tree: Tree) -> str:
        c = tree.counters()
        best = self.best = best_of(
            [self.best, *(n.score for n in tree.nodes[self._scanned :])], tree.direction
        )
        self._scanned = len(tree.nodes)
        rate = self.tokens / max(time.monotonic() - self.started, 1e-9)
        return (
            f"edges {c['edges']} (valid {c['valid_edges']}, pruned {c['pruned_edges']}, failed {c['failed_edges']}),"
            f" leaves {c['leaves']} (good {c['good_leaves']}), in flight {c['in_flight']},"
            f" best score {best}, {rate:.0f} tokens/s"
        )


def _edge_tokens(result: EdgeResult) -> int:
    return sum(int(t.tokens or 0) for t in result.turns)


def run_search(tree: Tree, run_edge: RunEdge, persist: Callable[[Tree], None]) -> Tree:
    """Grow `tree` until a stop rule holds; `run_edge(dispatch)` runs one edge (in a worker thread).

    Running expansions always finish and are recorded, also after a stop rule fired. A Teacher that stays
    down past its retries ends the loop with TeacherUnavailable after the running edges are recorded; the
    failed edge stays in flight in the persisted tree, so a rerun retries it.
    """
    p = tree.params
    width = max(1, p.parallel_width)
    stats = LoopStats(time.monotonic())
    stop = stop_reason(tree)
    fatal: BaseException | None = None
    running: dict[Future[EdgeResult], Dispatch] = {}
    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="edge") as pool:
        while True:
            may_refill = p.schedule == "async" or not running
            if stop is None and fatal is None and may_refill:
                batch = [begin(tree, exp) for exp in ask(tree, width - len(running))]  # select
                if batch:
                    persist(tree)  # in flight on disk before any work starts, so a rerun can discard it
                for d in batch:
                    s = d.select
                    log.info(
                        "dispatch %s: %s -> depth %d (slot %s, attempt %d%s) score_rank=%.3f best_rank=%.3f"
                        " process=%.3f Q=%.3f T=%.3f select=%.3f",
                        d.edge, d.node, d.depth, d.slot, d.attempt, ", exempt" if d.exempt else "",
                        s["score_rank"], s["best_rank"], s["process"], s["Q"], s["T"], s["select"],
                    )  # fmt: skip
                    running[pool.submit(run_edge, d)] = d  # fork + two turns + verify, in a worker
            if not running:
                if stop is None and fatal is None:
                    stop = stop_reason(tree)
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: int(running[f].edge[1:])):
                d = running.pop(fut)
                try:
                    result = fut.result()
                except Exception as exc:  # noqa: BLE001 - record nothing; the edge stays in flight for a rerun
                    log.error("edge %s raised %s: %s", d.edge, type(exc).__name__, exc)
                    fatal = fatal or exc
                    continue
                if _teacher_down(result):
                    log.error("edge %s: the Teacher is unavailable (%s); stopping after running edges", d.edge,
                              result.error)  # fmt: skip
                    fatal = fatal or TeacherUnavailable(f"edge {d.edge}: {result.error}")
                    continue
                edge = tell(tree, d, result)  # attach or prune
                stats.tokens += _edge_tokens(result)
                log.info(
                    "edge %s done: %s score=%s rate=%.2f tokens=%d%s",
                    d.edge, f"child {edge.child}" if edge.child else f"pruned ({edge.prune_reason})",
                    edge.score, edge.tool_error_rate, edge.tokens, f" soft={edge.soft:.3f}" if edge.soft is not None else "",
                )  # fmt: skip
                if stop is None and fatal is None:
                    stop = stop_reason(tree)  # frontier_empty only once nothing is running
                    if stop:
                        log.info("stop rule %s fired; %d running edge(s) will finish", stop, len(running))
                persist(tree)  # after every edge
                log.info("progress: %s", stats.line(tree))
    if fatal is not None:
        persist(tree)
        raise fatal
    finish(tree, stop)
    persist(tree)
    log.info("tree finished (%s): %s", stop, stats.line(tree))
    return tree


def _teacher_down(result: EdgeResult) -> bool:
    """The Teacher could not be reached past its retries: not a property of the node, so not recorded."""
    return any(t.ended in TEACHER_DOWN for t in result.turns)


__all__ = [
    "Dispatch",
    "Expansion",
    "ask",
    "begin",
    "tell",
    "stop_reason",
    "finish",
    "run_search",
    "is_good_leaf",
]
