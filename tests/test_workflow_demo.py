"""The demo workflow end to end through Snakemake: all_snapshots -> sft.jsonl + report, then reruns.

Config = examples/demo.yaml with the session's simulated Student run, one root per task (to fit the test budget)
and `teacher.logprobs: 5` (the sampled tokens, into the ATIF file); explore jobs start their own teacher-sim. Then: a rerun has nothing to do, and `--forcerun select_paths`
reruns only select_paths and the rules after it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
import yaml
from helpers.tree_rules import check_paths, check_tree
from helpers.workflow import REPO, SCHEMA, rules_run, snakemake
from test_export_merged import trained_messages
from test_export_student import QWEN, SMOL, model

AFTER_PATHS = {"select_paths", "export_sft", "merge_sft", "report", "all"}


@pytest.fixture(scope="module")
def demo(tmp_path_factory, example_snapshots_dir):
    """The demo run once (its first `snakemake`): (the working folder, the snapshots, the result)."""
    tmp_path = tmp_path_factory.mktemp("demo")
    config = yaml.safe_load((REPO / "examples/demo.yaml").read_text())
    del config["example_run"]  # the session's simulated run stands in for the demo's example_run rule
    snaps = tmp_path / "snapshots"
    shutil.copytree(example_snapshots_dir, snaps)  # edited below
    config["snapshots"] = str(snaps)
    for task in config["tasks"].values():
        task["coral_task"] = str(REPO / task["coral_task"])
    config["select_roots"]["num_roots"] = 1
    config["teacher"]["logprobs"] = 5  # the sampled tokens, kept through OpenCode's proxy into the ATIF steps
    student = demo_student()
    for key in ("path", "chat_template"):  # the checkout's, read from the working folder
        config["export"]["student"][key] = str(student / Path(config["export"]["student"][key]).name)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))

    return tmp_path, snaps, snakemake(tmp_path)


@pytest.mark.slow
def test_demo_writes_one_atif_trajectory_per_selected_path(demo):
    """sft.atif.jsonl (export.atif), per task and merged: one trajectory per selected path, valid under the atif
    package's own models, OpenCode's sessions with each message once (no copied context), each model call with
    the Teacher's sampled token ids and logprobs (`teacher.logprobs: 5`, through OpenCode's proxy)."""
    tmp_path, _, res = demo
    assert res.returncode == 0, res.stderr[-4000:]
    results = tmp_path / "results"
    selected = sum(
        p["selected"]
        for f in results.glob("*/trees/*/paths.json")
        for p in json.loads(f.read_text())["paths"]
    )
    atif = pytest.importorskip("atif")
    trajectories = [
        atif.Trajectory.model_validate_json(x) for x in (results / "sft.atif.jsonl").read_text().splitlines()
    ]
    assert selected and len(trajectories) == selected
    assert all(t.schema_version == "ATIF-v1.8" and t.agent.name == "opencode" for t in trajectories)
    per_task_atif = sum(
        len((results / t / "sft.atif.jsonl").read_text().splitlines()) for t in ("circle_packing", "tsp")
    )
    assert per_task_atif == selected
    copied = [(t.trajectory_id, s.step_id) for t in trajectories for s in t.steps
              if s.is_copied_context and not cut_echo(t.steps, s)]  # fmt: skip
    assert not copied, f"steps repeated as copied context (a session's history rewritten): {copied}"
    assert all(any(s.source == "agent" for s in t.steps) for t in trajectories)
    # teacher.logprobs: 5 (set above): every model call's step carries the sampled ids and their logprobs, aligned
    calls = [s for t in trajectories for s in t.steps if s.source == "agent" and not s.is_copied_context]
    assert calls and all(s.metrics and s.metrics.completion_token_ids and s.metrics.logprobs for s in calls)
    assert all(len(s.metrics.completion_token_ids) == len(s.metrics.logprobs) for s in calls)
    assert all(len(s.metrics.extra["top_ids"][0]) == 5 for s in calls)


def cut_echo(steps, copied) -> bool:
    """Whether a copied-context step is the beginning of the model call before it, as OpenCode keeps a reply the
    host's interrupt at a turn's end cut while it came (agents/chain.py `check_echo` with `cut`): its text a prefix
    of the reply's, its calls the reply's first. Under load the abort can land mid-reply; anything else copied is
    a rewritten history."""
    before = [
        s for s in steps if s.step_id < copied.step_id and s.source == "agent" and not s.is_copied_context
    ]
    if not before:
        return False
    reply = before[-1]
    text, whole = str(copied.message or "").strip(), str(reply.message or "").strip()
    calls = [c.tool_call_id for c in copied.tool_calls or []]
    return whole.startswith(text) and calls == [c.tool_call_id for c in reply.tool_calls or []][: len(calls)]


def demo_student() -> Path:
    """The demo's Student tokenizer (scripts/install_student.sh, which setup.sh runs)."""
    folder = Path(os.environ.get("SFTREE_STUDENT_DIR") or REPO / ".tools" / "student")
    if not (folder / "ggml-vocab-qwen2.gguf").is_file():
        pytest.skip(f"the demo's Student tokenizer is absent from {folder}: run scripts/install_student.sh")
    return folder


