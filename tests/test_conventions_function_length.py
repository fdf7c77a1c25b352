"""No function over 80 lines in the floors that hold the records and the search and dataset stages (issue 35):
a longer one is several named steps run together."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "sftree"
MAX_LINES = 80


@pytest.mark.parametrize("folder", ["records", "search", "dataset"])
def test_no_function_over_80_lines(folder):
    long = []
    for path in sorted((SRC / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []
