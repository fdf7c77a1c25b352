"""An independent checker of section 1 and 3 on a finished tree.json (and its paths.json).

It re-derives every rule from the tree's own records with its own arithmetic (no call into search/mcts.py or
dataset/select_paths.py), so a test that grows a tree can assert `check_tree(obj) == []`:

- root first (1.2, 1.6, 1.10 steps 2 and 5): every root edge was dispatched before any deeper edge; each
  direction's first try comes before every fallback; a fallback follows a failed first try only; fallbacks and
  edges into depth 2 are exempt, nothing else is;
- hard prune (1.5) from the turns: no numeric turn score, or tool errors / calls > 0.30; an exempt edge that
  fails is kept unless it broke (`edge_error`); counters of every node;
- the soft score (1.7) and the child's score, path best, token total, path validity, at full precision;
- leaves (1.8, 1.9): reasons, and the one normal-leaf definition: `good_leaves` counts exactly the normal leaves;
- the stop reason holds at the end;
- paths.json (3.1-3.4): the candidates are exactly the normal leaves with all four metrics computable, and
  every path field is recomputed.
"""

from __future__ import annotations

import math

LIMIT = ("token_limit", "depth_limit")
NO_ROOM = ("no_room", "tree_stopped")


def _num(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x)


def _o(score, direction):
    if not _num(score):
        return None
    return -score if direction == "minimize" else score


def _better(a, b, direction) -> bool:
    oa, ob = _o(a, direction), _o(b, direction)
    return oa is not None and (ob is None or oa > ob)


def _best(scores, direction):
    best = None
    for s in scores:
        if _num(s) and (best is None or _better(s, best, direction)):
            best = s
    return best


def _eid(e) -> int:
    return int(e["id"][1:])


def _soft(edge, parent_score, direction) -> dict:
    imp = _better(edge["score"], parent_score, direction)
    rate = edge["tool_errors"] / edge["tool_calls"] if edge["tool_calls"] else 0.0
    clean = 1.0 if rate == 0 else max(0.3, 0.8 - 0.5 * rate / 0.30)
    know = (1.0 if edge["knowledge"] else 0.8) if imp else (0.6 if edge["knowledge"] else 0.4)
    start, regressed = parent_score, 0
    for t in edge["turns"]:
        s = t["score"]
        if not _num(s) or _better(start, s, direction):
            regressed += 1
        start = s
    stab = 1.0 - regressed / len(edge["turns"])
    outcome = 1.0 if imp else 0.7
    return {
        "outcome": outcome,
        "cleanliness": clean,
        "knowledge_score": know,
        "regression_stability": stab,
        "soft": 0.3 * outcome + 0.2 * clean + 0.2 * know + 0.3 * stab,
    }


def normal_leaves(tree: dict) -> set[str]:
    """Leaves that are normal by 1.8/1.9, path validity re-derived from the edges' `failed` flags."""
    nodes = {n["id"]: n for n in tree["nodes"]}
    edges = {e["id"]: e for e in tree["edges"]}

    def valid(nid):
        n = nodes[nid]
        return n["parent"] is None or (not edges[n["edge"]]["failed"] and valid(n["parent"]))

    out = set()
    for n in tree["nodes"]:
        if n["status"] != "leaf" or n["depth"] == 0:
            continue
        if n["leaf_reason"] in LIMIT or (n["leaf_reason"] in NO_ROOM and valid(n["id"])):
            out.add(n["id"])
    return out


