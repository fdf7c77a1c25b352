"""agents/ uses its collaborators (the Teacher's client, the turn and its box, a backend) through their interfaces
(agents/base.py: `Teacher`, `TurnRun`, `AgentBackend`, which mypy checks), never by probing them: no getattr or
hasattr call in src/sftree/agents (issue 43, "Interfaces, not probes")."""

from __future__ import annotations

import ast
from pathlib import Path

AGENTS = Path(__file__).resolve().parents[1] / "src" / "sftree" / "agents"
PROBES = {"getattr", "hasattr"}


def _probes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        f"{path.name}:{node.lineno} {node.func.id}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PROBES
    ]


def test_agents_probe_no_object_with_getattr_or_hasattr():
    files = sorted(AGENTS.glob("*.py"))
    assert files
    assert [p for f in files for p in _probes(f)] == []


def test_a_probe_is_found(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(teacher):\n    return getattr(teacher, 'max_tokens', 0)\n")
    assert _probes(probe) == ["probe.py:2 getattr"]
