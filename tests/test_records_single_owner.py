"""Each file that crosses a stage is named (so opened) by exactly one module under src/sftree: its records/ module.

A string constant equal to the file name, or ending in `/<name>`, outside that module is a second owner in the
making. The allowed exceptions are listed with why."""

import ast
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "sftree"

OWNERS = {
    "metadata.json": "records/root.py",
    "tree.json": "records/tree.py",
    "tree.live.json": "records/tree.py",
    "tree.log.jsonl": "records/tree.py",
    "steps.jsonl": "records/steplog.py",
    "messages.jsonl": "records/steplog.py",
    "paths.json": "records/paths.py",
    "sft.jsonl": "records/sft.py",
    "sft.tree.jsonl": "records/tree_packed.py",
}
ALLOWED = {
    # The Student run's snapshot folders (stage 1's input, not a record between sftree's stages): import-coral
    # writes them, select-roots' scan reads them in bulk with its own fast path (docs/select_roots.md, "Cost").
    ("metadata.json", "roots/import_coral.py"),
    ("metadata.json", "roots/snapshots.py"),
    # a label in messages (`source=`), not a path
    ("tree.json", "dataset/select_paths.py"),
}


@cache
def _names(path: Path) -> frozenset[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for name in OWNERS:
                if node.value == name or node.value.endswith("/" + name):
                    found.add(name)
    return frozenset(found)


@pytest.mark.parametrize("name", sorted(OWNERS))
def test_one_module_names_each_record_file(name):
    users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if name in _names(p))
    others = [u for u in users if u != OWNERS[name] and (name, u) not in ALLOWED]
    assert OWNERS[name] in users and others == []
