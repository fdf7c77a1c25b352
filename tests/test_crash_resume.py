"""Killed anywhere, rerun with the README's command, the same data: the crash harness (benchmarks/crash_harness.py)
in its reduced form, on a one-tree demo (circle_packing, one root, the native agent, a small budget).

One set-up for CI's budget: the run to the end (the reference), then the same folder emptied and killed twice,
each rerun with the README's command alone:
- SIGKILL to every process of the run while `sftree explore` works (a node lost): no process of the run is left
  after 10 s; the rerun clears the dead run's lock (saying so) and sweeps its temporary folders (saying how
  many), while a second command started during it finds the live run's lock and leaves it alone;
- SIGTERM to Snakemake alone (Slurm's time limit) while `sftree explore` works: every process ends within 10 s;
  the rerun resumes.
Afterwards every output equals the reference byte for byte, no finished edge ran twice, and no temporary folder
of the killed runs is left.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sftree.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import crash_harness as harness  # noqa: E402


@pytest.fixture(scope="module")
def one_tree(tmp_path_factory, example_snapshots_dir):
    work = tmp_path_factory.mktemp("crash") / "run"
    config = harness.demo_config(example_snapshots_dir, 1, 1, ["circle_packing"])
    config["agent"] = {**config["agent"], "backend": "native", "sandbox": "none"}
    config["search"].update(
        root_children=2, max_children=2, max_depth=2, target_good_leaves=2, max_valid_edges=3
    )
    config["export"].pop("student")  # the tokenizer (and the tree form that needs it): not pinned here
    config["export"]["tree_packed"] = False
    harness.reset(work, config)
    log = open(work.parent / "runs.log", "ab")  # noqa: SIM115
    reruns, _ = harness.run_to_end(work, log, tries=1)
    assert reruns == 1, (work.parent / "runs.log").read_text()[-3000:]
    return work, config, harness.outputs(work), log


def explore_working(work: Path, w: harness.Watched, timeout: float = 120) -> None:
    """Wait until the tree has finished an edge and `sftree explore` is at the next one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and w.proc.poll() is None:
        logs = list((work / "results").glob("*/trees/*/explore.log"))
        if logs and " done: " in logs[0].read_text() and "explore" in harness.stages(w.look()):
            return
        time.sleep(0.2)
    pytest.fail("the run did not reach a second edge")


def own_lock(work: Path, since: int) -> bool:
    """Snakemake's lock is there, written after `since` (the rerun's own, not the dead run's)."""
    locks = work / ".snakemake" / "locks"
    try:
        return any(p.stat().st_mtime_ns >= since for p in locks.iterdir())
    except OSError:
        return False


def test_killed_runs_resume_with_the_readme_command_and_write_the_same_data(one_tree):
    work, config, reference, log = one_tree
    assert reference and any("paths.json" in k for k in reference) and "sft.jsonl" in reference
    pids: set[int] = set()

    # 1. SIGKILL to every process of the run while it explores
    harness.reset(work, config)
    w = harness.start(work, log)
    explore_working(work, w)
    assert harness.kill(w, "kill") == "explore"
    assert harness.survivors(w) == 0
    pids |= set(w.seen)
    assert (work / ".snakemake" / "locks").is_dir() and any((work / ".snakemake" / "locks").iterdir())
    left = harness.folders_left(pids)  # the dead run's temporary folders, if it had any open

    # the README command resumes; a second one started meanwhile meets a live run's lock and leaves it
    started = time.time_ns()
    rerun = subprocess.Popen(harness.readme_command(work), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, cwd=work)  # fmt: skip
    deadline = time.monotonic() + 60
    while rerun.poll() is None and not own_lock(work, started) and time.monotonic() < deadline:
        time.sleep(0.1)
    if rerun.poll() is None:
        second = subprocess.run(harness.readme_command(work), capture_output=True, text=True, timeout=120)
        # it can run only when the rerun had ended meanwhile (on a loaded machine): then there is nothing left to do
        if second.returncode == 0:
            assert rerun.poll() is not None and "Nothing to be done" in second.stdout + second.stderr
        else:
            assert "cannot be locked" in second.stdout + second.stderr
        assert "removed the lock" not in second.stdout + second.stderr
    out = rerun.communicate(timeout=600)[0]
    assert rerun.returncode == 0, out[-3000:]
    assert "sftree: removed the lock of a dead run" in out
    # none of the dead run's temporary folders outlives the rerun (its own processes may remove some before the
    # rerun's sweep does, so the sweep's count is not the measure; tests/test_run_leftovers.py checks the count)
    assert left == 0 or harness.folders_left(pids) == 0

    # 2. SIGTERM to Snakemake alone while it explores
    harness.reset(work, config)
    w = harness.start(work, log)
    explore_working(work, w)
    assert harness.kill(w, "term") == "explore"
    assert harness.survivors(w) == 0
    pids |= set(w.seen)
    reruns, _ = harness.run_to_end(work, log, tries=1)
    assert reruns == 1

    outs = harness.outputs(work)
    assert sorted(outs) == sorted(reference)
    assert [k for k in reference if outs[k] != reference[k]] == []
    assert harness.redone(work) == 0
    assert harness.folders_left(pids) == 0