@pytest.mark.slow
def test_demo_export_under_the_student(demo, tmp_path):
    """The demo's selected paths exported under a Student (Qwen2.5-Coder's GGUF: a template that renders tools):
    the card gives the Student's figures; the merged form trains each trained message of the step form exactly
    once, at a fraction of its tokens; under SmolLM2's own template (it drops tool calls) the records that train a
    call are excluded and counted, or, with `fit: strict`, the task is refused before a record is written."""
    qwen, smol = model(QWEN), model(SMOL)  # skip with the reason where install_llm_server.sh did not run
    work, _, res = demo
    assert res.returncode == 0, res.stderr[-4000:]
    exported, figures = {}, {}
    for form in ("step", "merged"):
        outs = []
        for task in ("circle_packing", "tsp"):
            out = tmp_path / form / task / "sft.jsonl"
            paths = sorted(str(p) for p in (work / "results" / task / "trees").glob("*/paths.json"))
            argv = ["export-sft", "--paths", *paths, "--out", str(out), "--granularity", form]
            done = sftree(*argv, "--student", str(qwen), "--student-max-length", "100000")
            assert done.returncode == 0, done.stderr[-3000:]
            outs.append(str(out))
        card = tmp_path / form / "dataset_card.md"
        done = sftree("merge-sft", *outs, "--out", str(tmp_path / form / "sft.jsonl"),
                      "--card", str(card))  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        exported[form] = [json.loads(x) for x in (tmp_path / form / "sft.jsonl").read_text().splitlines()]
        figures[form] = json.loads((tmp_path / form / "sft.stats.json").read_text())["student"]
        assert (
            f"Records: {figures[form]['records']}; tokens processed {figures[form]['tokens_processed']}"
            in (card.read_text())
        )
    step, merged = trained_messages(exported["step"]), trained_messages(exported["merged"])
    assert step == merged and set(merged.values()) == {1} and len(exported["merged"]) < len(exported["step"])
    assert figures["merged"]["tokens_trained"] == figures["step"]["tokens_trained"] > 0
    assert figures["merged"]["tokens_processed"] < figures["step"]["tokens_processed"] / 2

    # SmolLM2's own template drops tool calls: its records with a call are excluded, each named and counted...
    out = tmp_path / "smol" / "sft.jsonl"
    paths = sorted(str(p) for p in (work / "results" / "tsp" / "trees").glob("*/paths.json"))
    done = sftree("export-sft", "--paths", *paths, "--out", str(out), "--student", str(smol),
                  "--student-max-length", "100000")  # fmt: skip
    assert done.returncode == 0 and "excluded (drops_tool_call)" in done.stderr, done.stderr[-2000:]
    dropped = json.loads((out.parent / "sft.stats.json").read_text())["student"]["dropped"]
    assert dropped.get("drops_tool_call", 0) > 0, dropped
    # ...and under `export.student.fit: strict` the task is refused before a record is written
    strict = tmp_path / "smol-strict" / "sft.jsonl"
    done = sftree("export-sft", "--paths", *paths, "--out", str(strict), "--student", str(smol),
                  "--student-max-length", "100000", "--student-fit", "strict")  # fmt: skip
    assert done.returncode != 0 and "chat_template leaves out the tool call" in done.stderr, done.stderr[
        -2000:
    ]
    assert not strict.parent.exists() or not list(strict.parent.iterdir())


def sftree(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sftree", *argv], capture_output=True, text=True, timeout=900
    )