def check_tree(tree: dict) -> list[str]:
    """Every rule violation found in a finished tree.json object (empty list: the tree follows the rules)."""
    p, d = tree["params"], tree["direction"]
    nodes = {n["id"]: n for n in tree["nodes"]}
    out: list[str] = []
    root = next(n for n in tree["nodes"] if n["parent"] is None)
    root_edges = [e for e in tree["edges"] if e["parent"] == root["id"]]
    deeper = [e for e in tree["edges"] if e["parent"] != root["id"]]
    # --- root first ---
    if root_edges and deeper and max(map(_eid, root_edges)) > min(map(_eid, deeper)):
        out.append("root first: a deeper edge was dispatched before a root edge")
    firsts = [e for e in root_edges if e["attempt"] == 1]
    retries = [e for e in root_edges if e["attempt"] == 2]
    if firsts and retries and max(map(_eid, firsts)) > min(map(_eid, retries)):
        out.append("root first: a fallback was dispatched before a direction's first try")
    for slot in range(p["root_children"]):
        tries = sorted((e for e in root_edges if e["slot"] == slot), key=_eid)
        if [e["attempt"] for e in tries] not in ([], [1], [1, 2]):
            out.append(f"root slot {slot}: attempts {[e['attempt'] for e in tries]}")
        if len(tries) == 2 and tries[0]["child"] is not None:
            out.append(f"root slot {slot}: a fallback after a first try that made a node")
        if tree["stop_reason"] == "frontier_empty" and not tries:
            out.append(f"root slot {slot}: never tried although the frontier emptied")
        if tree["stop_reason"] == "frontier_empty" and len(tries) == 1 and tries[0]["child"] is None:
            out.append(f"root slot {slot}: a failed first try was not retried")
    # --- edges: exemption, hard prune, soft score ---
    for e in tree["edges"]:
        where = f"edge {e['id']}"
        want_exempt = e["attempt"] == 2 if e["depth"] == 1 else e["depth"] == 2
        if e["exempt"] != want_exempt:
            out.append(f"{where}: exempt {e['exempt']} at depth {e['depth']} attempt {e['attempt']}")
        if e["depth"] != nodes[e["parent"]]["depth"] + 1:
            out.append(f"{where}: depth is not parent depth + 1")
        if e["fail_reason"] == "edge_error":
            reason = "edge_error"
        elif any(not _num(t["score"]) for t in e["turns"]):
            reason = "no_score"
        elif e["tool_calls"] and e["tool_errors"] / e["tool_calls"] > 0.30:
            reason = "tool_error_rate"
        else:
            reason = None
        if e["fail_reason"] != reason or e["failed"] != (reason is not None):
            out.append(f"{where}: fail_reason {e['fail_reason']!r}, the turns give {reason!r}")
        keep = reason is None or (e["exempt"] and reason != "edge_error")
        if e["pruned"] == keep or (e["child"] is None) == keep:
            out.append(f"{where}: pruned {e['pruned']} / child {e['child']} but kept should be {keep}")
        if e["pruned"] and e["prune_reason"] != reason:
            out.append(f"{where}: prune_reason {e['prune_reason']!r} != {reason!r}")
        if e["score"] != _best([t["score"] for t in e["turns"]], d):
            out.append(f"{where}: score {e['score']} is not the best turn score")
        rate = e["tool_errors"] / e["tool_calls"] if e["tool_calls"] else 0.0
        if e["tool_error_rate"] != rate:
            out.append(f"{where}: tool_error_rate {e['tool_error_rate']} != {rate} (full precision)")
        if keep:
            want = _soft(e, nodes[e["parent"]]["score"], d)
            for k, v in want.items():
                if not _num(e[k]) or abs(e[k] - v) > 1e-12:
                    out.append(f"{where}: {k} {e[k]} != {v}")
    # --- nodes ---
    for n in tree["nodes"]:
        where = f"node {n['id']}"
        mine = [e for e in tree["edges"] if e["parent"] == n["id"]]
        if n["valid_children"] != sum(e["child"] is not None for e in mine):
            out.append(f"{where}: valid_children {n['valid_children']}")
        if n["failed_expansions"] != sum(e["pruned"] for e in mine):
            out.append(f"{where}: failed_expansions {n['failed_expansions']}")
        if n["parent"] is not None:
            e, par = next(x for x in tree["edges"] if x["id"] == n["edge"]), nodes[n["parent"]]
            if n["valid_children"] > p["max_children"] or n["failed_expansions"] > p["max_failed_expansions"]:
                out.append(f"{where}: over its child or failure limit")
            if n["score"] != e["score"] or n["max_token_total"] != e["tokens"]:
                out.append(f"{where}: score/tokens differ from edge {e['id']}")
            if n["path_best_score"] != _best([par["path_best_score"], n["score"]], d):
                out.append(f"{where}: path_best_score {n['path_best_score']}")
            if n["path_valid"] != (par["path_valid"] and not e["failed"]):
                out.append(f"{where}: path_valid {n['path_valid']}")
        has_children = n["valid_children"] > 0
        at_token = n["max_token_total"] >= p["hard_token_limit"]
        at_depth = n["depth"] >= p["max_depth"]
        reason = n["leaf_reason"]
        if at_token or at_depth:
            want = "token_limit" if at_token else "depth_limit"
            if (n["status"], reason) != ("leaf", want):
                out.append(f"{where}: {n['status']}/{reason}, the limits give leaf/{want}")
        elif reason == "no_room":
            spent = n["failed_expansions"] >= p["max_failed_expansions"] if n["parent"] else True
            if has_children or not spent:
                out.append(f"{where}: no_room with children or failures left")
        elif reason == "tree_stopped" and (has_children or not n["path_valid"]):
            out.append(f"{where}: tree_stopped with children or an invalid path")
        if n["status"] == "closed" and (has_children or n["path_valid"]):
            out.append(f"{where}: closed with children or a valid path")
        if n["status"] == "expanded" and not has_children:
            out.append(f"{where}: expanded without children")
        if tree["status"] == "finished" and n["status"] == "active":
            out.append(f"{where}: still active in a finished tree")
    # --- stop rule and counters ---
    good = normal_leaves(tree)
    c = tree["counters"]
    if c["good_leaves"] != len(good):
        out.append(f"counters.good_leaves {c['good_leaves']} != {len(good)} normal leaves")
    valid_edges = sum(e["child"] is not None for e in tree["edges"])
    if c["valid_edges"] != valid_edges:
        out.append(f"counters.valid_edges {c['valid_edges']} != {valid_edges}")
    stop = tree["stop_reason"]
    if stop == "good_leaves" and len(good) < p["target_good_leaves"]:
        out.append("stop good_leaves with fewer normal leaves than the target")
    if stop == "edge_budget" and valid_edges <= p["max_valid_edges"]:
        out.append("stop edge_budget within the budget")
    if stop == "frontier_empty" and (
        len(good) >= p["target_good_leaves"] or valid_edges > p["max_valid_edges"]
    ):
        out.append("stop frontier_empty although an earlier rule holds")
    return out


