"""A real Coral run, imported: `coral start` of Coral's circle_packing example with two scripted agents.

The Coral in ../shared/coral (installed in .venv-coral by scripts/install_coral.sh) runs as its users run it:
its manager makes the run folder, clones the seed, makes a worktree per agent, starts the grader daemon and the
agents (the scripted runtime of tests/coral_agents, loaded as `agents.runtime: module:Class`); the agents run
Coral's own `coral eval`, which commits, checkpoints `.coral/public` and writes the pending record; the daemon
grades with the task's own grader. 24 evals: a crashed one (a syntax error), a slow one (imported while pending,
then again once graded), and a last one that hangs in the grader and is still pending when `coral stop` ends
the run. The snapshots are checked against Coral's own records (read by Coral's `read_attempts`), its checkpoint
repository and the run's code repository; then the whole workflow runs on them (teacher-sim as the Teacher
in Coral's world, the task's own grader grading its commits through the installed Coral).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers.coral import REPO, CoralRun, coral, coral_python, needs_coral
from helpers.coralrun import git

from sftree.roots.import_coral import REPORT_JSON, run_import
from sftree.roots.snapshots import scan
from sftree.runtime.sandbox import bwrap_works

pytestmark = [needs_coral, coral, pytest.mark.slow]
ITEMS = ("attempts", "notes", "skills", "roles", "agents", "heartbeat", "eval_logs")


def plan() -> dict:
    a1 = [{"message": "baseline: the seed as it is"}]
    a2 = []
    for k in range(11):
        a1.append(
            {
                "message": f"inner ring {0.30 - 0.01 * (k + 1):.2f}",
                "set": {"INNER_RING": 0.30 - 0.01 * (k + 1)},
            }
        )
        a2.append(
            {
                "message": f"outer ring {0.70 - 0.01 * (k + 1):.2f}",
                "set": {"OUTER_RING": 0.70 - 0.01 * (k + 1)},
            }
        )
    a1[3] = {"message": "half-finished edit", "break": "syntax"}  # graded as crashed
    a1[3 + 3]["note"] = "Smaller inner rings keep helping; the syntax error at step 4 cost an eval."
    a1[7] |= {"sleep": 6, "message": "slow variant"}  # pending for a while (agent-1 waits for it)
    a2[2]["note"] = "Shrinking the outer ring: each 0.01 helps."
    a2.append({"message": "stuck in the grader", "sleep": 3600, "no_wait": True, "wait_graded": 23})
    return {"agent-1": a1, "agent-2": a2}


def coral_records(run_dir: Path) -> list[dict]:
    """The attempts as Coral itself reads them (coral.hub.attempts.read_attempts)."""
    code = (
        "import json, sys\nfrom coral.hub.attempts import read_attempts\n"
        "print(json.dumps([a.to_dict() for a in read_attempts(sys.argv[1])]))"
    )
    out = subprocess.run(
        [coral_python(), "-c", code, str(run_dir / ".coral")], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def tree_files(git_dir: Path, rev: str) -> dict[str, bytes]:
    out = {}
    for line in git("ls-tree", "-r", "-z", rev, cwd=git_dir).split("\0"):
        if line:
            meta, path = line.split("\t", 1)
            out[path] = subprocess.run(
                ["git", "cat-file", "blob", meta.split()[2]], cwd=git_dir, capture_output=True, check=True
            ).stdout
    return out


def disk_files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def snapshot_dirs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.name.startswith("eval-"))


def test_a_real_coral_run_is_imported_and_the_workflow_runs_on_it(tmp_path):
    out = tmp_path / "all_snapshots" / "circle_packing"
    slow_inode = {}
    with CoralRun(tmp_path / "coral", "circle_packing", plan(), grader_timeout=600) as run:
        # 1. while the run is live, the slow attempt still pending
        recs = run.wait(
            lambda rs: any(r["title"] == "slow variant" and r["status"] == "pending" for r in rs),
            what="the slow attempt, pending",
        )
        first = run_import(run.run_dir, out)
        assert first.problems == [] and first.counts["snapshots"] == len(recs)
        assert any("the run is in progress" in n for n in first.notes)
        slow = next(r for r in recs if r["title"] == "slow variant")
        slow_dir = next(p for p in snapshot_dirs(out) if slow["commit_hash"][:12] in p.name)
        assert "eval_ok" not in json.loads((slow_dir / "metadata.json").read_text())
        graded_then = {
            p.name: p.stat().st_ino
            for p in snapshot_dirs(out)
            if "eval_ok" in json.loads((p / "metadata.json").read_text())
        }
        assert graded_then
        # 2. every eval but the last graded; the last one hangs in the grader
        run.wait(
            lambda rs: len(rs) == 24 and sum(r["status"] != "pending" for r in rs) == 23,
            what="23 graded attempts and one pending",
        )
        second = run_import(run.run_dir, out)
        assert second.actions["written"] == 24 - len(recs) and second.problems == []
        assert second.actions["rebuilt"] >= 1  # the slow one (and any other that was pending at import 1)
        for name, ino in graded_then.items():
            assert (out / name).stat().st_ino == ino, f"{name} was rebuilt although its record did not change"
        assert json.loads((slow_dir / "metadata.json").read_text())["eval_ok"] is True
        slow_inode = slow_dir.stat().st_ino
        run.stop()
    # 3. the run is over: nothing to do but the note
    third = run_import(run.run_dir, out)
    assert third.actions["up_to_date"] == 24 and third.counts == {
        "records": 24, "snapshots": 24, "pending": 1, "eval_ok_true": 22, "eval_ok_false": 1, "problems": 0
    }  # fmt: skip
    assert slow_dir.stat().st_ino == slow_inode and not third.notes

    # --- the snapshots against Coral's own records -----------------------------------------------------------
    coral_dir = run.run_dir / ".coral"
    records = sorted(coral_records(run.run_dir), key=lambda r: r["timestamp"])
    assert len(records) == 24 and {r["agent_id"] for r in records} == {"agent-1", "agent-2"}
    assert [r["status"] for r in records].count("crashed") == 1 and records[-1]["status"] == "pending"
    assert int((coral_dir / "public/eval_count").read_text()) == 23  # Coral's daemon counted the graded ones
    snaps = snapshot_dirs(out)
    assert [s.name for s in snaps] == [
        f"eval-{i:06d}-{r['agent_id']}-{r['commit_hash'][:12]}" for i, r in enumerate(records, 1)
    ]
    checkpoints = git("log", "--format=%H", cwd=coral_dir / "public").split()
    assert len(checkpoints) == 25  # Coral's init commit and one checkpoint per submission
    graded = 0
    for snap, rec in zip(snaps, records, strict=True):
        meta = json.loads((snap / "metadata.json").read_text())
        assert (meta["commit_hash"], meta["agent_id"]) == (rec["commit_hash"], rec["agent_id"])
        assert (
            meta["shared_state_hash"] == rec["shared_state_hash"] and rec["shared_state_hash"] in checkpoints
        )
        if rec["status"] == "pending":
            assert "eval_ok" not in meta
        else:
            graded += 1
            assert meta["eval_ok"] is (rec["status"] != "crashed") and meta["eval_count"] == graded
        own = f"attempts/{rec['commit_hash']}.json"
        assert (snap / "shared" / own).read_bytes() == (coral_dir / "public" / own).read_bytes()
        # the knowledge at the checkpoint Coral took when the agent submitted
        want = {p: b for p, b in tree_files(coral_dir / "public", rec["shared_state_hash"]).items()}
        want = {p: b for p, b in want.items() if p.split("/")[0] in ITEMS}
        want[own] = (coral_dir / "public" / own).read_bytes()
        assert disk_files(snap / "shared") == want, snap.name
        assert disk_files(snap / "code") == tree_files(run.run_dir / "repo", rec["commit_hash"])
    # the notes the agents wrote reach the snapshots after them, through Coral's checkpoints
    last = snaps[-1] / "shared" / "notes"
    assert {p.name for p in last.iterdir()} >= {"agent-1-07.md", "agent-2-03.md"}
    # select-roots reads Coral's scores and statuses from the imported snapshots
    by_commit = {r["commit_hash"]: r for r in records}
    scanned = scan(out, "circle_packing")
    assert len(scanned.snapshots) == 23 and len(scanned.pending) == 1
    for s in scanned.snapshots:
        assert (s.score, s.status) == (by_commit[s.commit_hash]["score"], by_commit[s.commit_hash]["status"])

    # --- the whole workflow on the imported run ----------------------------------------------------------------
    config = {
        "snapshots": "all_snapshots",
        "results": "results",
        # the run's own task folder (Coral's example, as the run used it): the Teacher in Coral's world, its
        # evals graded by the task's TaskGrader through the installed Coral
        "tasks": {"circle_packing": {"coral_task": str(run.task_dir), "coral_run": str(run.run_dir)}},
        "coral": {"mode": "coral", "python": coral_python()},
        "select_roots": {"num_roots": 2},
        "teacher": {"sim": {"seed": 0}, "health_timeout": 30, "retries": 3, "backoff_max": 2},
        "agent": {"max_steps_per_turn": 12, "turn_timeout": 300, "bash_timeout": 60,
                  "sandbox": "auto" if bwrap_works() else "none"},
        "search": {"root_children": 1, "max_children": 1, "max_depth": 1, "target_good_leaves": 1,
                   "max_valid_edges": 1, "parallel_width": 1},
    }  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cmd = ["snakemake", "--cores", "2", "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path)]
    cmd += ["--configfile", str(tmp_path / "config.yaml")]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = tmp_path / "results" / "circle_packing"
    assert len((results / "stages.tsv").read_text().splitlines()) == 1 + 23
    roots = sorted(p.name for p in (results / "roots").iterdir() if p.is_dir())
    assert len(roots) == 2
    for root in roots:
        tree = json.loads((results / "trees" / root / "tree.json").read_text())
        assert tree["status"] == "finished" and tree["counters"]["valid_edges"] >= 1
        # the Teacher's evals were graded by the task's own grader: scores on the circle packing scale
        scores = [t["score"] for e in tree["edges"] for t in e["turns"] if t["score"] is not None]
        assert scores and all(0 < s < 1.1 for s in scores)
        assert tree["direction"] == "maximize"
    lines = (tmp_path / "results" / "sft.jsonl").read_text().splitlines()
    assert lines and json.loads(lines[0])["metadata"]["task"] == "circle_packing"
    assert json.loads((out / REPORT_JSON).read_text())["counts"]["snapshots"] == 24