@pytest.mark.slow
def test_demo_workflow_end_to_end(demo):
    tmp_path, snaps, res = demo
    assert res.returncode == 0, res.stderr[-4000:]
    results = tmp_path / "results"
    ran = rules_run(res)
    assert (
        ran["explore"] == 2 and ran["select_paths"] == 2 and ran["export_sft"] == 2 and ran["merge_sft"] == 1
    )

    # paths.json: every candidate ranked, at most top_k selected
    trees = sorted(results.glob("*/trees/*/tree.json"))
    assert [t.parents[2].name for t in trees] == ["circle_packing", "tsp"]
    selected = 0
    for t in trees:
        doc = json.loads((t.parent / "paths.json").read_text())
        assert [p["rank"] for p in doc["paths"]] == list(range(1, len(doc["paths"]) + 1))
        assert doc["paths"] and sum(p["selected"] for p in doc["paths"]) == min(6, len(doc["paths"]))
        scores = [p["path_score"] for p in doc["paths"]]
        assert scores == sorted(scores, reverse=True)
        tree = json.loads(t.read_text())
        assert check_tree(tree) + check_paths(tree, doc) == []  # sections 1 and 3, re-derived (tree_rules)
        selected += sum(p["selected"] for p in doc["paths"])

    # sft.jsonl: schema-valid merged records (the demo's form), tool calls paired, each step trained once,
    # metadata from the roots
    records = [json.loads(x) for x in (results / "sft.jsonl").read_text().splitlines()]
    assert records
    ids = [r["metadata"]["id"] for r in records]
    assert len(ids) == len(set(ids))
    for r in records:
        jsonschema.validate(r, SCHEMA)
        assert r["metadata"]["granularity"] == "merged"
        # every tool result answers a call made before it, once; every trained message is the Teacher's
        asked = [
            tc["id"] for m in r["messages"] if m["role"] == "assistant" for tc in m.get("tool_calls", [])
        ]
        answered = Counter(m["tool_call_id"] for m in r["messages"] if m["role"] == "tool")
        assert set(answered) <= set(asked) and set(answered.values()) <= {1}
    trained = trained_messages(records)  # asserts each trained index is an assistant message
    assert trained and set(trained.values()) == {1}
    assert {r["metadata"]["task"] for r in records} == {"circle_packing", "tsp"}
    per_task = sum(
        len((results / t / "sft.jsonl").read_text().splitlines()) for t in ("circle_packing", "tsp")
    )
    assert per_task == len(records)
    stages = {json.loads(p.read_text())["stage"] for p in results.glob("*/roots/*/metadata.json")}
    assert {r["metadata"]["stage"] for r in records} == stages
    assert len({(r["metadata"]["task"], r["metadata"]["path_rank"]) for r in records}) == selected

    info = json.loads((results / "dataset_info.json").read_text())
    assert info["sftree"]["file_name"] == "sft_llamafactory.jsonl"
    # LLaMA-Factory's converter would train every assistant turn of a merged record: they are left out, counted
    lf = [json.loads(x) for x in (results / "sft_llamafactory.jsonl").read_text().splitlines()]
    merge_stats = json.loads((results / "sft.stats.json").read_text())["merge"]
    assert lf == [] and merge_stats["llamafactory_left_out"] == len(records)
    card = (results / "dataset_card.md").read_text()
    assert f"{len(records)} records" in card
    # the demo's card shows the Student's figures and names its tokenizer
    st = json.loads((results / "sft.stats.json").read_text())["student"]
    assert st["records"] == len(records) and st["tokens_trained"] > 0
    assert f"Records: {st['records']}; tokens processed {st['tokens_processed']}" in card
    assert "ggml-vocab-qwen2.gguf` (gguf, sha256 of the tokenizer as read: `" in card
    assert all(r["metadata"]["student_tokens"]["total_tokens"] <= 32768 for r in records)
    # the card reads the trees: one gain row per selected path, the snapshots skipped, the sandbox
    row = r"^\| (circle_packing|tsp) \| eval-\S+ \| \S+ \| \S+ \| \d+ \| \S+ \| \S+ \| \S+ \| [^|]*\|$"
    assert len(re.findall(row, card, re.M)) == selected
    assert "| circle_packing | " in card.split("| task | snapshots |")[1]
    page = (results / "report.html").read_text()
    assert page.count('<svg class="tree"') == 2 and "Task circle_packing" in page and "Task tsp" in page

    # nothing to do on a rerun
    res = snakemake(tmp_path, "-n")
    assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr, res.stdout[-2000:]

    # --forcerun select_paths: only select_paths and its dependents; the trees are not touched
    tree_mtimes = {t: os.stat(t).st_mtime_ns for t in trees}
    res = snakemake(tmp_path, "--forcerun", "select_paths")
    assert res.returncode == 0, res.stderr[-4000:]
    ran = rules_run(res)
    assert set(ran) == AFTER_PATHS and ran["select_paths"] == 2, ran
    assert {t: os.stat(t).st_mtime_ns for t in trees} == tree_mtimes

    # docs/reruns.md: a touch alone reruns nothing (Snakemake 9 compares checksums of inputs newer than outputs)
    roots = {p.name for p in (results / "tsp" / "roots").iterdir()}
    meta = next(p for p in sorted((snaps / "tsp").glob("eval-*/metadata.json")) if p.parent.name not in roots)
    os.utime(meta)
    res = snakemake(tmp_path, "-n")
    assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr, res.stdout[-2000:]
    # A changed snapshot: the dry run cannot see past the checkpoint and predicts the jobs after it...
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "note": "edited"}))
    res = snakemake(tmp_path, "-n")
    # (select_roots has a `message:`, shown as "Job N: select_roots <task>: ..." instead of "checkpoint select_roots:")
    predicted = set(re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):|^Job \d+: (\w+) ", res.stdout, re.M))
    predicted = {name for pair in predicted for name in pair if name}
    assert res.returncode == 0 and {"select_roots", "export_sft"} <= predicted, predicted
    # ...running the checkpoint first shows the truth: the same roots, so nothing after it reruns
    res = snakemake(tmp_path, "--until", "select_roots")
    assert res.returncode == 0 and set(rules_run(res)) == {"select_roots"}, rules_run(res)
    res = snakemake(tmp_path, "-n")
    assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr, res.stdout[-3000:]


