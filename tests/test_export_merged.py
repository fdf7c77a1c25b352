"""The merged form (`export.granularity: merged`): a record per run of consecutive well-formed steps of one session,
each step's completion trained once, in exactly the context its step record gives it, at a fraction of the tokens
of the step form; cut before ill-formed steps and where the Student's template rewrites earlier turns."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from helpers.export import make_results, write_edge
from test_export_student import QWEN, model, paths_of, student

from sftree.dataset.card import dataset_card
from sftree.dataset.export import export_task
from sftree.dataset.stats import ExportStats, MergeStats
from sftree.dataset.trainer_labels import token_labels, trained_indices
from sftree.records.sft import schema_problem

REPO = Path(__file__).parents[1]


def trained_messages(records: list[dict]) -> Counter:
    """(step id, its context, the trained message) for every trained message of the records, counted."""
    out: Counter = Counter()
    for r in records:
        msgs, trained = trained_indices(r)
        ids = r["metadata"].get("steps") or [r["metadata"]["id"]]
        assert len(ids) == len(trained)
        for sid, k in zip(ids, trained, strict=True):
            assert msgs[k]["role"] == "assistant"
            out[json.dumps([sid, msgs[:k], msgs[k]], sort_keys=True)] += 1
    return out


@pytest.fixture
def faulty(tmp_path):
    """The fixture tree with an ill-formed step (e2 turn 2 step 1: malformed arguments)."""
    return paths_of(make_results(tmp_path / "results", reasoning=False))


@pytest.mark.parametrize("measured", [False, True], ids=["no-student", "student"])
def test_merged_trains_each_step_completion_once_in_its_context(faulty, measured):
    st = student(QWEN) if measured else None
    steps, _ = export_task([faulty], "step", student=st)
    merged, stats = export_task([faulty], "merged", student=st)
    assert trained_messages(merged) == trained_messages(steps)
    assert max(trained_messages(merged).values()) == 1
    assert len(merged) < len(steps) and stats.records == len(merged)
    for r in merged:
        assert schema_problem(r) is None
        msgs, trained = trained_indices(r)
        # every assistant message from the first trained one on is trained: no ill-formed step inside a run
        assert [i for i, m in enumerate(msgs) if m["role"] == "assistant" and i >= trained[0]] == trained
        assert trained[-1] == len(msgs) - 1  # a record ends on its last trained message
    # the run that meets e2's ill-formed step ends before it; the next one starts after it, with it as context
    bad = [r for r in merged if any("_raw" in json.dumps(m) for m in r["messages"])]
    assert bad and all(r["metadata"]["history_excluded"] == 1 for r in bad)


def test_merged_processes_a_fraction_of_the_step_forms_tokens(faulty):
    st = student(QWEN)
    s = export_task([faulty], "step", student=st)[1].student
    m = export_task([faulty], "merged", student=st)[1].student
    assert m.trained == s.trained > 0
    # measured: 1895 of 5462 tokens on this fixture (3 records of 11 steps)
    assert m.processed < 0.4 * s.processed
    assert (
        m.as_steps == s.processed == s.as_steps
    )  # what the step form would cost, counted by the merged export
    card = dataset_card(
        [], "sft.jsonl", merged=MergeStats(export=ExportStats(granularity="merged", student=m))
    )
    assert f"would cost {s.processed} tokens processed" in card
    assert f"process {m.processed / s.processed:.1%} of that" in card


def long_session(tmp_path: Path, steps: int) -> Path:
    """A tree of one path, one edge of 2 turns x `steps` steps: a long session."""
    base = make_results(tmp_path / "results", faults={}, reasoning=False)
    system = [{"role": "system", "content": "You are a Coral agent."}]
    write_edge(base, "e1", system, steps_per_turn=steps, reasoning=False)
    return paths_of(base)


def test_a_long_session_is_one_record_whose_cost_grows_linearly(tmp_path):
    st = student(QWEN)
    pf = long_session(tmp_path, 30)
    s = export_task([pf], "step", student=st)[1].student
    m = export_task([pf], "merged", student=st)[1].student
    assert m.trained == s.trained
    # the step form processes the session once per step: ~n/2 times the merged form's tokens
    assert s.processed / m.processed > 10


def test_a_template_that_rewrites_earlier_turns_cuts_the_run(tmp_path):
    """A template that shows only the last assistant message's reasoning (as Qwen3's drops earlier reasoning): the
    tokens of a step with reasoning are no prefix of the next step's, so the run ends after it."""
    from gguf import GGUFReader

    chat = GGUFReader(str(model(QWEN))).fields["tokenizer.chat_template"].contents()
    rewrite = chat.replace(
        "{%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}",
        "{%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}"
        "{%- if message.reasoning_content and loop.last %}{{- '\\n<think>' + message.reasoning_content + "
        "'</think>' }}{%- endif %}",
    )
    assert rewrite != chat
    template = tmp_path / "last_reasoning.jinja"
    template.write_text(rewrite)
    pf = paths_of(make_results(tmp_path / "results", faults={}, reasoning=True))
    st = student(QWEN, template=str(template))
    steps, _ = export_task([pf], "step", student=st)
    merged, _ = export_task([pf], "merged", student=st)
    assert trained_messages(merged) == trained_messages(steps)
    for r in merged:  # a message with reasoning is the last trained one of its record
        msgs, trained = trained_indices(r)
        assert all(not msgs[k].get("reasoning_content") for k in trained[:-1])
    # without the Student only the messages are compared: one run per path, which the trainer's labels refuse
    loose, _ = export_task([pf], "merged")
    assert len(loose) < len(merged)
    with pytest.raises(ValueError, match="renders message .* differently once later messages follow"):
        for r in loose:
            token_labels(r, StudentTokenizer(st))


