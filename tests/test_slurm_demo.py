"""The demo workflow through `snakemake --profile profiles/slurm-local` on the localhost Slurm cluster.

One run (module fixture): examples/demo.yaml with one root per task and `--set-threads report=2`. Checked against
Slurm's own record (squeue's comment per job, the job completion log): every rule's jobs went through sbatch and
completed, threads became --cpus-per-task, the profile's resources reached sbatch. Then, locally: a rerun of
everything after explore reproduces the Slurm run's outputs, and `--resources teacher_slots=N` caps explore.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
import yaml
from helpers.slurm import (
    REPO,
    jobcomp_records,
    require_cluster,
    run_id_from_log,
    slurm_config,
    snakemake_env,
    squeue_jobs,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# Jobs per rule for two tasks with one root each; `all` has no command and stays local.
EXPECTED_JOBS = {
    "select_roots": 2,
    "grader_env": 2,  # each task's grader preflight (a packaged grader's venv built or reused)
    "explore": 2,
    "select_paths": 2,
    "export_sft": 2,
    "merge_sft": 1,
    "report": 1,
}
TREE_SCHEMA = json.loads((REPO / "workflow" / "schemas" / "tree.schema.json").read_text())


def _snakemake(work: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--configfile",
        str(work / "config.yaml"),
        *extra,
    ]
    return subprocess.run(
        cmd, cwd=work, capture_output=True, text=True, timeout=480, env=snakemake_env(), check=False
    )


def _outputs(results: Path) -> dict[str, bytes]:
    """Every output file (not logs or benchmarks, which hold times) by relative path."""
    files = {}
    for p in sorted(results.rglob("*")):
        rel = p.relative_to(results).as_posix()
        if p.is_file() and not re.search(r"(^|/)(logs|benchmarks)/|\.log$|/work/|/store/", rel):
            files[rel] = p.read_bytes()
    return files


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory, example_snapshots_dir):
    require_cluster()
    # Slurm jobs run as root on this machine and must see the directory: pytest's tmp is under /tmp.
    work = tmp_path_factory.mktemp("slurm_demo")
    config = yaml.safe_load((REPO / "examples" / "demo.yaml").read_text())
    del config["example_run"]  # the session's simulated run stands in for the demo's example_run rule
    config["agent"]["backend"] = "native"  # Slurm's handling of the rules is under test: the fast backend
    config["snapshots"] = str(example_snapshots_dir)
    for task in config["tasks"].values():
        task["coral_task"] = str(REPO / task["coral_task"])
    config["select_roots"]["num_roots"] = 1
    (work / "config.yaml").write_text(yaml.safe_dump(config))

    proc = _snakemake(
        work,
        "--profile",
        str(REPO / "profiles" / "slurm-local"),
        "--set-threads",
        "report=2",
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    run_name = run_id_from_log(log)
    jobs = squeue_jobs(run_name)
    records = jobcomp_records(slurm_config()["JobCompLoc"], run_name)
    return work, log, jobs, records


def test_every_rule_ran_as_a_completed_slurm_job(slurm_run):
    work, log, jobs, records = slurm_run
    assert Counter(j.rule for j in jobs) == EXPECTED_JOBS
    assert sorted(records) == sorted(j.job_id for j in jobs)
    assert {j.state for j in jobs} == {"COMPLETED"}
    for job in jobs:
        rec = records[job.job_id]  # Slurm's completion record of this very job
        assert (rec["JobState"], rec["ExitCode"], rec["WorkDir"]) == ("COMPLETED", "0:0", str(work))
    # Snakemake saw the same jobs finish, and ran none of them itself.
    finished = Counter(re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", log))
    assert finished == {**EXPECTED_JOBS, "all": 1}
    assert set(re.findall(r"localrule (\w+):", log)) == {"all"}
    # Each job's wildcards reached Slurm: one select_roots per task, one explore per chosen root.
    roots = sorted(
        (p.parents[2].name, p.parent.name) for p in (work / "results").glob("*/roots/*/metadata.json")
    )
    assert sorted(j.comment for j in jobs if j.rule == "select_roots") == [
        "rule_select_roots_wildcards_circle_packing",
        "rule_select_roots_wildcards_tsp",
    ]
    explore = sorted(j.comment for j in jobs if j.rule == "explore")
    assert explore == [f"rule_explore_wildcards_{task}_{root}" for task, root in roots]


def test_threads_and_resources_reach_sbatch(slurm_run):
    _, _, jobs, records = slurm_run
    # --set-threads report=2 -> --cpus-per-task=2: the rule's threads win (no profile sets cpus_per_task).
    assert {(j.rule, j.cpus) for j in jobs} == {(r, 2 if r == "report" else 1) for r in EXPECTED_JOBS}
    # profiles/slurm-local: mem_mb 1000 / runtime 10 by default, explore 2000 / 30 (set-resources).
    assert {(j.rule, j.min_memory) for j in jobs} == {
        (r, "2000M" if r == "explore" else "1000M") for r in EXPECTED_JOBS
    }
    limits = {(j.rule, records[j.job_id]["TimeLimit"]) for j in jobs}
    assert limits == {(r, "30" if r == "explore" else "10") for r in EXPECTED_JOBS}


def test_outputs_valid_and_same_as_a_local_rerun(slurm_run):
    work, _, _, _ = slurm_run
    results = work / "results"
    trees = sorted(results.glob("*/trees/*/tree.json"))
    assert [t.parents[2].name for t in trees] == ["circle_packing", "tsp"]
    for tree in trees:
        doc = json.loads(tree.read_text())
        jsonschema.validate(doc, TREE_SCHEMA)
        assert doc["status"] == "finished" and doc["counters"]["edges"] >= 1
    for name in ("sft.jsonl", "dataset_info.json", "dataset_card.md", "report.html"):
        assert (results / name).stat().st_size > 0, name
    before = _outputs(results)

    # Everything after explore again, locally: same files, same contents (report.html holds a timestamp).
    proc = _snakemake(work, "--cores", "2", "--forcerun", "select_paths")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    after = _outputs(results)
    assert sorted(after) == sorted(before)
    differ = sorted(name for name in before if before[name] != after[name])
    assert differ in ([], ["report.html"]), differ
    assert before["sft.jsonl"] and before["sft.jsonl"] == after["sft.jsonl"]


def test_teacher_slots_cap_explore(slurm_run):
    work, _, _, _ = slurm_run
    # Each explore job asks for search.parallel_width slots; a smaller global limit lowers the request so
    # the job still runs (one tree at a time). A dry run shows what the scheduler would grant.
    width = yaml.safe_load((work / "config.yaml").read_text())["search"]["parallel_width"]
    assert width > 1
    for limit, granted in ((None, width), (1, 1)):
        extra = ["--resources", f"teacher_slots={limit}"] if limit else []
        proc = _snakemake(work, "--cores", "2", "--dry-run", "--forcerun", "explore", *extra)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        blocks = [b for b in out.split("\nrule ") if b.startswith("explore:")]
        assert len(blocks) == 2, out[-3000:]
        assert all(f"teacher_slots={granted}" in b for b in blocks)