@pytest.mark.slow
def test_demo_tree_form(demo, tmp_path):
    """The demo with `export.tree_packed: true` under a Student (Qwen2.5-Coder's GGUF) and the merged form: export_sft
    and merge_sft rerun and write `sft.tree.jsonl` per task and merged, every line a well-formed tree in which no
    prefix is processed twice, its weights the path form's trained tokens; the tree form processes fewer tokens per
    trained token than the merged form, and the card gives every form's figures."""
    from sftree.records.tree_packed import iter_tree_lines, read_tree_stats

    qwen = model(QWEN)
    work, _, res = demo
    assert res.returncode == 0, res.stderr[-4000:]
    # In place, last of this file's tests (a copy's roots would no longer be the links select-roots made, and
    # their new times would rerun explore): only the export, the merge and the report rerun.
    copy = work
    config = yaml.safe_load((copy / "config.yaml").read_text())
    config["export"] |= {"tree_packed": True, "granularity": "merged"}
    config["export"]["student"] = {"path": str(qwen), "max_length": 100000}
    (copy / "config.yaml").write_text(yaml.safe_dump(config))
    res = snakemake(copy, "--forcerun", "export_sft")  # and what follows it: merge, report
    assert res.returncode == 0, res.stderr[-4000:]
    results = copy / "results"
    lines = list(iter_tree_lines(results / "sft.tree.jsonl"))  # each line checked: no prefix processed twice
    per_task = [
        x
        for t in ("circle_packing", "tsp")
        for x in (results / t / "sft.tree.jsonl").read_text().splitlines()
    ]
    assert lines and len(per_task) == len(lines)
    tree = read_tree_stats(results / "sft.tree.jsonl")
    student = json.loads((results / "sft.stats.json").read_text())["student"]
    assert tree["tokens_objective"] == sum(x.objective for x in lines) >= tree["tokens_trained"] > 0
    tree_ratio = tree["tokens_processed"] / tree["tokens_trained"]
    assert tree_ratio < student["tokens_processed"] / student["tokens_trained"]
    card = (results / "dataset_card.md").read_text()
    for form in ("step", "merged", "path", "tree"):
        assert f"| {form} | " in card.split("## Forms under the Student")[1]
    print(
        f"demo tree form: {json.dumps(tree)}; merged {student['tokens_processed']}/{student['tokens_trained']}"
    )
