"""Section 3 path selection against hand-computed PathScores (trees written by hand as input fixtures)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from scipy.stats import percentileofscore

from sftree.dataset.select_paths import select_paths
from sftree.errors import InputError
from sftree.records.scores import percentile_rank
from sftree.records.tree import Tree
from sftree.settings import SelectPathsSettings, schema_defaults


def select(doc: dict, **kw):
    """select-paths over a tree document (its typed form, as `read_tree` gives it), as the document it writes."""
    return select_paths(
        Tree.from_doc(doc), **{"top_k": schema_defaults(SelectPathsSettings).top_k, **kw}
    ).to_doc()


def make_tree(direction, spec, root_score=1.0):
    """spec: list of (node, parent, score, cleanliness, knowledge_score, leaf_reason)."""
    nodes = [{"id": "n0", "parent": None, "edge": None, "depth": 0, "score": root_score, "leaf_reason": None}]
    edges = []
    depth = {"n0": 0}
    for i, (nid, parent, score, clean, know, leaf) in enumerate(spec, start=1):
        depth[nid] = depth[parent] + 1
        eid = f"e{i}"
        nodes.append(
            {
                "id": nid,
                "parent": parent,
                "edge": eid,
                "depth": depth[nid],
                "score": score,
                "leaf_reason": leaf,
            }
        )
        edges.append(
            {"id": eid, "parent": parent, "child": nid, "cleanliness": clean, "knowledge_score": know}
        )
    return {
        "version": 1,
        "task": "t",
        "root": "eval-000001-agent-1-abc",
        "direction": direction,
        "nodes": nodes,
        "edges": edges,
    }


def full_tree(tree: dict) -> dict:
    """`make_tree`'s tree with every field tree.schema.json requires (select-paths validates it first)."""
    from dataclasses import asdict

    from helpers.mcts import search_params

    node = {"path_best_score": None, "max_token_total": 0, "valid_children": 0, "failed_expansions": 0,
            "status": "expanded", "path_valid": True, "state": None}  # fmt: skip
    edge = {"depth": 1, "attempt": 1, "slot": 0, "exempt": False, "pruned": False, "prune_reason": None,
            "failed": False, "fail_reason": None, "turns": [], "score": None, "steps": 0, "tool_calls": 0,
            "tool_errors": 0, "tool_error_rate": 0.0, "tokens": 0, "knowledge": True, "regressed_rate": 0.0,
            "outcome": 1.0, "regression_stability": 1.0, "soft": 1.0, "transcript": None,
            "select": {"node": "n0", "score_rank": 0, "best_rank": 0, "process": 0, "Q": 0, "T": 0, "select": 0}}  # fmt: skip
    depth = {n["id"]: n["depth"] for n in tree["nodes"]}
    return dict(
        tree,
        params=asdict(search_params()),
        status="finished",
        stop_reason="frontier_empty",
        counters={"edges": 0, "valid_edges": 0, "pruned_edges": 0, "failed_edges": 0, "good_leaves": 0},
        nodes=[{**node, **n, "status": "leaf" if n["leaf_reason"] else "expanded"} for n in tree["nodes"]],
        edges=[
            {**edge, **e, "depth": depth[e["child"]], "select": dict(edge["select"], node=e["parent"])}
            for e in tree["edges"]
        ],  # fmt: skip
    )


# n0 -> n1 -> {n4, n5}; n0 -> n2 -> n6 (no score: excluded); n0 -> n3 (leaf)
SPEC = [
    ("n1", "n0", 2.0, 1.0, 1.0, None),
    ("n2", "n0", 1.5, 0.8, 0.6, None),
    ("n3", "n0", 3.0, 1.0, 0.4, "no_room"),
    ("n4", "n1", 2.5, 0.55, 1.0, "depth_limit"),
    ("n5", "n1", 1.0, 1.0, 0.8, "depth_limit"),
    ("n6", "n2", None, None, None, "tree_stopped"),
]


def by_leaf(doc):
    return {p["leaf"]: p for p in doc["paths"]}


def test_maximize_hand_computed():
    doc = select(make_tree("maximize", SPEC), top_k=2)
    assert [p["leaf"] for p in doc["paths"]] == ["n3", "n4", "n5"]
    p = by_leaf(doc)
    # n4: nodes n1,n4 -> avg 2.25, max 2.5; cleanliness (1+.55)/2; knowledge 1
    assert p["n4"]["nodes"] == ["n1", "n4"] and p["n4"]["edges"] == ["e1", "e4"]
    assert p["n4"]["avg_score"] == pytest.approx(2.25) and p["n4"]["max_score"] == 2.5
    assert p["n4"]["avg_cleanliness"] == pytest.approx(0.775) and p["n4"]["avg_knowledge"] == pytest.approx(
        1.0
    )
    assert p["n4"]["avg_score_rank"] == pytest.approx(0.5) and p["n4"]["max_score_rank"] == pytest.approx(0.5)
    assert p["n4"]["path_score"] == pytest.approx(0.655)
    assert p["n5"]["avg_score_rank"] == pytest.approx(1 / 6) and p["n5"]["path_score"] == pytest.approx(0.48)
    assert p["n3"]["max_score_rank"] == pytest.approx(5 / 6) and p["n3"]["path_score"] == pytest.approx(0.78)
    assert [p["rank"] for p in doc["paths"]] == [1, 2, 3]
    assert [p["selected"] for p in doc["paths"]] == [True, True, False]
    assert doc["excluded"] == [
        {
            "leaf": "n6",
            "reason": "missing score on n6; missing cleanliness on e6; missing knowledge_score on e6",
        }
    ]
    assert doc["counts"] == {"candidates": 3, "selected": 2, "excluded": 1}
    assert doc["root_score"] == 1.0 and doc["top_k"] == 2


