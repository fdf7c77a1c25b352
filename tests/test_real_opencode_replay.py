"""A real model's recorded run served back to the real OpenCode (tests/helpers/replay_server.py): examples/
real_opencode.yaml through Snakemake, its Teacher the replay of the fixtures in tests/fixtures/real_opencode/ that
the same overlay recorded with Qwen2.5-Coder-1.5B-Instruct on llama-server. OpenCode, the recording proxy and its
chain check, the sandbox, Coral's grader, path selection and the export all run for real on real model output; the
replay answers only the recorded requests (any other is a miss, and the test fails).

Skipped only where OpenCode is not installed (scripts/install_opencode.sh) or no recorded tree is committed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from helpers.real_traffic import load_steps, meta, runs_of, sessions
from helpers.replay_server import ReplayServer
from helpers.workflow import REPO, rules_run, snakemake

from sftree.agents.chain import Pristine
from sftree.search import tree as treemod

RECORDED = [p for p in sessions() if meta(p).get("replay")]
OPENCODE = REPO / ".tools" / "bin" / "opencode"
pytestmark = [
    pytest.mark.llm,
    pytest.mark.opencode,
    pytest.mark.skipif(not RECORDED, reason="no recorded real tree in tests/fixtures/real_opencode"),
    pytest.mark.skipif(not OPENCODE.exists() or shutil.which("bwrap") is None,
                       reason="no OpenCode (scripts/install_opencode.sh) or no bwrap"),
]  # fmt: skip


def replay_config(tmp_path: Path, base_url: str, snapshots: Path, overlay: dict | None) -> None:
    """examples/real_opencode.yaml with the recording's own agent and search settings, the replay as its Teacher."""
    cfg = yaml.safe_load((REPO / "examples/real_opencode.yaml").read_text())
    for key, value in (overlay or {}).items():
        cfg[key].update(value or {})
    cfg.pop("example_run")
    cfg["snapshots"] = str(snapshots)
    cfg["tasks"] = {"circle_packing": {"coral_task": str(REPO / "examples/circle_packing")}}
    cfg["teacher"].pop("launch")
    cfg["teacher"].update(base_url=base_url, model="replay", first_chunk_timeout=60, request_timeout=120)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))


@pytest.fixture(scope="module")
def replayed(tmp_path_factory, example_snapshots_dir):
    """The recorded tree served back through examples/real_opencode.yaml: (tmp folder, replay server, result)."""
    tmp_path = tmp_path_factory.mktemp("replay")
    sess = []
    for folder in RECORDED:
        runs = runs_of(load_steps(folder, tmp_path / "fixtures"))
        sess.append((runs, Pristine.of(runs[0].steps[0]["request"])))
    rs = ReplayServer(sess).start()
    try:
        replay_config(tmp_path, rs.base_url, example_snapshots_dir, meta(RECORDED[0]).get("overlay"))
        res = snakemake(tmp_path, "--cores", "1")
    finally:
        rs.stop()
    return tmp_path, rs, sess, res


@pytest.mark.slow
def test_a_recorded_real_model_run_replays_through_opencode_request_by_request(replayed):
    """Every request OpenCode sends is the recorded one; the tree's turns end as they did; nothing is tampered."""
    tmp_path, rs, sess, res = replayed
    assert res.returncode == 0, res.stderr[-4000:]
    assert rs.misses == [], rs.misses
    assert rs.served == sum(len(r.steps) for runs, _ in sess for r in runs)
    assert rules_run(res)["explore"] == 1
    (tree_file,) = (tmp_path / "results/circle_packing/trees").glob("*/tree.json")
    tree = treemod.load(tree_file)
    assert not [e for e in tree.edges if e.fail_reason == "tampered" or e.prune_reason == "tampered"]
    recorded = {meta(f)["edge"]: meta(f)["turns"] for f in RECORDED}
    for e in tree.edges:  # the same turns, ended the same way, with the same grades
        got = [{k: getattr(t, k) for k in ("turn", "ended", "score", "eval_status")} for t in e.turns]
        want = [{k: t.get(k) for k in ("turn", "ended", "score", "eval_status")} for t in recorded[e.id]]
        assert got == want, (e.id, got, want)
    steps = [s for e in tree.edges for s in load_tree_steps(tree_file.parent, e.id)]
    if any(
        m["response"].get("tool_calls") for runs, _ in sess for r in runs for m in r.steps if m["response"]
    ):
        assert [r for s in steps for r in s.get("tool_results") or []], "no recorded tool call ran"


@pytest.mark.slow
def test_the_replayed_run_has_a_graded_eval_and_a_record_that_trains_a_real_tool_call(replayed):
    if not any(t.get("score") is not None for f in RECORDED for t in meta(f)["turns"]):
        pytest.skip(
            "no recorded real run reached a graded coral eval (docs/real_teacher.md, 'Through OpenCode')"
        )
    tmp_path, _rs, _sess, _res = replayed
    (tree_file,) = (tmp_path / "results/circle_packing/trees").glob("*/tree.json")
    tree = treemod.load(tree_file)
    graded = [t for e in tree.edges for t in e.turns if isinstance(t.score, int | float)]
    assert graded, "no graded coral eval"
    records = [
        json.loads(x) for x in (tmp_path / "results/circle_packing/sft.jsonl").read_text().splitlines()
    ]
    trained_calls = [
        tc
        for r in records
        for tc in (r["messages"][-1].get("tool_calls") or [])
        if r["messages"][-1]["role"] == "assistant"
    ]
    assert trained_calls, "no exported record trains a tool call"
    for tc in trained_calls:
        assert isinstance(json.loads(tc["function"]["arguments"]), dict)


def load_tree_steps(tree_dir: Path, edge_id: str) -> list[dict]:
    from sftree.records import steplog

    f = tree_dir / "edges" / edge_id / "steps.jsonl"
    return steplog.read_steps(f) if f.exists() else []