def check_paths(tree: dict, doc: dict) -> list[str]:
    """paths.json against the tree: candidate set (3.1) and every field (3.2-3.4) recomputed."""
    d = tree["direction"]
    nodes = {n["id"]: n for n in tree["nodes"]}
    edges = {e["id"]: e for e in tree["edges"]}
    want: dict[str, tuple[list, list]] = {}
    for leaf in normal_leaves(tree):
        chain, cur = [], nodes[leaf]
        while cur["parent"] is not None:
            chain.append(cur)
            cur = nodes[cur["parent"]]
        chain.reverse()
        es = [edges[n["edge"]] for n in chain]
        if all(_num(n["score"]) for n in chain) and all(
            _num(e["cleanliness"]) and _num(e["knowledge_score"]) for e in es
        ):
            want[leaf] = (chain, es)
    out: list[str] = []
    got = {p["leaf"]: p for p in doc["paths"]}
    if set(got) != set(want):
        out.append(f"paths: candidates {sorted(got)} != normal leaves with metrics {sorted(want)}")
        return out
    avg = {k: sum(_o(n["score"], d) for n in c) / len(c) for k, (c, _) in want.items()}
    mx = {k: max(_o(n["score"], d) for n in c) for k, (c, _) in want.items()}

    def rank(v, vals):
        return (sum(x < v for x in vals) + 0.5 * sum(x == v for x in vals)) / len(vals)

    for k, (chain, es) in want.items():
        clean = sum(e["cleanliness"] for e in es) / len(es)
        know = sum(e["knowledge_score"] for e in es) / len(es)
        ar, mr = rank(avg[k], list(avg.values())), rank(mx[k], list(mx.values()))
        ps = 0.35 * mr + 0.25 * ar + 0.20 * clean + 0.20 * know
        p = got[k]
        for name, v in (("avg_cleanliness", clean), ("avg_knowledge", know), ("avg_score_rank", ar),
                        ("max_score_rank", mr), ("path_score", ps)):  # fmt: skip
            if abs(p[name] - v) > 1e-12:
                out.append(f"path {k}: {name} {p[name]} != {v}")
        if p["nodes"] != [n["id"] for n in chain]:
            out.append(f"path {k}: nodes {p['nodes']}")
    scores = [p["path_score"] for p in doc["paths"]]
    if any(a < b - 1e-12 for a, b in zip(scores, scores[1:], strict=False)):
        out.append("paths: not sorted by PathScore")
    return out
