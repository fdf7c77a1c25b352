"""search/tree.py: save/load round trip through the JSON Schema, and errors that name the file and the field."""

import json

import pytest
from helpers.mcts import grow_root, new_tree

from sftree.errors import InputError
from sftree.search import tree as treemod


def test_round_trip_and_schema(tmp_path):
    tree = new_tree()
    grow_root(tree)
    path = tmp_path / "tree.live.json"
    treemod.save(tree, path)
    again = treemod.load(path)
    assert again.to_dict() == tree.to_dict()
    obj = json.loads(path.read_text())
    assert obj["version"] == 1 and obj["counters"]["valid_edges"] == 3 and obj["next_edge"] == 4
    assert list(tmp_path.iterdir()) == [path]  # atomic write leaves no temporary file


def test_schema_violation_names_file_and_field(tmp_path):
    tree = new_tree()
    grow_root(tree)
    obj = tree.to_dict()
    obj["nodes"][1]["status"] = "bogus"
    path = tmp_path / "tree.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(InputError, match=r"(?s)tree\.json.*nodes\.1\.status"):
        treemod.load(path)


def test_link_violation(tmp_path):
    tree = new_tree()
    grow_root(tree)
    obj = tree.to_dict()
    obj["nodes"][2]["parent"] = "n1"  # depth 1 under a depth-1 node, and its edge says n0
    with pytest.raises(InputError, match="n2"):
        treemod.validate_tree(obj, "x.json")
    obj = tree.to_dict()
    obj["edges"][0]["child"] = None  # an edge without node must be pruned (schema if/then)
    with pytest.raises(InputError):
        treemod.validate_tree(obj, "x.json")


def test_not_json(tmp_path):
    p = tmp_path / "tree.json"
    p.write_text("{")
    with pytest.raises(InputError, match="not valid JSON"):
        treemod.load(p)
