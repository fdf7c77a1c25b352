"""No function in src/ of 80 lines or more (issue 35, then all of src/): a longer one is several named steps run
together. Lines are counted as ast counts them, from the def line through the last line of the body."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "sftree"
MAX_LINES = 80  # a function has fewer

# (path under src/sftree, function name) allowed to be long for now; empty: every function is short
EXEMPT: set[tuple[str, str]] = set()


def _lengths() -> dict[tuple[str, str], list[tuple[int, int]]]:
    """(path, name) -> [(def line, lines)] of every function and method in src/sftree."""
    found: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.setdefault((rel, node.name), []).append(
                    (node.lineno, node.end_lineno - node.lineno + 1)
                )
    return found


def test_no_function_of_80_lines_or_more_in_src():
    long = [
        f"{rel}:{line} {name} ({n} lines)"
        for (rel, name), defs in sorted(_lengths().items())
        if (rel, name) not in EXEMPT
        for line, n in defs
        if n >= MAX_LINES
    ]
    assert long == []


def test_every_exempt_function_is_still_long():
    """An exemption goes once its function is split: one left behind would let the function grow back."""
    found = _lengths()
    stale = [
        f"{rel} {name}"
        for rel, name in sorted(EXEMPT)
        if not any(n >= MAX_LINES for _, n in found.get((rel, name), []))
    ]
    assert stale == []
