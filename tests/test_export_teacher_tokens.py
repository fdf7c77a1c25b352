"""The same-tokenizer export (`export.teacher_tokens`, dataset/teacher_tokens.py): a pre-tokenized record trains
the Teacher's sampled ids with their logprobs and top-K, the Student's render where it is the same, the sampled
ids where it differs and nothing trained follows, the render (marked) where later turns need it as context; a tree
whose Teacher had another vocabulary is refused. The Student is tests/helpers/student.py's real BPE (Qwen2.5's
template); the hand-written tree's steps get, as their `logprobs`, the ids a Teacher with that tokenizer samples
(here: the ids of the Student's own render, or that render with one token split in two)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.export import make_results
from helpers.student import make_student
from helpers.trainer import REPO, run_probe, trainer_python
from test_export_student import paths_of

from sftree.dataset.card import same_tokenizer_lines
from sftree.dataset.export import export_settings, export_task, iter_task_records
from sftree.dataset.fit import Fit
from sftree.dataset.merge import merge
from sftree.dataset.stats import ExportStats
from sftree.dataset.student import load_student
from sftree.dataset.teacher_tokens import _Vocab, teacher_span
from sftree.dataset.tree_packed import pack_paths
from sftree.errors import InputError
from sftree.records.sft import record_from_doc
from sftree.records.tree_packed import TreeLine, line_problem
from sftree.teacher.vocabulary import vocabulary_sha256

pytest.importorskip("tokenizers", reason="tokenizers not installed (pyproject.toml pins it)")

K = 2


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    return load_student(make_student(tmp_path_factory.mktemp("student")), 100_000)


def sampled_ids(rec: dict, student) -> list[int]:
    """What a Teacher with the Student's tokenizer samples for the record's completion when it writes exactly the
    template's form: the trained ids up to the turn end's `<|im_end|>` (its stop token), not the `\\n` after it."""
    trained = [i for i, m in zip(rec["input_ids"], rec["completion_mask"], strict=True) if m]
    end = student.tokenizer.token_to_id("<|im_end|>")
    return trained[: trained.index(end) + 1]


def logprobs_of(ids: list[int], seed: int) -> dict:
    """A step record's `logprobs` for `ids`: logprob -(seed + i)/1000 for the i-th token, one alternative each."""
    lps = [-(seed + i) / 1000 for i in range(len(ids))]
    return {"k": K, "ids": ids, "logprobs": lps, "top_ids": [[t, 0] for t in ids],
            "top_logprobs": [[lp, lp - 3] for lp in lps]}  # fmt: skip


def plant(tree: Path, student, change=None) -> dict[str, list[int]]:
    """Give every trained step of the tree its sampled ids (`change(step id, ids)` may alter them); returns them by
    step id."""
    plain, _ = export_task([paths_of(tree)], "step", student=student, pretokenized=True)
    by_id = {r["metadata"]["id"]: sampled_ids(r, student) for r in plain}
    if change:
        by_id = {k: change(k, v) for k, v in by_id.items()}
    for f in tree.glob("edges/*/steps.jsonl"):
        lines = [json.loads(x) for x in f.read_text().splitlines()]
        for n, s in enumerate(lines):
            rid = f"circle_packing/{tree.name}/{s['edge']}/t{s['turn']}s{s['step']}"
            if rid in by_id:
                s["logprobs"] = logprobs_of(by_id[rid], n)
        f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return by_id


def split_first(student, ids: list[int]) -> list[int]:
    """`ids` with its first token of two or more characters written as its characters' tokens (the same text)."""
    tok = student.tokenizer
    for n, t in enumerate(ids):
        s = tok.id_to_token(t)
        if len(s) > 1 and t not in tok.get_added_tokens_decoder():
            parts = [tok.token_to_id(c) for c in s]
            assert None not in parts
            return ids[:n] + parts + ids[n + 1 :]
    raise AssertionError("no token to split")


@pytest.fixture
def tree(tmp_path, student):
    vocab = {"sha256": vocabulary_sha256(student.tokenizer), "size": 1, "source": "the test's Student"}
    return make_results(tmp_path / "results", reasoning=False, tree_extra={"teacher_vocab": vocab})


def trained_logprobs(rec: dict) -> list:
    return rec["teacher_logprobs"]


