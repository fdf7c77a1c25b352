"""The simulated Student run: layout, Coral records, growth of knowledge, real grades, reproducibility."""

import json
import re
import subprocess
import sys

from helpers.examples import EXAMPLES, SCRIPT

from sftree.settings import CoralSettings, section_settings

NAME = re.compile(r"^eval-(\d{6})-(agent-[1-4])-([0-9a-f]{12})$")
ATTEMPT_KEYS = {"commit_hash", "agent_id", "title", "score", "status", "parent_hash", "timestamp", "feedback"}
META_KEYS = {
    "eval_count",
    "agent_id",
    "commit_hash",
    "shared_state_hash",
    "exported_shared_content_hash",
    "task",
}


def load(task_dir):
    snaps = []
    for d in sorted(p for p in task_dir.iterdir() if p.name.startswith("eval-")):
        meta = json.loads((d / "metadata.json").read_text())
        attempt = json.loads((d / "shared" / "attempts" / f"{meta['commit_hash']}.json").read_text())
        snaps.append((d, meta, attempt))
    return snaps


def test_layout_and_records(example_snapshots_dir):
    for task in ("circle_packing", "tsp"):
        snaps = load(example_snapshots_dir / task)
        assert len(snaps) == 40
        assert [int(NAME.match(d.name).group(1)) for d, _, _ in snaps] == list(range(1, 41))
        assert {m["agent_id"] for _, m, _ in snaps} == {"agent-1", "agent-2", "agent-3", "agent-4"}
        for d, meta, attempt in snaps:
            m = NAME.match(d.name)
            assert META_KEYS <= set(meta) and meta["task"] == task and meta["agent_id"] == m.group(2)
            assert re.fullmatch(r"[0-9a-f]{40}", meta["commit_hash"]) and meta["commit_hash"][:12] == m.group(
                3
            )
            assert ATTEMPT_KEYS <= set(attempt) and attempt["commit_hash"] == meta["commit_hash"]
            assert (d / "code" / "solution.py").is_file()
            assert {p.name for p in (d / "shared").iterdir()} >= {"attempts", "notes", "roles", "logs"}
            if "eval_ok" not in meta:
                assert attempt["status"] == "pending" and attempt["score"] is None
            else:
                assert meta["eval_ok"] == (attempt["score"] is not None)
        states = [m.get("eval_ok") for _, m, _ in snaps]
        assert states.count(None) >= 2 and states.count(False) >= 1 and states.count(True) >= 30
        # the crash case: code that kills its process (the graded child, in its own sandbox)
        assert any(
            "grader crashed" in a["feedback"] or "exited with code 3" in a["feedback"] for _, _, a in snaps
        )
        scores = [a["score"] for _, _, a in snaps if a["score"] is not None]
        assert len(set(scores)) >= 6  # code really changes
        first, last = snaps[0][0], snaps[-1][0]
        grow = [len(list((d / "shared" / "attempts").iterdir())) for d in (first, last)]
        notes = [len(list((d / "shared" / "notes").iterdir())) for d in (first, last)]
        assert grow == [1, 40] and notes[1] > notes[0]
        assert (last / "shared" / "skills").is_dir() and any((last / "shared" / "skills").glob("*/SKILL.md"))


def test_run_improves(example_snapshots_dir):
    cp = [a["score"] for _, _, a in load(example_snapshots_dir / "circle_packing") if a["score"] is not None]
    tsp = [a["score"] for _, _, a in load(example_snapshots_dir / "tsp") if a["score"] is not None]
    assert max(cp[-10:]) > cp[0] + 0.2  # maximize: the end beats the baseline clearly
    assert min(tsp[-10:]) < tsp[0] - 50  # minimize


def test_scores_come_from_the_real_grader(example_snapshots_dir):
    from sftree.world.grading import grade
    from sftree.world.locate import locate
    from sftree.world.task import load_coral_task

    d, meta, attempt = next(s for s in load(example_snapshots_dir / "tsp")[20:] if s[2]["score"] is not None)
    spec = load_coral_task(EXAMPLES / "tsp", "tsp")
    r = grade(
        spec,
        d / "code",
        commit="0" * 40,
        install=locate(section_settings(CoralSettings, {"mode": "stand-in"})),
        sandbox="auto",
    )
    assert r.score == attempt["score"]


def test_stamp_skips_and_output_is_reproducible(example_snapshots_dir, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(example_snapshots_dir), "--count", "40"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.count("skipped") == 2
    out = tmp_path / "again"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--count", "40", "--tasks", "tsp", "--workers", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    a = sorted(p.relative_to(out / "tsp") for p in (out / "tsp").rglob("*") if p.is_file())
    b = sorted(
        p.relative_to(example_snapshots_dir / "tsp")
        for p in (example_snapshots_dir / "tsp").rglob("*")
        if p.is_file()
    )
    assert a == b
    assert all((out / "tsp" / p).read_bytes() == (example_snapshots_dir / "tsp" / p).read_bytes() for p in a)
