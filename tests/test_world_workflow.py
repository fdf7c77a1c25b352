"""Coral's own example tasks through the whole workflow, unchanged (`coral_task: ../shared/coral/examples/<task>`),
in the real Coral's world: a small Student run of the task's seed, then select_roots, explore (teacher-sim, each
eval graded by the task's own TaskGrader through the installed Coral), select_paths, export and report. Also a task
in Coral's packaged form (examples/tsp: `grader.entrypoint` + `grader.setup` installing its grader package from the
task folder), whose evals are graded again by Coral's own daemon (`_grade_one`) in a `coral start` run of the same
task: the same scores."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.coral import CORAL_SRC, CoralRun, coral_python, coral_run, needs_coral

from sftree.runtime.sandbox import bwrap_works

REPO = Path(__file__).resolve().parents[1]
pytestmark = [needs_coral, pytest.mark.coral, pytest.mark.slow]

TASKS = {
    "kernel_builder": {
        "scores": [60000.0, 30000.0, 20000.0, 15000.0, 12500.0, 11910.0, 11910.0, 11910.0],
        "reads": ["eval/frozen_problem.py"],
        "student": "openai/gpt-5",  # task.yaml names claude_code's model: Coral's default for opencode
    },
    "circle_packing": {
        "scores": [0.2, 0.25, 0.3, 0.33, 0.35, 0.36, 0.364, 0.364],
        "reads": [],
        "student": "claude/claude-opus-4-6",
    },  # its agents.model, for Coral's opencode runtime
}
PACKAGED = {
    "tsp": {
        "source": REPO / "examples" / "tsp",  # sftree's example in Coral's packaged form
        "scores": [895.0, 890.0, 880.0, 870.0, 860.0, 850.0, 845.0, 845.0],
        "reads": [],
        "student": "openai/gpt-5",  # task.yaml names no model: Coral's default for opencode
    }
}
TASKS.update(PACKAGED)


def task_dir(task: str) -> Path:
    return TASKS[task].get("source") or CORAL_SRC / "examples" / task


def student_run(out: Path, task: str) -> None:
    """Eight snapshots of one agent's run on the task's seed code (the shape `sftree import-coral` makes)."""
    seed = task_dir(task) / "seed"
    attempts = []
    for i, score in enumerate(TASKS[task]["scores"], 1):
        sha = hashlib.sha1(f"{task}{i}".encode()).hexdigest()
        snap = out / task / f"eval-{i:06d}-agent-1-{sha[:12]}"
        shutil.copytree(seed, snap / "code", ignore=shutil.ignore_patterns("opencode.json"))
        if (
            task == "circle_packing"
        ):  # the Student's code has a constant teacher-sim can move (the task is unchanged)
            prog = snap / "code" / "initial_program.py"
            prog.write_text(f"RESTARTS = {i}\n" + prog.read_text())
        attempts.append(
            {"commit_hash": sha, "agent_id": "agent-1", "title": f"step {i}", "score": score, "status": "improved",
             "parent_hash": None, "timestamp": f"2026-05-01T10:00:{i:02d}+00:00", "feedback": f"eval: step {i}"}
        )  # fmt: skip
        (snap / "shared" / "attempts").mkdir(parents=True)
        (snap / "shared" / "notes").mkdir()
        (snap / "shared" / "notes" / "n.md").write_text(f"# Step {i}\nWhat the Student learned.\n")
        for a in attempts:
            (snap / "shared" / "attempts" / f"{a['commit_hash']}.json").write_text(json.dumps(a))
        meta = {"eval_count": i, "agent_id": "agent-1", "commit_hash": sha, "eval_ok": True}
        (snap / "metadata.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("task", sorted(TASKS))
def test_corals_example_runs_through_the_workflow(tmp_path, task):
    student_run(tmp_path / "snaps", task)
    cfg = yaml.safe_load((REPO / "examples" / "demo.yaml").read_text())
    cfg.pop("example_run", None)
    cfg.update(
        snapshots=str(tmp_path / "snaps"),
        results=str(tmp_path / "results"),
        tasks={task: {"coral_task": str(task_dir(task)), "graded_can_read": TASKS[task]["reads"]}},
        coral={"mode": "coral", "python": coral_python(), "grader_venv_cache": str(tmp_path / "venvs")},
    )
    cfg["select_roots"] = {"num_roots": 1}
    cfg["agent"] = {**cfg["agent"], "sandbox": "auto" if bwrap_works() else "none"}
    cfg["search"] = {
        **cfg["search"],
        "root_children": 1,
        "max_children": 1,
        "max_depth": 1,
        "max_valid_edges": 1,
        "parallel_width": 1,
    }
    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), "--cores", "2", "--configfile", str(conf), "--directory", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    trees = list((tmp_path / "results" / task / "trees").glob("*/tree.json"))
    assert len(trees) == 1
    tree = json.loads(trees[0].read_text())
    task_yaml = yaml.safe_load((task_dir(task) / "task.yaml").read_text())
    assert tree["direction"] == task_yaml["grader"].get("direction", "maximize")
    turns = [t for e in tree["edges"] for t in e["turns"]]
    assert turns and any(t["eval_number"] is not None for t in turns), turns
    graded = [t for t in turns if t["eval_number"] is not None]
    assert all(t["score"] is not None or t["feedback"] for t in graded)
    from sftree.records.steplog import read_steps

    steps = read_steps(trees[0].parent / "edges" / tree["edges"][0]["id"] / "steps.jsonl")
    system = steps[0]["request"]["messages"][0]["content"]
    title = task_yaml["task"]["name"]
    assert f"# Task: {title}" in system and "## Tips" in system  # Coral's CORAL.md, rendered by Coral
    # the real OpenCode (the default backend), its system prompt built for the Student's model id
    assert tree["backend"] == "opencode" and f"The exact model ID is {TASKS[task]['student']}" in system
    assert (tmp_path / "results" / "sft.jsonl").exists() and (tmp_path / "results" / "report.html").exists()
    if task in PACKAGED:
        # each eval's score is what Coral's own grader daemon gives the same commit
        code_git = trees[0].parent / "store" / "code.git"
        mine = {t["commit"]: t["score"] for t in graded}
        assert mine and all(v is not None for v in mine.values()), graded
        theirs = corals_scores(tmp_path / "coral", task_dir(task), code_git, sorted(mine))
        print(f"scores: sftree {mine}, Coral's daemon {theirs}")
        assert theirs == mine


# Run in Coral's interpreter: Coral's daemon grading each commit as a pending attempt of agent-1.
GRADE_ONE = """
import json, sys
from pathlib import Path
from coral.config import CoralConfig
from coral.grader.daemon import _grade_one
from coral.types import Attempt
coral_dir = Path(sys.argv[1])
config_path = coral_dir / "config.yaml"
config = CoralConfig.from_yaml(config_path)
out = {}
for c in json.loads(sys.argv[2]):
    a = Attempt(commit_hash=c, agent_id="agent-1", title="t", score=None, status="pending", parent_hash=None,
                timestamp="2026-05-01T10:00:00+00:00")
    out[c] = _grade_one(a, config_path, coral_dir, config).score
print(json.dumps(out))
"""


def corals_scores(base: Path, task: Path, code_git: Path, commits: list[str]) -> dict[str, float | None]:
    """The scores Coral's daemon gives `commits` (of sftree's code store) in a `coral start` run of `task`: Coral
    builds the run (its repo, its grader venv with `grader.setup`) before the agents start; stopped then, the
    commits are made visible to its repo (git alternates) and graded one by one with `_grade_one`."""
    with CoralRun(base, task, {"agent-1": []}) as run:
        pids = run.run_dir / ".coral" / "public" / "agent.pids"
        run.wait(lambda _: pids.is_file(), timeout=600, what="Coral's grader venv and its agent")
        run.stop()
    alternates = run.run_dir / "repo" / ".git" / "objects" / "info" / "alternates"
    alternates.write_text(f"{code_git / 'objects'}\n")
    out = coral_run(GRADE_ONE, str(run.run_dir / ".coral"), json.dumps(commits), cwd=str(base), timeout=600)
    return json.loads(out.strip().splitlines()[-1])
