#!/usr/bin/env python3
"""The house's design rules for src/sftree, in one place: each rule says what it keeps and lists what breaks it.

    python scripts/check_design.py            # every rule; exit 1 when any is broken
    python scripts/check_design.py --no-mypy  # the rules read from the source alone (a second, not a minute)

The suite runs it (tests/test_conventions_design.py, so the README's `pytest -q` and CI do); a newcomer reads the
rules here, their reasons in docs/architecture.md ("Floors and records"). The rules:

1. floors: a package imports only from its own floor or below, and a stage never imports another stage (it reads
   the other's records);
2. no-circle: no two modules import each other, directly or round a longer loop, counting imports inside
   functions and those under `TYPE_CHECKING` (which hides a circle from Python, not from the design): what both
   sides need moves below them;
3. one-owner: each file that crosses a stage is named (so opened) by exactly one module, its records/ module;
4. short-functions: no function of 80 lines or more (a longer one is several named steps run together);
5. no-probes: agents/ meets its collaborators through the Protocols of agents/base.py, never by getattr/hasattr;
6. one-http-client: teacher/transport.py is the only module that speaks HTTP as a client (teacher/http.py holds
   its connection classes and sends nothing);
7. typed: `mypy --strict` is clean over all of src/sftree: pyproject.toml's [tool.mypy] has no `exclude` and no
   override that reads a module of sftree silently or relaxes it (overrides are for outside libraries only).

Each rule's allowances are listed beside it with why; an allowance that no longer applies is itself reported,
so none outlives its reason.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "sftree"

# ---- 1. floors -------------------------------------------------------------------------------------------------
# The floors, top to bottom (docs/architecture.md): a package imports only from its own floor or below.
FLOORS: list[set[str]] = [
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
FLOOR_ALLOWED: dict[tuple[str, str], str] = {}  # (package, package it imports) left in place -> why

# ---- 2. no-circle ----------------------------------------------------------------------------------------------
# Circles left in place, each a frozenset of the modules on it -> why.
CIRCLE_ALLOWED: dict[frozenset[str], str] = {}

# ---- 3. one-owner ----------------------------------------------------------------------------------------------
OWNERS = {
    "metadata.json": "records/root.py",
    "tree.json": "records/tree.py",
    "tree.live.json": "records/tree.py",
    "tree.log.jsonl": "records/tree.py",
    "steps.jsonl": "records/steplog.py",
    "messages.jsonl": "records/steplog.py",
    "paths.json": "records/paths.py",
    "stages.tsv": "records/stages.py",
    "sft.jsonl": "records/sft.py",
    "sft.tree.jsonl": "records/tree_packed.py",
}
OWNER_ALLOWED = {
    # The Student run's snapshot folders (stage 1's input, not a record between sftree's stages): import-coral
    # writes them, select-roots' scan reads them in bulk with its own fast path (docs/select_roots.md, "Cost").
    ("metadata.json", "roots/import_coral.py"),
    ("metadata.json", "roots/snapshots.py"),
    # a label in messages (`source=`), not a path
    ("tree.json", "dataset/select_paths.py"),
}

# ---- 4. short-functions ----------------------------------------------------------------------------------------
MAX_LINES = 80  # a function has fewer, counted as ast counts them: from the def line through the body's last
LONG_ALLOWED: set[tuple[str, str]] = set()  # (path under src/sftree, function name) long for now

# ---- 5. no-probes ----------------------------------------------------------------------------------------------
PROBED = ["agents"]  # the packages that meet their collaborators through Protocols only
PROBES = {"getattr", "hasattr"}

# ---- 6. one-http-client ----------------------------------------------------------------------------------------
TRANSPORT = "teacher/transport.py"
WIRE = "teacher/http.py"  # the transport's connection classes
CLIENT_LIBS = ("requests", "urllib3", "http.client", "httpx", "aiohttp", "urllib.request", "pycurl")
SENDS = re.compile(r"\brequests\.(get|post|put|head|delete|patch|request|Session)\b|\.urlopen\(")


# ---- the source, read once ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """The Python files of one package tree (src/sftree, or a planted copy in a test), parsed."""

    root: Path

    def files(self) -> list[Path]:
        return sorted(self.root.rglob("*.py"))

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def tree(self, path: Path) -> ast.Module:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

    def module(self, path: Path) -> str:
        parts = path.relative_to(self.root).with_suffix("").parts
        return ".".join([self.root.name, *(parts[:-1] if parts[-1] == "__init__" else parts)])


def _package(src: Source, path: Path) -> str:
    parts = path.relative_to(src.root).parts
    return parts[0] if len(parts) > 1 else path.stem


def _sftree_imports(tree: ast.Module, name: str) -> Iterator[ast.ImportFrom | ast.Import]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == name or node.module.startswith(name + "."):
                yield node
        elif isinstance(node, ast.Import) and any(a.name.startswith(name + ".") for a in node.names):
            yield node


def check_floors(src: Source) -> list[str]:
    floor = {pkg: i for i, fl in enumerate(FLOORS) for pkg in fl}
    out = []
    for path in src.files():
        pkg = _package(src, path)
        if pkg == "__init__":
            continue
        if pkg not in floor:
            out.append(f"{src.rel(path)}: package {pkg} has no floor (add it to FLOORS)")
            continue
        used = set()
        for node in _sftree_imports(src.tree(path), src.root.name):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            used |= {n.split(".")[1] for n in names if n and "." in n}
        for other in sorted(used - {pkg}):
            if (pkg, other) in FLOOR_ALLOWED:
                continue
            if floor.get(other, -1) < floor[pkg]:
                out.append(f"{src.rel(path)}: imports {other}, a floor above {pkg}")
            elif pkg in STAGES and other in STAGES:
                out.append(f"{src.rel(path)}: stage {pkg} imports stage {other} (read its records instead)")
    return out


def import_graph(src: Source) -> dict[str, dict[str, int]]:
    """module -> {sftree module it imports: line}, every import counted (in functions, under TYPE_CHECKING)."""
    modules = {src.module(p): p for p in src.files()}
    graph: dict[str, dict[str, int]] = {}
    for mod, path in modules.items():
        edges: dict[str, int] = {}
        for node in _sftree_imports(src.tree(path), src.root.name):
            if isinstance(node, ast.ImportFrom):
                assert node.module is not None
                targets = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t if t in modules else node.module for t in targets]
            else:
                targets = [a.name for a in node.names]
            for t in targets:
                if t in modules and t != mod:
                    edges.setdefault(t, node.lineno)
        graph[mod] = edges
    return graph


def _circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def check_circles(src: Source) -> list[str]:
    graph = import_graph(src)
    out = []
    found = set()
    for group in _circles(graph):
        key = frozenset(group)
        found.add(key)
        if key in CIRCLE_ALLOWED:
            continue
        links = [f"{a} -> {b} (line {graph[a][b]})" for a in group for b in group if b in graph[a]]
        out.append("import circle: " + "; ".join(links))
    out += [f"allowed circle no longer there: {sorted(k)}" for k in CIRCLE_ALLOWED if k not in found]
    return out


def _string_names(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= {n for n in OWNERS if node.value == n or node.value.endswith("/" + n)}
    return found


def check_owners(src: Source) -> list[str]:
    users: dict[str, list[str]] = {name: [] for name in OWNERS}
    for path in src.files():
        for name in _string_names(src.tree(path)):
            users[name].append(src.rel(path))
    out = []
    for name, owner in OWNERS.items():
        if owner not in users[name]:
            out.append(f"{name}: its owner {owner} does not name it")
        out += [
            f"{name}: named by {u} (its owner is {owner})"
            for u in users[name]
            if u != owner and (name, u) not in OWNER_ALLOWED
        ]
    return out


def function_lengths(src: Source) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """(path, name) -> [(def line, lines)] of every function and method."""
    found: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for path in src.files():
        for node in ast.walk(src.tree(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                end = node.end_lineno or node.lineno
                found.setdefault((src.rel(path), node.name), []).append((node.lineno, end - node.lineno + 1))
    return found


def check_lengths(src: Source) -> list[str]:
    found = function_lengths(src)
    out = [
        f"{rel}:{line} {name} ({n} lines)"
        for (rel, name), defs in sorted(found.items())
        if (rel, name) not in LONG_ALLOWED
        for line, n in defs
        if n >= MAX_LINES
    ]
    out += [
        f"allowed long function no longer long: {rel} {name}"
        for rel, name in sorted(LONG_ALLOWED)
        if not any(n >= MAX_LINES for _, n in found.get((rel, name), []))
    ]
    return out


def check_probes(src: Source) -> list[str]:
    out = []
    for pkg in PROBED:
        files = sorted((src.root / pkg).glob("*.py"))
        if not files:
            out.append(f"{pkg}: no such package")
        for path in files:
            out += [
                f"{src.rel(path)}:{node.lineno} {node.func.id}"
                for node in ast.walk(src.tree(path))
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PROBES
            ]
    return out


def _client_imports(tree: ast.Module) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        out |= {n for n in names if any(n == lib or n.startswith(lib + ".") for lib in CLIENT_LIBS)}
    return out


def check_http(src: Source) -> list[str]:
    out = []
    senders = set()
    for path in src.files():
        rel = src.rel(path)
        libs = _client_imports(src.tree(path))
        if libs and rel not in (TRANSPORT, WIRE):
            out.append(f"{rel}: imports an HTTP client ({', '.join(sorted(libs))})")
        if SENDS.search(path.read_text(encoding="utf-8")):
            senders.add(rel)
    out += [f"{rel}: sends HTTP requests (only {TRANSPORT} does)" for rel in sorted(senders - {TRANSPORT})]
    if TRANSPORT not in senders and (src.root / TRANSPORT).exists():
        out.append(f"{TRANSPORT}: sends nothing (the rule names the wrong module)")
    return out


def unchecked(mypy: dict[str, object]) -> list[str]:
    """What in pyproject.toml's [tool.mypy] leaves a module of sftree out of the check or its errors unreported:
    an `exclude`, or an override that reads sftree's modules silently (`follow_imports = "silent"`,
    `ignore_errors`); an override for an outside library (`ignore_missing_imports`) is not one."""
    out = [f"exclude {mypy['exclude']!r}"] if mypy.get("exclude") else []
    overrides = mypy.get("overrides", [])
    for o in overrides if isinstance(overrides, list) else []:
        if isinstance(o, dict) and (o.get("follow_imports") == "silent" or o.get("ignore_errors") is True):
            out.append(f"an override silencing {o.get('module')!r}")
        elif isinstance(o, dict) and any(str(m).startswith("sftree") for m in _as_list(o.get("module", []))):
            out.append(f"an override for sftree's own {o.get('module')!r}")
    return out


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else [value]


def check_types(src: Source) -> list[str]:
    mypy = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    out = []
    if mypy.get("files") != ["src/sftree"] or mypy.get("strict") is not True:
        out.append("pyproject.toml [tool.mypy]: files must be ['src/sftree'] and strict true")
    out += [
        f"pyproject.toml [tool.mypy]: {what} (every module of src/sftree is checked)"
        for what in unchecked(mypy)
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0 or "Success" not in proc.stdout:
        out += [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    return out


@dataclass(frozen=True)
class Rule:
    name: str
    what: str
    check: Callable[[Source], list[str]]


RULES = [
    Rule("floors", "a package imports only its own floor or below; no stage imports another", check_floors),
    Rule(
        "no-circle", "no import circle, counting imports in functions and under TYPE_CHECKING", check_circles
    ),
    Rule("one-owner", "each file that crosses a stage is named by its records/ module alone", check_owners),
    Rule("short-functions", f"no function of {MAX_LINES} lines or more", check_lengths),
    Rule("no-probes", f"no getattr/hasattr in {', '.join(PROBED)} (Protocols, not probes)", check_probes),
    Rule("one-http-client", f"only {TRANSPORT} speaks HTTP as a client", check_http),
    Rule("typed", "mypy --strict is clean over all of src/sftree, no module left out", check_types),
]


def run(src: Source, rules: list[Rule], out: Callable[[str], None] = print) -> int:
    """Check each rule, print it and what breaks it; the number of rules broken."""
    broken = 0
    for rule in rules:
        problems = rule.check(src)
        out(f"{'ok  ' if not problems else 'FAIL'} {rule.name}: {rule.what}")
        for p in problems:
            out(f"       {p}")
        broken += bool(problems)
    return broken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-mypy", action="store_true", help="skip the type check (rule `typed`)")
    args = parser.parse_args(argv)
    rules = [r for r in RULES if not (args.no_mypy and r.name == "typed")]
    broken = run(Source(SRC), rules)
    print(f"{len(rules) - broken} of {len(rules)} rules kept")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