@pytest.mark.parametrize("form", ["step", "merged", "path"])
def test_a_render_that_is_the_sampled_ids_keeps_them_with_their_logprobs(tree, student, form):
    plant(tree, student)
    plain, _ = export_task([paths_of(tree)], form, student=student, pretokenized=True)
    records, stats = export_task(
        [paths_of(tree)], form, student=student, pretokenized=True, teacher_tokens=True
    )
    assert [r["input_ids"] for r in records] == [r["input_ids"] for r in plain]
    assert [r["completion_mask"] for r in records] == [r["completion_mask"] for r in plain]
    n = 0
    for r in records:
        record_from_doc(r, "test")  # the reader checks the columns' lengths
        outcomes = r["metadata"]["teacher_tokens"]
        assert set(outcomes) == {"same"}
        n += len(outcomes)
        lps = r["teacher_logprobs"]
        assert (
            len(lps)
            == sum(r["completion_mask"])
            == len(r["teacher_top_ids"])
            == len(r["teacher_top_logprobs"])
        )
        # each trained reply: its sampled tokens' logprobs, then None on the template's `\n` after <|im_end|>
        assert lps.count(None) == len(outcomes) and lps[-1] is None
        trained = [i for i, m in zip(r["input_ids"], r["completion_mask"], strict=True) if m]
        for tid, top in zip(trained, r["teacher_top_ids"], strict=True):
            assert top in ([tid, 0], [])
    assert stats.teacher_tokens == {"same": n} and n >= len(records)


def test_the_logprobs_are_the_sampled_tokens_own_in_order(tree, student):
    by_id = plant(tree, student)
    records, _ = export_task(
        [paths_of(tree)], "step", student=student, pretokenized=True, teacher_tokens=True
    )
    steps = {}
    for f in tree.glob("edges/*/steps.jsonl"):
        for s in map(json.loads, f.read_text().splitlines()):
            steps[f"circle_packing/{tree.name}/{s['edge']}/t{s['turn']}s{s['step']}"] = s
    for r in records:
        lp = steps[r["metadata"]["id"]]["logprobs"]
        ids = by_id[r["metadata"]["id"]]
        assert r["teacher_logprobs"] == [*lp["logprobs"], None]
        assert r["teacher_top_ids"] == [*lp["top_ids"], []] and lp["ids"] == ids


def split_one(student, target: str):
    return lambda rid, ids: split_first(student, ids) if rid.endswith(target) else ids


def test_a_step_rendered_otherwise_trains_the_sampled_ids(tree, student):
    by_id = plant(tree, student, split_one(student, "/e1/t1s1"))
    plain, _ = export_task([paths_of(tree)], "step", student=student, pretokenized=True)
    records, stats = export_task(
        [paths_of(tree)], "step", student=student, pretokenized=True, teacher_tokens=True
    )
    (rec,) = [r for r in records if r["metadata"]["id"].endswith("/e1/t1s1")]
    (was,) = [r for r in plain if r["metadata"]["id"].endswith("/e1/t1s1")]
    assert rec["metadata"]["teacher_tokens"] == ["substituted"]
    trained = [i for i, m in zip(rec["input_ids"], rec["completion_mask"], strict=True) if m]
    newline = trained[-1]
    assert trained == [
        *by_id[rec["metadata"]["id"]],
        newline,
    ]  # the sampled ids, closed as the template closes
    assert len(rec["input_ids"]) > len(was["input_ids"])  # one token written as its characters' tokens
    prompt = [i for i, m in zip(rec["input_ids"], rec["completion_mask"], strict=True) if not m]
    assert prompt == [i for i, m in zip(was["input_ids"], was["completion_mask"], strict=True) if not m]
    assert rec["metadata"]["student_tokens"]["total_tokens"] == len(rec["input_ids"])
    assert stats.teacher_tokens["substituted"] == 1 and stats.teacher_tokens["same"] == len(records) - 1
    assert student.tokenizer.decode(rec["input_ids"]) == student.tokenizer.decode(was["input_ids"])


