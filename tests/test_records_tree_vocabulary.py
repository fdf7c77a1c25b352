"""The tree's words are defined once (records/tree.py) and the schema says the same; `read_tree` gives the typed tree."""

from __future__ import annotations

import dataclasses
import json
import typing

import pytest

from sftree.agents.base import TurnOutcome
from sftree.errors import InputError
from sftree.records import tree as rt
from sftree.search import mcts
from sftree.search import tree as treemod
from sftree.search.result import TurnResult


def _enum(schema: dict, *path: str) -> set:
    node = schema
    for key in path:
        node = node[key]
    return set(node["enum"]) - {None}


@pytest.mark.parametrize(
    ("path", "words"),
    [
        (("properties", "direction"), rt.DIRECTIONS),
        (("properties", "status"), rt.TREE_STATUSES),
        (("properties", "stop_reason"), rt.STOP_REASONS),
        (("$defs", "node", "properties", "status"), rt.NODE_STATUSES),
        (("$defs", "node", "properties", "leaf_reason"), rt.LEAF_REASONS),
        (("$defs", "edge", "properties", "prune_reason"), rt.PRUNE_REASONS),
        (("$defs", "edge", "properties", "fail_reason"), rt.PRUNE_REASONS),
        (("$defs", "turn", "properties", "ended"), rt.TURN_ENDS),
    ],
)
def test_schema_enums_are_the_vocabularies(path, words):
    schema = json.loads(rt.TREE_SCHEMA.read_text())
    assert _enum(schema, *path) == set(words), path
    assert len(set(words)) == len(words)


@pytest.mark.parametrize(("name", "record"), [("node", rt.Node), ("edge", rt.Edge), ("turn", rt.Turn)])
def test_schema_describes_each_field_of_the_one_record(name, record):
    """tree.schema.json names exactly the fields of records/tree.py's record (declared once: the search holds the
    same records), and requires only fields it has."""
    part = json.loads(rt.TREE_SCHEMA.read_text())["$defs"][name]
    fields = [f.name for f in dataclasses.fields(record)]
    assert sorted(part["properties"]) == sorted(fields)
    assert set(part["required"]) <= set(fields)


def test_the_search_holds_the_tree_records_and_its_turns_are_them():
    """One declaration of each: the live tree's nodes and edges are records/tree.py's, an edge's turns its `Turn`."""
    assert (treemod.Node, treemod.Edge, TurnResult) == (rt.Node, rt.Edge, rt.Turn)
    assert mcts.Select is rt.Select
    for record in (rt.Node, rt.Edge, rt.Turn):
        assert record.__dataclass_params__.frozen


def test_turn_ends_are_one_vocabulary_for_backends_and_search():
    """A backend's outcome and the search's turn record take the same words (edge_error included: a backend ends a
    turn with it when its session breaks; a turn read from a partial tree may have none)."""
    hints = [typing.get_type_hints(cls)["ended"] for cls in (TurnOutcome, TurnResult)]
    assert hints == [rt.TurnEnd, rt.TurnEnd | None]
    assert "edge_error" in rt.TURN_ENDS and "tampered" in rt.TURN_ENDS
    assert typing.get_type_hints(mcts.fail_reason)["return"] == rt.PruneReason | None
    assert typing.get_type_hints(mcts.stop_reason)["return"] == rt.StopReason | None


def _doc() -> dict:
    node = {"id": "n0", "parent": None, "edge": None, "depth": 0, "score": 1.5}
    child = {"id": "n1", "parent": "n0", "edge": "e1", "depth": 1, "score": 2.0, "leaf_reason": "depth_limit"}
    edge = {"id": "e1", "parent": "n0", "child": "n1", "turns": [{"turn": 1, "score": 2.0, "ended": "eval"}]}
    return {"version": 1, "task": "t", "direction": "maximize", "nodes": [node, child], "edges": [edge]}


def test_typed_tree_reads_attributes(tmp_path):
    path = tmp_path / "tree.json"
    rt.write_tree(path, _doc())
    tree = rt.read_tree(path, check=False)
    assert isinstance(tree, rt.Tree) and tree.root_node is not None and tree.root_node.score == 1.5
    assert tree.node("n1") is not None and tree.node("n1").leaf_reason == "depth_limit"
    assert tree.edges[0].turns[0].ended == "eval" and tree.node("n9") is None
    with pytest.raises(AttributeError):
        tree.edges[0].child = None  # frozen: a reader cannot change what it read
    with pytest.raises(InputError, match=str(path)):
        rt.read_tree(path)  # checked: the schema wants every field


def test_upgrade_refuses_a_newer_tree(tmp_path):
    path = tmp_path / "tree.json"
    rt.write_tree(path, dict(_doc(), version=rt.VERSION + 1))
    with pytest.raises(InputError, match="newer"):
        rt.read_tree(path, check=False)
    assert rt.upgrade(_doc()) == _doc()


def test_a_tree_without_node_objects_is_an_input_error():
    with pytest.raises(InputError, match="nodes"):
        rt.Tree.from_doc({"nodes": "n0", "edges": []}, "x.json")
