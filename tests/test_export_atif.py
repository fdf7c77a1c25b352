"""`export.atif`: one ATIF v1.8 trajectory per selected path, accepted by the `atif` package's own pydantic models;
the session in turn order, each message once; the Teacher's tokens in the agent steps' metrics where kept;
the tree rebuildable from `extra`; the per-task files merged; a bad line named."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest
from helpers.export import make_results, paths_file

from sftree.cli import main
from sftree.dataset.atif import path_trajectory
from sftree.dataset.export import EXPORTED_KINDS, write_atif
from sftree.errors import InputError
from sftree.records.atif import read_trajectories
from sftree.records.steplog import read_steps

REPO = Path(__file__).parents[1]
atif = pytest.importorskip("atif")  # a dev extra (pyproject.toml)


def add_logprobs(tree_dir, edge, k=3, dropped_at=()):
    """The Teacher's tokens on `edge`'s agent steps (as the native agent records them), `dropped_at` steps
    (turn, step) recorded without (the server sent none)."""
    path = tree_dir / "edges" / edge / "steps.jsonl"
    steps = read_steps(path)
    for s in steps:
        if s.get("kind") != "agent":
            continue
        if (s["turn"], s["step"]) in dropped_at:
            s["logprobs_dropped"] = "absent"
            continue
        n = s["usage"]["completion_tokens"]
        s["logprobs"] = {"k": k, "logprobs": [-0.5] * n, "top_logprobs": [[-0.5, -1.5, -2.0]] * n,
                         "ids": list(range(100, 100 + n)), "top_ids": [[1, 2, 3]] * n}  # fmt: skip
    path.write_text("".join(json.dumps(s) + "\n" for s in steps))


@pytest.fixture
def results(tmp_path):
    tree_dir = make_results(tmp_path / "results")
    add_logprobs(tree_dir, "e1", dropped_at={(2, 2)})
    return tree_dir


def test_one_trajectory_per_selected_path_valid_under_the_atif_models(results, tmp_path):
    pf = paths_file(results)
    out = tmp_path / "sft.atif.jsonl"
    n, kept, missing = write_atif([pf], out)
    docs = list(read_trajectories(out))
    selected = [p for p in json.loads(pf.read_text())["paths"] if p["selected"]]
    assert n == len(docs) == len(selected) == 2
    for doc, path in zip(docs, selected, strict=True):
        t = atif.Trajectory.model_validate(doc)  # the format's own models: extra fields forbidden
        assert t.schema_version == "ATIF-v1.8" and t.agent.tool_definitions
        ext = doc["extra"]["sftree"]
        assert ext["path_edges"] == path["edges"] and ext["parent_path"] == path["edges"][:-1]
        assert ext["leaf"] == path["leaf"] and ext["path_rank"] == path["rank"] and "gain" in ext
        assert ext["tree"].endswith("circle_packing/trees/" + ext["root"])
        agent = [s for s in t.steps if s.source == "agent"]
        assert [s.extra["edge"] for s in agent] == [e for e in path["edges"] for _ in range(4)]
        assert t.final_metrics.total_completion_tokens == 10 * len(agent)
    # e1 (both paths) has 4 replies, 3 with tokens; e2 and e3 none asked
    assert (kept, missing) == (6, 10)


def test_the_session_is_each_message_once_in_turn_order(results, tmp_path):
    out = tmp_path / "sft.atif.jsonl"
    write_atif([paths_file(results)], out)
    doc = next(read_trajectories(out))
    sources = [s["source"] for s in doc["steps"]]
    # the system prompt, then per turn the host's prompt and two model calls
    assert sources == ["system"] + (["user", "agent", "agent"] * 4)
    users = [s["message"] for s in doc["steps"] if s["source"] == "user"]
    assert users == ["e1 turn 1 prompt", "e1 turn 2 prompt", "e2 turn 1 prompt", "e2 turn 2 prompt"]
    first = doc["steps"][2]
    assert first["tool_calls"][0]["arguments"] == {"filePath": ".opencode/notes/a.md"}
    assert first["observation"]["results"][0]["source_call_id"] == first["tool_calls"][0]["tool_call_id"]
    # e2's malformed reply: in the trajectory (it happened), its text kept, marked as never trained
    bad = [s for s in doc["steps"] if s.get("extra", {}).get("exclusion")]
    assert len(bad) == 1 and bad[0]["extra"]["exclusion"] == "malformed_arguments"
    assert bad[0]["tool_calls"][0]["arguments"] == {} and "raw_arguments" in bad[0]["tool_calls"][0]["extra"]
    assert any(s.get("reasoning_content") == "think first" for s in doc["steps"])


def test_agent_steps_carry_the_teachers_tokens_where_kept(results, tmp_path):
    out = tmp_path / "sft.atif.jsonl"
    write_atif([paths_file(results)], out)
    agent = [s for s in next(read_trajectories(out))["steps"] if s["source"] == "agent"]
    m = agent[0]["metrics"]
    assert m["completion_token_ids"] == list(range(100, 110)) and m["logprobs"] == [-0.5] * 10
    assert m["extra"]["top_ids"][0] == [1, 2, 3] and m["extra"]["top_k"] == 3
    assert m["cached_tokens"] == 50 and m["prompt_tokens"] == 100
    assert (
        "logprobs" not in agent[3]["metrics"] and agent[3]["metrics"]["extra"]["logprobs_dropped"] == "absent"
    )
    assert "logprobs" not in agent[4]["metrics"]  # e2: never asked


def test_the_workflow_cli_writes_and_merges_them(results, tmp_path, capsys):
    """`export-sft --atif` per task, `merge-sft --atif` (export.atif: the rules' commands, run in-process): each
    ATIF file beside its sft.jsonl; a task without one is named."""
    pf = paths_file(results)
    task_out = tmp_path / "task" / "sft.jsonl"
    assert main(["export-sft", "--paths", str(pf), "--out", str(task_out), "--atif"]) == 0
    merged = tmp_path / "sft.jsonl"
    assert (
        main(
            ["merge-sft", str(task_out), "--out", str(merged), "--card", str(tmp_path / "card.md"), "--atif"]
        )
        == 0
    )
    docs = [atif.Trajectory.model_validate(d) for d in read_trajectories(tmp_path / "sft.atif.jsonl")]
    assert len(docs) == 2
    card = (tmp_path / "card.md").read_text()
    assert "Teacher tokens (`teacher.logprobs`): 3 replies keep" in card
    assert "keep none (absent 1" in card and "8 were not asked" in card
    (task_out.parent / "sft.atif.jsonl").unlink()
    assert main(["merge-sft", str(task_out), "--out", str(merged), "--atif"]) == 2
    assert "task/sft.atif.jsonl" in capsys.readouterr().err


def test_a_bad_trajectory_line_is_named(tmp_path):
    bad = tmp_path / "sft.atif.jsonl"
    bad.write_text(json.dumps({"schema_version": "ATIF-v1.8", "agent": {}, "steps": [{"step_id": 2}]}) + "\n")
    with pytest.raises(InputError, match=r"sft.atif.jsonl line 1: steps\[0\] is not a step with step_id 1"):
        list(read_trajectories(bad))


def test_a_second_atif_consumer_reads_them_back(results, tmp_path):
    """atif-scan's own loader (.venv-consumers-atif, scripts/install_consumers.sh) reads every trajectory: the
    same steps, tool calls paired with their results, the token counts."""
    py = REPO / ".venv-consumers-atif" / "bin" / "python"
    if not py.is_file():
        pytest.skip(".venv-consumers-atif absent: run `bash scripts/install_consumers.sh` (.ci/run does)")
    out = tmp_path / "sft.atif.jsonl"
    write_atif([paths_file(results)], out)
    docs = list(read_trajectories(out))
    r = subprocess.run([str(py), str(REPO / "tests/consumers/atif_probe.py"), str(out)], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert len(got) == len(docs) == 2
    for seen, doc in zip(got, docs, strict=True):
        agent = [s for s in doc["steps"] if s["source"] == "agent"]
        assert seen["version"] == "ATIF-v1.8" and seen["sources"] == [s["source"] for s in doc["steps"]]
        assert seen["calls"] == [[c["function_name"] for c in s["tool_calls"]] for s in agent]
        assert all(seen["paired"]) and seen["completion_tokens"] == [10] * len(agent)
        assert seen["prompt_tokens"] == doc["final_metrics"]["total_prompt_tokens"]
        assert seen["agent"][:2] == [doc["agent"]["name"], doc["agent"]["version"]]


FIXTURES = REPO / "tests/fixtures/real_opencode"


@pytest.mark.parametrize(
    "name", sorted(p.name for p in FIXTURES.iterdir() if (p / "steps.jsonl.gz").is_file())
)
def test_real_opencode_sessions_become_trajectories_with_each_message_once(name, tmp_path):
    """Real OpenCode step records (OpenCode re-serialises the replies it resends): every request's history is
    recognised as the path's own session, so no message is repeated as copied context and every host prompt is
    one user step before the calls it opened."""
    edge = tmp_path / "edges" / "e1"
    edge.mkdir(parents=True)
    for f in ("messages.jsonl", "steps.jsonl"):
        (edge / f).write_bytes(gzip.decompress((FIXTURES / name / f"{f}.gz").read_bytes()))
    steps = [
        s for s in read_steps(edge / "steps.jsonl") if s.get("kind") in EXPORTED_KINDS and s.get("response")
    ]
    doc = path_trajectory([("e1", s) for s in steps], {"task": "t", "root": "r", "leaf": "n1"}, agent="opencode",
                          model="m")  # fmt: skip
    t = atif.Trajectory.model_validate(doc)
    assert not any(s.is_copied_context for s in t.steps) and t.steps[0].source == "system"
    assert sum(s.source == "agent" for s in t.steps) == len(steps)
    users = [s.message for s in t.steps if s.source == "user"]
    # the last request holds the whole session: its user messages, each once
    assert len(users) == sum(m["role"] == "user" for m in steps[-1]["request"]["messages"])