def test_a_merged_run_ends_at_a_reply_rendered_otherwise(tree, student):
    plant(tree, student, split_one(student, "/e1/t1s1"))
    plain, _ = export_task([paths_of(tree)], "merged", student=student, pretokenized=True)
    records, stats = export_task(
        [paths_of(tree)], "merged", student=student, pretokenized=True, teacher_tokens=True
    )
    assert len(records) == len(plain) + 1
    ends = [r for r in records if r["metadata"]["steps"][-1].endswith("/e1/t1s1")]
    assert len(ends) == 1 and ends[0]["metadata"]["teacher_tokens"][-1] == "substituted"
    assert set(ends[0]["metadata"]["teacher_tokens"][:-1]) <= {"same"}
    assert stats.teacher_tokens["substituted"] == 1 and "rendered" not in stats.teacher_tokens


def test_a_path_keeps_the_render_of_a_reply_later_turns_follow_and_marks_it(tree, student):
    plant(tree, student, split_one(student, "/e1/t1s1"))
    plain, _ = export_task([paths_of(tree)], "path", student=student, pretokenized=True)
    records, stats = export_task(
        [paths_of(tree)], "path", student=student, pretokenized=True, teacher_tokens=True
    )
    assert [r["input_ids"] for r in records] == [r["input_ids"] for r in plain]
    for r in records:
        outcomes = r["metadata"]["teacher_tokens"]
        assert outcomes[0] == "rendered" and set(outcomes[1:]) == {"same"}
        first = outcomes and r["completion_mask"].index(1)
        n = r["completion_mask"][first:].index(0)  # the first reply's trained tokens carry no logprobs
        assert r["teacher_logprobs"][:n] == [None] * n and r["teacher_top_ids"][:n] == [[]] * n
    assert stats.teacher_tokens["rendered"] == len(records)
    lines = " ".join(same_tokenizer_lines(stats))
    assert f"train the render, marked in `metadata.teacher_tokens` (rendered {len(records)})" in lines


def test_a_paths_last_reply_rendered_otherwise_is_substituted(tree, student):
    records0, _ = export_task([paths_of(tree)], "path", student=student, pretokenized=True)
    last = {
        r["metadata"]["id"].rsplit("/", 2)[-2] + "/" + r["metadata"]["id"].rsplit("/", 1)[-1]
        for r in records0
    }
    plant(tree, student, lambda rid, ids: split_first(student, ids) if rid.split("/", 2)[-1] in last else ids)
    records, stats = export_task(
        [paths_of(tree)], "path", student=student, pretokenized=True, teacher_tokens=True
    )
    for r, was in zip(records, records0, strict=True):
        assert r["metadata"]["teacher_tokens"][-1] == "substituted"
        assert len(r["input_ids"]) > len(was["input_ids"])  # one token written as its characters' tokens
        assert student.tokenizer.decode(r["input_ids"]) == student.tokenizer.decode(was["input_ids"])
    assert stats.teacher_tokens["substituted"] == len(records)


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda lp: None, "no_tokens"),
        (lambda lp: {k: v for k, v in lp.items() if k not in ("ids", "top_ids")}
         | {"tokens": ["x"] * len(lp["ids"]), "top_tokens": [["x"]] * len(lp["ids"])}, "no_ids"),
        (lambda lp: lp | {"ids": [i + 1 for i in lp["ids"]]}, "misaligned"),  # another vocabulary's ids
        (lambda lp: lp | {"ids": [10**6] * len(lp["ids"])}, "misaligned"),  # outside the vocabulary
    ],
)  # fmt: skip
def test_a_reply_without_usable_ids_trains_the_render_marked(tree, student, change, why):
    plant(tree, student)
    f = tree / "edges" / "e1" / "steps.jsonl"
    lines = [json.loads(x) for x in f.read_text().splitlines()]
    (s,) = [s for s in lines if (s["turn"], s["step"]) == (1, 1)]
    changed = change(s["logprobs"])
    if changed is None:
        del s["logprobs"]
    else:
        s["logprobs"] = changed
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    plain, _ = export_task([paths_of(tree)], "step", student=student, pretokenized=True)
    records, stats = export_task(
        [paths_of(tree)], "step", student=student, pretokenized=True, teacher_tokens=True
    )
    assert [r["input_ids"] for r in records] == [r["input_ids"] for r in plain]
    (rec,) = [r for r in records if r["metadata"]["id"].endswith("/e1/t1s1")]
    assert rec["metadata"]["teacher_tokens"] == [why] and set(rec["teacher_logprobs"]) == {None}
    assert stats.teacher_tokens[why] == 1