class StudentTokenizer:
    """sftree's Student as a transformers tokenizer (`apply_chat_template`, `__call__`), for `token_labels`."""

    def __init__(self, st):
        self.st = st

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False):
        return self.st.render(messages, tools, generation=add_generation_prompt)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": self.st.tokenizer.encode(text, add_special_tokens=False).ids}


@pytest.mark.parametrize("form", ["step", "merged"])
def test_token_labels_mark_exactly_the_trained_tokens(faulty, form):
    st = student(QWEN)
    records, stats = export_task([faulty], form, student=st)
    tok = StudentTokenizer(st)
    total = 0
    for r in records:
        out = token_labels(r, tok)
        t = r["metadata"]["student_tokens"]
        assert (
            len(out["input_ids"]) == t["total_tokens"]
            and sum(out["completion_mask"]) == t["completion_tokens"]
        )
        # the marked tokens decode to the trained messages' rendered text, each in turn
        msgs, trained = trained_indices(r)
        text = "".join(
            st.render(msgs[: k + 1], r["tools"], False)[len(st.render(msgs[:k], r["tools"], True)) :]
            for k in trained
        )
        marked = [i for i, b in zip(out["input_ids"], out["completion_mask"], strict=True) if b]
        assert st.tokenizer.decode(marked, skip_special_tokens=False) == text
        total += sum(out["completion_mask"])
    assert total == stats.student.trained


def test_config_accepts_the_merged_form():
    from sftree.config import load_config

    assert (
        load_config(REPO / "config.yaml", {"export": {"granularity": "merged"}})["export"]["granularity"]
        == "merged"
    )


def test_cli_and_merge_write_the_merged_form(faulty, tmp_path):
    import subprocess
    import sys

    from sftree.dataset.merge import merge

    out = tmp_path / "results" / "circle_packing" / "sft.jsonl"
    exe = [sys.executable, "-m", "sftree", "export-sft", "--paths", str(faulty), "--out", str(out)]
    res = subprocess.run([*exe, "--granularity", "merged"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert records and {r["metadata"]["granularity"] for r in records} == {"merged"}
    card, lf = tmp_path / "card.md", tmp_path / "sft_llamafactory.jsonl"
    stats = merge([str(out)], str(tmp_path / "sft.jsonl"), None, str(card), str(lf))
    # LLaMA-Factory's converter would train the context's assistant turns too: not in its copy, counted
    assert stats.llamafactory_left_out == len(records) and lf.read_text() == ""
    text = card.read_text()
    assert "only the assistant messages at `metadata.trained` are trained" in text and "token_labels" in text
    # duplicates are counted per trained message, as in the step form of the same export
    step = subprocess.run([*exe[:-2], "--out", str(tmp_path / "step.jsonl")], capture_output=True, text=True)
    assert step.returncode == 0, step.stderr
    step_stats = merge([str(tmp_path / "step.jsonl")], str(tmp_path / "sft_step.jsonl"), None, None)
    assert stats.duplicates == step_stats.duplicates > 0
