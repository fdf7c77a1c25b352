"""docs/outputs.md quotes only figures a run wrote: the block between its `figures:demo` markers is
`scripts/docs_figures.py`'s output on the demo run's files kept in docs/figures/demo/."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).parents[1]


def script():
    spec = importlib.util.spec_from_file_location("docs_figures", REPO / "scripts" / "docs_figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_docs_figures_are_the_scripts_output_on_the_demo_run():
    mod = script()
    stats, figures = mod.read(mod.SOURCE)
    assert stats["student"]["records"] == figures["records"] > 0  # a run measured under the Student
    assert mod.quoted((REPO / "docs" / "outputs.md").read_text()) == mod.block(stats, figures)


def test_the_script_rewrites_the_block(tmp_path):
    mod = script()
    stats, figures = mod.read(mod.SOURCE)
    stats = json.loads(json.dumps(stats))
    stats["student"]["tokens_trained"] += 1
    docs = mod.replace((REPO / "docs" / "outputs.md").read_text(), mod.block(stats, figures))
    assert f"| tokens trained | {stats['student']['tokens_trained']} |" in mod.quoted(docs)
    assert mod.quoted(docs) != mod.quoted((REPO / "docs" / "outputs.md").read_text())