def test_a_tree_of_another_vocabulary_or_none_is_refused(tmp_path, student):
    other = {"sha256": "0" * 64, "size": 9, "source": "other.gguf"}
    tree = make_results(tmp_path / "a" / "results", reasoning=False, tree_extra={"teacher_vocab": other})
    with pytest.raises(InputError, match=r"tree.json: the Teacher's vocabulary \(other.gguf"):
        export_task([paths_of(tree)], "step", student=student, pretokenized=True, teacher_tokens=True)
    bare = make_results(tmp_path / "b" / "results", reasoning=False)
    with pytest.raises(InputError, match=r"tree.json: no teacher_vocab.*teacher.tokenizer"):
        export_task([paths_of(bare)], "step", student=student, pretokenized=True, teacher_tokens=True)
    with pytest.raises(InputError, match="export.pretokenized: true"):
        export_task([paths_of(bare)], "step", student=student, teacher_tokens=True)
    with pytest.raises(InputError, match="needs export.student"):
        export_task([paths_of(bare)], "step", pretokenized=True, teacher_tokens=True)


def test_a_record_whose_columns_do_not_fit_its_trained_tokens_is_refused(tree, student):
    plant(tree, student)
    (rec, *_), _ = export_task(
        [paths_of(tree)], "step", student=student, pretokenized=True, teacher_tokens=True
    )
    for bad in (
        rec | {"teacher_logprobs": rec["teacher_logprobs"][:-1]},
        rec | {"teacher_top_ids": [[1, 2, 3], *rec["teacher_top_ids"][1:]]},
        {k: v for k, v in rec.items() if k != "teacher_top_ids"},
    ):
        with pytest.raises(InputError, match="teacher_"):
            record_from_doc(bad, "sft.jsonl line 1")


def test_the_teacher_span_is_the_sampled_ids_closed_by_the_renders_turn_end(student):
    """By hand, render [a, b, </tool_call>, <|im_end|>, \n] (turn end: the last three) and sampled ids with
    logprobs -0.1, -0.2, ...:
    - [a, c, </tool_call>, <|im_end|>]: the span is [a, c, </tool_call>, <|im_end|>, \n], logprobs on the four;
    - [a, c, </tool_call>] (no stop listed): the same span, no logprob on <|im_end|> or \n;
    - [a, c, <|endoftext|>] (a stop the template does not write): [a, c, </tool_call>, <|im_end|>, \n];
    - [a, c] : [a, c, </tool_call>, <|im_end|>, \n]; and [a, b, ...] as the render: the render itself."""
    tok = student.tokenizer
    end, close, eot = (tok.token_to_id(x) for x in ("<|im_end|>", "</tool_call>", "<|endoftext|>"))
    nl = tok.encode("\n").ids[0]
    a, b, c = (tok.token_to_id(x) for x in ("a", "b", "c"))
    v = _Vocab(student)
    render = [a, b, close, end, nl]

    def lp(ids):
        return {"k": 1, "ids": ids, "logprobs": [-(i + 1) / 10 for i in range(len(ids))],
                "top_ids": [[t] for t in ids], "top_logprobs": [[-(i + 1) / 10] for i in range(len(ids))]}  # fmt: skip

    span = teacher_span(render, lp([a, c, close, end]), v)
    assert span.ids == [a, c, close, end, nl]
    assert span.logprobs == [-0.1, -0.2, -0.3, -0.4, None]
    assert list(map(list, span.top_ids)) == [[a], [c], [close], [end], []]
    span = teacher_span(render, lp([a, c, close]), v)
    assert span.ids == [a, c, close, end, nl] and span.logprobs == [-0.1, -0.2, -0.3, None, None]
    span = teacher_span(render, lp([a, c, eot]), v)
    assert span.ids == [a, c, close, end, nl] and span.logprobs == [-0.1, -0.2, None, None, None]
    assert teacher_span(render, lp([a, c]), v).ids == [a, c, close, end, nl]
    assert teacher_span(render, lp([a, b, close, end]), v).ids == render
    # a reply ending in a whitespace token, no stop listed: the whole turn end still follows
    assert teacher_span(render, lp([a, c, nl]), v).ids == [a, c, nl, close, end, nl]
    # a turn end with no added token: a sampled stop the template does not write is left out
    assert teacher_span([a, b, nl], lp([a, c, eot]), v).ids == [a, c]


