"""The modules the trainer venv imports (tests/trainer/*.py, with `PYTHONPATH=src`: the tree form's packing,
collator, mask and loss, the distillation loss, the labels) import without the project's own dependencies the
trainer venv lacks (jsonschema, snakemake): a type imported for an annotation only stays under `TYPE_CHECKING`.
Fast: run in this venv with those packages made unimportable, so the tier catches what the trainer tests would."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]
ABSENT = ("jsonschema", "snakemake")


def trainer_imports() -> list[str]:
    found = set()
    for script in (REPO / "tests" / "trainer").glob("*.py"):
        found |= set(re.findall(r"^\s*from (sftree[\w.]*) import", script.read_text(), re.M))
    return sorted(found)


def test_the_trainer_venvs_modules_import_without_jsonschema():
    modules = trainer_imports()
    assert "sftree.dataset.tree_packed" in modules and "sftree.dataset.tree_loss" in modules
    code = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in ABSENT)
    # torch is the trainer venv's; here a module that needs it is only checked as far as that import
    code += "import importlib\nfor m in " + repr(modules) + ":\n"
    code += "    try:\n        importlib.import_module(m)\n"
    code += "    except ModuleNotFoundError as e:\n        if e.name != 'torch': raise\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
