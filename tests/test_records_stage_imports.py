"""A stage reads another stage's output through sftree.records, never by importing that stage; records/ itself
stands on the leaf helpers only (docs/architecture.md, "Floors and records")."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "sftree"

# folder -> sftree packages it must not import (function-local imports included)
FORBIDDEN = {
    "records": {"roots", "search", "dataset", "report", "agents", "teacher", "world", "runtime", "cli"},
    "search": {"roots", "dataset", "report", "cli"},  # stage 2: the root check is records.root's
    "dataset": {"roots", "search", "cli"},  # stages 3-4: tree.json, paths.json and steps through records/
    "agents": {"search", "roots", "dataset", "report"},  # the agents write step records through records/
}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sftree."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("sftree.")}
    return out


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_folder_imports_no_stage_above_or_beside(folder):
    bad = {
        str(p.relative_to(SRC)): sorted(_imports(p) & FORBIDDEN[folder])
        for p in sorted((SRC / folder).rglob("*.py"))
    }
    assert {k: v for k, v in bad.items() if v} == {}