def tree_form(tree: Path, student) -> tuple[list, object]:
    settings = export_settings(granularity="path", pretokenized=False, teacher_tokens=True, tree_packed=True)
    paths: list = []
    stats = ExportStats()
    list(iter_task_records([paths_of(tree)], settings, stats, student, paths))
    return pack_paths(paths, 100_000, "circle_packing")


def test_the_tree_forms_trained_tokens_carry_the_teachers_columns(tree, student):
    plant(tree, student, split_one(student, "/e1/t1s1"))
    (line,), stats = tree_form(tree, student)
    doc = line.to_dict()
    assert line_problem(doc) is None and TreeLine.from_dict(doc).to_dict() == doc
    trained = [i for i, w in enumerate(line.loss_weight) if w > 0]
    assert len(doc["teacher_logprobs"]) == len(trained) == len(doc["teacher_top_ids"])
    # a trained token with a Teacher logprob is the Teacher's sampled id there, its top-1 in the planted columns
    with_lp = [(line.input_ids[i], top) for i, lp, top in zip(trained, doc["teacher_logprobs"],
                                                              doc["teacher_top_ids"], strict=True) if lp is not None]  # fmt: skip
    assert with_lp and all(top == [tid, 0] for tid, top in with_lp)
    # e1's first reply is rendered otherwise and later turns follow it on every path: trained as the render, with
    # no Teacher columns; every other reply is the same as sampled: its tokens all carry them but the `\n` after
    # <|im_end|>. The trie holds e1's first reply once.
    paths = doc["metadata"]["paths"]
    assert all(
        p["teacher_tokens"][0] == "rendered" and set(p["teacher_tokens"][1:]) == {"same"} for p in paths
    )
    same = sum(len(p["teacher_tokens"]) - 1 for p in paths)
    assert stats.teacher_tokens == {"rendered": len(paths), "same": same}
    n = next(
        k for k, t in enumerate(trained) if t != trained[0] + k
    )  # the first reply: the first trained run
    assert doc["teacher_logprobs"][:n] == [None] * n and doc["teacher_top_ids"][:n] == [[]] * n
    nl = student.tokenizer.encode("\n").ids[0]  # after it, only the template's `\n` has no logprob
    assert all(line.input_ids[t] == nl for t, lp in zip(trained[n:], doc["teacher_logprobs"][n:], strict=True)
               if lp is None)  # fmt: skip
    broken = dict(doc, teacher_logprobs=doc["teacher_logprobs"][:-1])
    assert "one entry per trained token" in line_problem(broken)


@pytest.mark.trainer
def test_the_exported_columns_feed_the_distillation_loss_in_the_trainer(tree, student, tmp_path):
    """The records, read by `datasets` in the trainer venv and batched by dataset/distill_collator.py: the loss at
    alpha 0 is transformers' own loss on the trained tokens (the batch marks exactly them), the KL mix is finite
    and gives gradients, and each trained token's top-K in the batch is the record's."""
    plant(tree, student, split_one(student, "/e1/t1s1"))
    records, _ = export_task(
        [paths_of(tree)], "step", student=student, pretokenized=True, teacher_tokens=True
    )
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    vocab = student.tokenizer.get_vocab_size(with_added_tokens=True)
    script = REPO / "tests" / "trainer" / "distill_batch_probe.py"
    got, _ = run_probe(
        trainer_python(), script, {"records": str(data), "vocab": vocab}, tmp_path, timeout=300
    )
    assert got["rows"] == 4 and got["trained"] > 0
    assert got["alpha0"] == pytest.approx(got["transformers"], rel=1e-5)
    assert got["alpha1"] >= 0 and got["alpha05"] == pytest.approx(
        (got["alpha0"] + got["alpha1"]) / 2, rel=1e-5
    )
    assert got["grad_norm"] > 0 and got["top_ids_are_the_records"]


