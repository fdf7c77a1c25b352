"""A stage reads another stage's output through sftree.records, never by importing that stage; records/ itself
stands on the leaf helpers only (docs/architecture.md, "Floors and records")."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "sftree"

# The floors, top to bottom (docs/architecture.md): a package imports only from its own floor or below, and a
# stage never imports another stage (it reads the other's records).
FLOORS = [
    {"cli", "__main__"},
    {"roots", "search", "dataset", "report"},
    {"agents"},
    {"teacher"},
    {"world"},
    {"runtime"},
    {"records"},
    {
        "errors",
        "fileio",
        "config",
        "settings",
        "svg",
        "safeparse",
        "display",
        "progress",
        "httpserver",
        "jsontypes",
    },
]
STAGES = FLOORS[1]
FLOOR = {pkg: i for i, floor in enumerate(FLOORS) for pkg in floor}
# Left in place, with the reason.
ALLOWED: dict[tuple[str, str], str] = {}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sftree."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("sftree.")}
    return out


def _package(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


@pytest.mark.parametrize("folder", sorted(FLOOR))
def test_package_imports_only_its_floor_or_below(folder):
    files = sorted((SRC / folder).rglob("*.py")) if (SRC / folder).is_dir() else [SRC / f"{folder}.py"]
    assert files and all(f.exists() for f in files), f"no package or module {folder} in {SRC}"
    bad = {}
    for path in files:
        up = {
            pkg
            for pkg in _imports(path) - {folder}
            if (folder, pkg) not in ALLOWED
            and (FLOOR.get(pkg, -1) < FLOOR[folder] or (folder in STAGES and pkg in STAGES))
        }
        if up:
            bad[str(path.relative_to(SRC))] = sorted(up)
    assert bad == {}


def test_every_package_has_a_floor():
    found = {_package(p) for p in SRC.rglob("*.py")} - {"__init__"}
    assert found - set(FLOOR) == set()
