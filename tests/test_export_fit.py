"""Fitting records to the Student's chat template (dataset/fit.py, dataset/student.py): adaptations chosen by what
a template renders, consistent within a record; `{% generation %}` marks the trained span as transformers marks
it; a last turn rendered differently trains the message's own text; strict refuses. A small real Student
(helpers/student.py) with hand-written templates, each showing one limit."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.student import make_student

from sftree.dataset.fit import PROBE, PROBE_TOOLS, Fit, fit_record, new_id
from sftree.dataset.rendering import Unfit, text_span
from sftree.dataset.student import render_turn, with_template

pytest.importorskip("tokenizers", reason="tokenizers not installed (pyproject.toml pins it)")

# Mistral's id rule, and the call rendered alone (Llama 3.x's way), no reasoning: the fit needs call_ids, call_only
# and no_reasoning
MISTRAL_LIKE = (
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}"
    "{% for tc in m.tool_calls %}{% if tc.id|length != 9 %}{{ raise_exception('ids must be 9') }}{% endif %}"
    "[CALL]{{ tc.function.name }}{{ tc.function.arguments|tojson }}{{ tc.id }}{% endfor %}</s>"
    "{% elif m.role == 'tool' %}[RES]{{ m.tool_call_id }}{{ m.content }}"
    "{% else %}[{{ m.role }}]{{ m.content }}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
# transformers' generation tag around the assistant text, and a think prefix only in the generation prompt
GENERATION = (
    "{% for m in messages %}<|{{ m.role }}|>"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
    "{% for tc in m.tool_calls or [] %}<call>{{ tc.function.name }} {{ tc.function.arguments|tojson }}</call>"
    "{% endfor %}{% endgeneration %}{% else %}{{ m.content }}{% endif %}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
THINK_PREFIX = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
    "{% for tc in m.tool_calls or [] %}<call>{{ tc.function.name }} {{ tc.function.arguments|tojson }}</call>"
    "{% endfor %}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from sftree.dataset.student import load_student

    return load_student(make_student(tmp_path_factory.mktemp("student")), 100_000)


def under(base, tmp_path, source: str, strict: bool = False):
    f = tmp_path / "t.jinja"
    f.write_text(source)
    return with_template(dataclasses.replace(base, strict=strict), f)


def test_ids_are_nine_alphanumerics_the_same_for_the_same_id_and_kept_when_already_so():
    a = new_id("call_e1_1_1")
    assert len(a) == 9 and a.isalnum() and a == new_id("call_e1_1_1") and a != new_id("call_e1_1_2")
    assert new_id(a) == a


def test_the_probe_chooses_what_the_template_needs_and_the_record_stays_consistent(base, tmp_path):
    st = under(base, tmp_path, MISTRAL_LIKE)
    assert set(st.fit.names()) == {"call_ids", "call_only", "no_reasoning"}  # it renders no reasoning either
    rec = {"messages": PROBE, "tools": PROBE_TOOLS, "metadata": {"trained": [2, 5, 7]}}
    fitted, touched = fit_record(st.fit, rec)
    assert touched == {"call_ids", "call_only", "no_reasoning"}
    calls = [tc["id"] for m in fitted["messages"] for tc in m.get("tool_calls") or []]
    results = [m["tool_call_id"] for m in fitted["messages"] if m["role"] == "tool"]
    assert calls == results and all(len(i) == 9 for i in calls)  # each result still names its call
    assert fitted["messages"][2]["content"] == "" and fit_record(st.fit, fitted)[1] == frozenset()


def test_strict_adapts_nothing_and_refuses(base, tmp_path):
    st = under(base, tmp_path, MISTRAL_LIKE, strict=True)
    assert st.fit == Fit(family=st.fit.family)
    with pytest.raises(Unfit, match="ids must be 9"):
        render_turn(st, PROBE[:2], PROBE[2], PROBE_TOOLS, "r")


def test_a_generation_block_is_the_trained_span(base, tmp_path):
    st = under(base, tmp_path, GENERATION)
    assert st.generation
    span = text_span(st, PROBE[:7], PROBE[7], PROBE_TOOLS, "r")
    assert span.text == "probe answer"  # the block, not the turn end after it
    turn = render_turn(st, PROBE[:7], PROBE[7], PROBE_TOOLS, "r")
    assert turn.trained == len(st.tokenizer.encode("probe answer", add_special_tokens=False).ids)


def test_a_think_prefix_only_in_the_generation_prompt_trains_the_messages_own_text(base, tmp_path):
    st = under(base, tmp_path, THINK_PREFIX)
    span = text_span(st, PROBE[:7], PROBE[7], PROBE_TOOLS, "r")
    assert span.prompt.endswith("<|assistant|>") and span.text == "probe answer<|end|>"
    strict = under(base, tmp_path, THINK_PREFIX, strict=True)
    with pytest.raises(Unfit) as err:
        text_span(strict, PROBE[:7], PROBE[7], PROBE_TOOLS, "r")
    assert err.value.reason == "span_undefined"


def test_a_template_that_renders_no_calls_excludes_with_its_reason(base, tmp_path):
    st = under(base, tmp_path, "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}")
    with pytest.raises(Unfit) as err:
        render_turn(st, PROBE[:5], PROBE[5], PROBE_TOOLS, "r")
    assert err.value.reason == "drops_tool_call"


def test_the_card_and_stats_name_the_family_the_adaptations_and_the_exclusions(base, tmp_path):
    import json

    from helpers.export import make_results, paths_file

    from sftree.dataset.card import dataset_card
    from sftree.dataset.export import export_task
    from sftree.dataset.stats import ExportStats, MergeStats

    st = under(base, tmp_path, MISTRAL_LIKE)
    records, stats = export_task([paths_file(make_results(tmp_path / "results"))], "step", student=st)
    s = stats.student
    assert records and s.adaptations["call_ids"] == len(records) and s.fit == list(st.fit.names())
    back = ExportStats.from_dict(json.loads(json.dumps(stats.to_dict())))
    assert back.student.to_dict() == s.to_dict()
    card = dataset_card(records, "sft.jsonl", merged=MergeStats(records=len(records), export=back))
    assert f"Template family: {s.family}." in card
    assert f"`call_ids` {s.adaptations['call_ids']} records" in card
    assert f"`call_only` {s.adaptations['call_only']} records" in card