def test_dedupe_at_merge_keeps_the_teacher_columns_on_the_tokens_still_trained(tree, student, tmp_path):
    plant(tree, student)
    records, _ = export_task(
        [paths_of(tree)], "merged", student=student, pretokenized=True, teacher_tokens=True
    )
    src = tmp_path / "m.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out.jsonl"
    stats = merge([str(src)], str(out), None, None, dedupe=True)
    assert stats.untrained > 0
    before = {r["metadata"]["id"]: r for r in records}
    for r in map(json.loads, out.read_text().splitlines()):
        record_from_doc(r, "merged")  # the columns fit the trained tokens
        assert len(r["metadata"]["teacher_tokens"]) == len(r["metadata"]["trained"])
        was = before[r["metadata"]["id"]]
        kept = [j for j, i in enumerate(k for k, m in enumerate(was["completion_mask"]) if m)
                if r["completion_mask"][i]]  # fmt: skip
        assert r["teacher_top_ids"] == [was["teacher_top_ids"][j] for j in kept]
        assert r["teacher_logprobs"] == [was["teacher_logprobs"][j] for j in kept]


def test_a_reply_the_students_fit_changed_keeps_its_render(tree, student):
    """`call_only` (a template that renders no text beside a call) empties the text of the even steps' replies,
    which the sampled ids hold: those keep the render, marked; the others are the same as sampled."""
    plant(tree, student)
    call_only = dataclasses.replace(student, fit=Fit.of({"call_only"}))
    records, stats = export_task(
        [paths_of(tree)], "step", student=call_only, pretokenized=True, teacher_tokens=True
    )
    by_step = {r["metadata"]["step"]: r["metadata"]["teacher_tokens"] for r in records}
    assert by_step == {1: ["same"], 2: ["rendered"]}
    for r in records:
        text = student.tokenizer.decode(
            [i for i, m in zip(r["input_ids"], r["completion_mask"], strict=True) if m]
        )
        assert "step 2" not in text  # what the fit left out is never trained
    assert stats.teacher_tokens["rendered"] == sum(r["metadata"]["step"] == 2 for r in records)


def test_a_substitution_past_max_length_keeps_the_render(tree, student):
    plant(tree, student, split_one(student, "/e1/t1s1"))
    plain, _ = export_task([paths_of(tree)], "step", student=student, pretokenized=True)
    (was,) = [r for r in plain if r["metadata"]["id"].endswith("/e1/t1s1")]
    short = dataclasses.replace(student, max_length=len(was["input_ids"]))
    records, _ = export_task([paths_of(tree)], "step", student=short, pretokenized=True, teacher_tokens=True)
    (rec,) = [r for r in records if r["metadata"]["id"].endswith("/e1/t1s1")]
    assert rec["metadata"]["teacher_tokens"] == ["rendered"] and rec["input_ids"] == was["input_ids"]


def test_the_config_key_reaches_the_export_and_the_card(tree, student, tmp_path):
    """`export.teacher_tokens: true` in the config, through `sftree export-sft --config` (what the workflow's rule
    runs) and `merge-sft`: the records carry the columns and the card says how many replies train the sampled
    ids; a Student of another vocabulary stops the job with the tree named and nothing written."""
    plant(tree, student, split_one(student, "/e1/t1s1"))
    cfg = {"tasks": {"circle_packing": {"coral_task": "examples/circle_packing"}},
           "export": {"granularity": "step", "pretokenized": True, "teacher_tokens": True,
                      "student": {"path": str(student.source), "max_length": 100_000}}}  # fmt: skip
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps(cfg))
    out = tmp_path / "out" / "circle_packing" / "sft.jsonl"
    exe = [sys.executable, "-m", "sftree", "export-sft", "--paths", str(paths_of(tree)), "--out", str(out)]
    res = subprocess.run([*exe, "--config", str(config)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert records and all(len(r["teacher_logprobs"]) == sum(r["completion_mask"]) for r in records)
    card = tmp_path / "card.md"
    merge([str(out)], str(tmp_path / "sft.jsonl"), None, str(card))
    n = len(records)
    assert (f"of {n} trained replies, the Student's render gives the Teacher's sampled ids for {n - 1} and other "
            f"ids for 1; {n} train exactly the sampled ids.") in card.read_text()  # fmt: skip
    doc = json.loads((tree / "tree.json").read_text())
    doc["teacher_vocab"]["sha256"] = "f" * 64
    (tree / "tree.json").write_text(json.dumps(doc))
    out.unlink()
    res = subprocess.run([*exe, "--config", str(config)], capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "tree.json: the Teacher's vocabulary" in res.stderr and not out.exists()
