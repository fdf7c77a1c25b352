"""The house's design rules (scripts/check_design.py: floors, no import circle, one owner per file, short functions,
no probes, one HTTP client, mypy --strict) hold over src/sftree; and each rule finds what breaks it, planted in a
small package of its own."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "check_design.py"


def _load():
    spec = importlib.util.spec_from_file_location("check_design", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_design"] = module  # (dataclasses look their module up by name)
    spec.loader.exec_module(module)
    return module


design = _load()


def test_src_keeps_every_design_rule():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rules = [ln for ln in proc.stdout.splitlines() if ln.startswith(("ok", "FAIL"))]
    assert [ln.split()[1].rstrip(":") for ln in rules] == [r.name for r in design.RULES]
    assert all(ln.startswith("ok") for ln in rules)


def test_src_keeps_the_rules_read_from_the_source():
    """The fast tier's share (the type check, half a minute, runs in the whole suite above)."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--no-mypy"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(design.RULES) - 1} of {len(design.RULES) - 1} rules kept" in proc.stdout


def _plant(tmp_path: Path, files: dict[str, str]) -> object:
    root = tmp_path / "sftree"
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(text)
    return design.Source(root)


def test_floors_finds_an_import_upwards_and_a_stage_importing_a_stage(tmp_path):
    src = _plant(
        tmp_path,
        {
            "records/a.py": "from sftree.search import tree\n",
            "search/tree.py": "from sftree.dataset import x\n",
            "dataset/x.py": "from sftree.records import a\n",
            "gadgets.py": "",
        },
    )
    assert design.check_floors(src) == [
        "gadgets.py: package gadgets has no floor (add it to FLOORS)",
        "records/a.py: imports search, a floor above records",
        "search/tree.py: stage search imports stage dataset (read its records instead)",
    ]


@pytest.mark.parametrize("where", ["top", "function", "type_checking"])
def test_no_circle_finds_a_circle_however_it_is_imported(tmp_path, where):
    back = {
        "top": "from sftree.runtime import store\n",
        "function": "def f():\n    from sftree.runtime import store\n",
        "type_checking": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sftree.runtime.store import S\n",
    }[where]
    src = _plant(
        tmp_path,
        {"runtime/store.py": "from sftree.runtime.workspace import W\n", "runtime/workspace.py": back},
    )
    (problem,) = [p for p in design.check_circles(src) if not p.startswith("allowed circle no longer there")]
    assert problem.startswith("import circle: sftree.runtime.store -> sftree.runtime.workspace (line 1);")
    assert "sftree.runtime.workspace -> sftree.runtime.store" in problem


def test_no_circle_reports_an_allowance_whose_circle_is_gone(tmp_path, monkeypatch):
    gone = frozenset({"sftree.dataset.student", "sftree.dataset.pretokenize"})
    monkeypatch.setattr(design, "CIRCLE_ALLOWED", {gone: "a circle since cut"})
    src = _plant(
        tmp_path, {"dataset/student.py": "", "dataset/pretokenize.py": "from sftree.dataset import student\n"}
    )
    assert design.check_circles(src) == [
        "allowed circle no longer there: ['sftree.dataset.pretokenize', 'sftree.dataset.student']"
    ]


def test_one_owner_finds_a_second_module_naming_a_record_file(tmp_path):
    owners = {f"{owner}": f"NAME = {name!r}\n" for name, owner in design.OWNERS.items()}
    owners["records/tree.py"] = "A, B, C = 'tree.json', 'tree.live.json', 'tree.log.jsonl'\n"
    owners["records/steplog.py"] = "A, B = 'steps.jsonl', 'messages.jsonl'\n"
    src = _plant(tmp_path, {**owners, "dataset/export.py": "OUT = 'results/x/paths.json'\n"})
    assert design.check_owners(src) == [
        "paths.json: named by dataset/export.py (its owner is records/paths.py)"
    ]


def test_short_functions_finds_a_function_of_80_lines(tmp_path):
    body = "".join("    x = 1\n" for _ in range(78))
    src = _plant(tmp_path, {"a.py": f"def short():\n{body}\n\ndef long():\n{body}    return x\n"})
    assert design.check_lengths(src) == ["a.py:82 long (80 lines)"]


def test_no_probes_finds_getattr_in_agents(tmp_path):
    src = _plant(
        tmp_path, {"agents/base.py": "def f(teacher):\n    return getattr(teacher, 'max_tokens', 0)\n"}
    )
    assert design.check_probes(src) == ["agents/base.py:2 getattr"]


def test_one_http_client_finds_a_second_client(tmp_path):
    src = _plant(
        tmp_path,
        {
            "teacher/transport.py": "import requests\nrequests.post('u')\n",
            "teacher/http.py": "import urllib3\n",
            "world/fetch.py": "import urllib.request\nurllib.request.urlopen('u')\n",
        },
    )
    assert design.check_http(src) == [
        "world/fetch.py: imports an HTTP client (urllib.request)",
        "world/fetch.py: sends HTTP requests (only teacher/transport.py does)",
    ]


def test_typed_refuses_an_exclude_and_any_override_that_quiets_sftrees_own_modules():
    mypy = {
        "exclude": [r"^src/sftree/dataset/a\.py$"],
        "overrides": [
            {"module": ["coral", "coral.*"], "ignore_missing_imports": True},
            {"module": ["torch", "torch.*"], "ignore_missing_imports": True},
            {"module": ["sftree.dataset.a"], "follow_imports": "silent"},
            {"module": "sftree.x", "ignore_errors": True},
            {"module": ["sftree.y"], "disallow_untyped_defs": False},
        ],
    }
    assert design.unchecked(mypy) == [
        "exclude " + repr([r"^src/sftree/dataset/a\.py$"]),
        "an override silencing ['sftree.dataset.a']",
        "an override silencing 'sftree.x'",
        "an override for sftree's own ['sftree.y']",
    ]
    assert (
        design.unchecked({"overrides": [{"module": ["torch", "torch.*"], "ignore_missing_imports": True}]})
        == []
    )