def test_minimize_orients_scores_and_reports_best_raw():
    doc = select(make_tree("minimize", SPEC), top_k=6)
    p = by_leaf(doc)
    # best (lowest) node score is the path's max_score for a minimize task
    assert p["n4"]["max_score"] == 2.0 and p["n5"]["max_score"] == 1.0 and p["n3"]["max_score"] == 3.0
    assert p["n5"]["max_score_rank"] == pytest.approx(5 / 6) and p["n3"]["avg_score_rank"] == pytest.approx(
        1 / 6
    )
    assert p["n5"]["path_score"] == pytest.approx(0.88)
    assert p["n4"]["path_score"] == pytest.approx(0.655)
    assert p["n3"]["path_score"] == pytest.approx(0.38)
    assert [p["leaf"] for p in doc["paths"]] == ["n5", "n4", "n3"]
    # fewer candidates than top_k: all selected
    assert all(p["selected"] for p in doc["paths"])


def test_ties_share_mid_rank_and_break_deterministically():
    # n1, n2 equal in everything -> same ranks and PathScore, creation order decides
    spec = [
        ("n2", "n0", 2.0, 1.0, 1.0, "no_room"),
        ("n1", "n0", 2.0, 1.0, 1.0, "no_room"),
        ("n3", "n0", 1.0, 1.0, 1.0, "no_room"),
    ]
    doc = select(make_tree("maximize", spec), top_k=6)
    assert [p["leaf"] for p in doc["paths"]] == ["n1", "n2", "n3"]
    p = by_leaf(doc)
    assert p["n1"]["avg_score_rank"] == pytest.approx(2 / 3) == p["n2"]["max_score_rank"]
    assert p["n1"]["path_score"] == pytest.approx(0.8) and p["n3"]["path_score"] == pytest.approx(0.5)


def test_max_rank_weighs_more_than_avg_rank():
    # A: 1 -> 4 (avg 2.5, max 4); B: 3 -> 3 (avg 3, max 3); C: 2 -> 2. max ranks A 5/6 B 1/2 C 1/6, avg ranks B 5/6 A 1/2
    spec = [
        ("n1", "n0", 1.0, 1.0, 1.0, None),
        ("n2", "n1", 4.0, 1.0, 1.0, "depth_limit"),
        ("n3", "n0", 3.0, 1.0, 1.0, None),
        ("n4", "n3", 3.0, 1.0, 1.0, "depth_limit"),
        ("n5", "n0", 2.0, 1.0, 1.0, None),
        ("n6", "n5", 2.0, 1.0, 1.0, "depth_limit"),
    ]
    doc = select(make_tree("maximize", spec))
    p = by_leaf(doc)
    assert p["n2"]["max_score_rank"] == pytest.approx(5 / 6) and p["n2"]["avg_score_rank"] == pytest.approx(
        0.5
    )
    assert p["n2"]["path_score"] == pytest.approx(0.35 * 5 / 6 + 0.25 * 0.5 + 0.4)  # 0.81667
    assert p["n4"]["path_score"] == pytest.approx(0.35 * 0.5 + 0.25 * 5 / 6 + 0.4)  # 0.78333
    assert p["n6"]["path_score"] == pytest.approx(0.5)
    assert [x["leaf"] for x in doc["paths"]] == ["n2", "n4", "n6"]


def test_equal_path_score_is_broken_by_max_score():
    # ranks .875/.625/.375/.125; n2: .6*.875+.2*.5+.2*.75 = .775 = n1: .6*.625+.2+.2
    spec = [
        ("n1", "n0", 3.0, 1.0, 1.0, "no_room"),
        ("n2", "n0", 4.0, 0.5, 0.75, "no_room"),
        ("n3", "n0", 2.0, 1.0, 1.0, "no_room"),
        ("n4", "n0", 1.0, 1.0, 1.0, "no_room"),
    ]
    doc = select(make_tree("maximize", spec), top_k=1)
    p = by_leaf(doc)
    assert p["n1"]["path_score"] == pytest.approx(0.775) and p["n2"]["path_score"] == pytest.approx(0.775)
    assert [p["leaf"] for p in doc["paths"]] == ["n2", "n1", "n3", "n4"]
    assert [p["selected"] for p in doc["paths"]] == [True, False, False, False]


