"""The fast tier (README: `pytest -q -m "not slow"`; docs/architecture.md "Tests"): it leaves out what is slow and
still reaches every module of sftree; the measured-slow list names tests that exist."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers.tiers import FAST_COMMAND, MEASURED, SLOW_MARKERS

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
# run as programs (by path, in a sandbox or a subprocess), never imported: reached by the tests that run them
PROGRAMS = re.compile(r"(_main|__main__|\.toolbox|\.opencode_driver)$|\.standin_pkg\b")
# torch only, imported where the trainer runs (never by sftree's own venv): tests/test_tree_trainer.py in the trainer's
TRAINER_ONLY = {
    "sftree.dataset.tree_collator",
    "sftree.dataset.tree_attention",
    "sftree.dataset.tree_loss",
    "sftree.dataset.distill_loss",
    "sftree.dataset.distill_collator",
}


def test_measured_entries_name_tests_that_exist():
    for entry in MEASURED:
        file, _, test = entry.partition("::")
        assert (REPO / file).is_file(), entry
        name = test.split("[", 1)[0]
        if name:
            assert re.search(rf"^def {re.escape(name)}\(", (REPO / file).read_text(), re.M), entry


def _module_of(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    """The sftree modules (and tests/helpers modules, as `helpers.x`) a file imports, or names to import later
    (cli.py registers its commands by module name)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)
    return {m for m in out if m in known}


def _reached(test_files: set[Path]) -> set[str]:
    files = {_module_of(p): p for p in SRC.rglob("*.py")}
    files |= {f"helpers.{p.stem}": p for p in (REPO / "tests" / "helpers").glob("*.py")}
    known = set(files)
    todo = set().union(*(_imports(p, known) for p in test_files))
    seen: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        parents = {".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 1)}
        todo |= (_imports(files[mod], known) | (parents & known)) - seen
    return {m for m in seen if m.startswith("sftree")}


@pytest.mark.slow  # collects the whole suite (half a minute on 2 cores)
def test_fast_command_as_written_leaves_out_the_slow_and_reaches_every_module():
    proc = subprocess.run(
        [*shlex.split(FAST_COMMAND), "--collect-only"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ids = [ln for ln in proc.stdout.splitlines() if "::" in ln]
    assert ids and re.search(r"\d+/\d+ tests collected \(\d+ deselected\)", proc.stdout), proc.stdout[-500:]
    assert not set(ids) & set(MEASURED)
    marked = subprocess.run(
        [*shlex.split(FAST_COMMAND.replace('"not slow"', f'"{" or ".join(SLOW_MARKERS)}"')), "--collect-only"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    ).stdout  # fmt: skip
    assert not set(ids) & {ln for ln in marked.splitlines() if "::" in ln}
    reached = _reached({REPO / i.split("::", 1)[0] for i in ids})
    modules = {_module_of(p) for p in (SRC / "sftree").rglob("*.py")}
    missing = sorted(m for m in modules - reached - TRAINER_ONLY if not PROGRAMS.search(m))
    assert missing == [], f"modules no fast test imports (directly or through what it imports): {missing}"