def test_leaf_without_reason_and_bare_root():
    spec = [("n1", "n0", 2.0, 1.0, 1.0, None)]  # childless but not a normal leaf
    doc = select(make_tree("maximize", spec))
    assert doc["paths"] == [] and doc["excluded"][0]["leaf"] == "n1"
    bare = make_tree("maximize", [])
    assert select(bare)["paths"] == []


def test_mid_rank_matches_scipy_mean_kind():
    values = [3.0, 1.0, 3.0, 2.0, -1.0]
    for v in values:
        assert percentile_rank(v, values) == pytest.approx(percentileofscore(values, v, kind="mean") / 100)
    assert percentile_rank(5.0, [5.0]) == 0.5


def test_bad_tree_is_input_error():
    tree = make_tree("sideways", SPEC)
    with pytest.raises(InputError, match="direction"):
        select(tree)
    tree = make_tree("maximize", SPEC)
    tree["nodes"][4]["parent"] = "n99"
    with pytest.raises(InputError, match="n99"):
        select(tree)


def test_cli_writes_paths_json(tmp_path):
    tree_dir = tmp_path / "trees" / "eval-000001-agent-1-abc"
    tree_dir.mkdir(parents=True)
    (tree_dir / "tree.json").write_text(json.dumps(full_tree(make_tree("maximize", SPEC))))
    out = tree_dir / "paths.json"
    cmd = [
        sys.executable,
        "-m",
        "sftree",
        "select-paths",
        "--tree",
        str(tree_dir / "tree.json"),
        "--out",
        str(out),
    ]
    res = subprocess.run(cmd + ["--top-k", "1"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert [p["selected"] for p in doc["paths"]] == [True, False, False]
    assert doc["paths"][0]["leaf"] == "n3"
    res = subprocess.run(
        cmd[:-4] + ["--tree", str(tmp_path / "nope.json"), "--out", str(out)], capture_output=True, text=True
    )
    assert res.returncode == 2 and "nope.json" in res.stderr


def test_candidates_are_exactly_the_normal_leaves():
    """3.1 = 1.9: limit leaves count whatever the path; no_room and tree_stopped leaves only on a valid path (no
    edge kept after failing). Then a normal leaf is ranked only when all four metrics are computable."""
    spec = [
        ("n1", "n0", 2.0, 1.0, 1.0, None),  # e1 failed but was kept (fallback): paths below it are not valid
        ("n2", "n1", 2.5, 1.0, 0.6, "depth_limit"),  # normal (limit), metrics computable: ranked
        ("n3", "n1", 2.2, 1.0, 0.6, "no_room"),  # no room below a failed edge: not normal
        ("n4", "n0", 1.5, 1.0, 0.4, "tree_stopped"),  # valid path: normal
        ("n5", "n0", 1.1, 0.3, 0.4, "token_limit"),  # its own edge failed but was kept: limit leaf, normal
        ("n6", "n0", 1.3, 1.0, 0.4, "no_room"),  # valid path: normal
    ]
    tree = make_tree("maximize", spec)
    for e in tree["edges"]:
        e["failed"] = e["id"] in ("e1", "e5")
    doc = select(tree)
    assert sorted(p["leaf"] for p in doc["paths"]) == ["n2", "n4", "n5", "n6"]
    assert doc["excluded"] == [{"leaf": "n3", "reason": "not a normal leaf: no_room below failed edge e1"}]
    # max scores 2.5, 1.5, 1.1, 1.3 -> ranks .875, .625, .125, .375; avg 2.25, 1.5, 1.1, 1.3 -> the same ranks
    p = by_leaf(doc)
    assert p["n2"]["path_score"] == pytest.approx(0.6 * 0.875 + 0.2 * 1.0 + 0.2 * 0.8)
    assert p["n5"]["path_score"] == pytest.approx(0.6 * 0.125 + 0.2 * 0.3 + 0.2 * 0.4)


def test_path_metrics_use_full_precision():
    """Full floats in, full floats out: avg_cleanliness of (0.8 - 0.5/3, 0.8 - 1/3) is their exact mean, and two
    paths whose PathScores differ by 2e-8 (equal when cleanliness is rounded to 6 decimals) keep their order."""
    c1, c2 = 0.8 - 0.5 * 0.1 / 0.3, 0.8 - 0.5 * 0.2 / 0.3
    spec = [
        ("n1", "n0", 2.0, c1, 1.0, None),
        ("n2", "n1", 2.0, c2, 1.0, "depth_limit"),
        ("n3", "n0", 2.0, 0.7 + 1e-7, 1.0, "no_room"),
        ("n4", "n0", 2.0, 0.7 + 2e-7, 1.0, "no_room"),
    ]
    doc = select(make_tree("maximize", spec))
    p = by_leaf(doc)
    assert p["n2"]["avg_cleanliness"] == (c1 + c2) / 2
    assert p["n4"]["path_score"] - p["n3"]["path_score"] == pytest.approx(2e-8, rel=1e-3)
    assert [x["leaf"] for x in doc["paths"]][:2] == ["n4", "n3"]
