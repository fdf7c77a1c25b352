"""profiles/slurm-local on the localhost Slurm cluster, with a tiny workflow (fast).

Checks what the profile promises, against Slurm's own record: every job goes through sbatch, the rule's threads
become --cpus-per-task, set-resources reaches sbatch's --mem, and the global teacher_slots limit (given on the
command line, overriding the profile) keeps two explore jobs from being in flight together.
"""

from __future__ import annotations

import subprocess
import textwrap

import pytest
from slurm_helpers import (
    REPO,
    jobcomp_records,
    require_cluster,
    run_id_from_log,
    slurm_config,
    snakemake_env,
    squeue_jobs,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SNAKEFILE = textwrap.dedent(
    """
    rule all:
        input:
            expand("out/{x}.txt", x=["p", "q"]),


    rule prepare:
        output:
            "prep/{x}.txt",
        log:
            "logs/prepare/{x}.log",
        shell:
            "echo $SLURM_JOB_ID > {output} 2> {log}"


    rule explore:
        input:
            "prep/{x}.txt",
        output:
            "out/{x}.txt",
        log:
            "logs/explore/{x}.log",
        threads: 2
        resources:
            teacher_slots=8,
        shell:
            "(cat {input}; echo $SLURM_JOB_ID $SLURM_CPUS_PER_TASK) > {output} 2> {log}"
    """
)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    require_cluster()
    # Slurm jobs run as root on this machine and must see the directory: pytest's tmp is under /tmp.
    work = tmp_path_factory.mktemp("slurm_smoke")
    (work / "Snakefile").write_text(SNAKEFILE)
    cmd = [
        "snakemake",
        "--profile",
        str(REPO / "profiles" / "slurm-local"),
        "--resources",
        "teacher_slots=8",
    ]
    proc = subprocess.run(
        cmd, cwd=work, capture_output=True, text=True, timeout=300, env=snakemake_env(), check=False
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return work, log


def test_every_job_went_through_sbatch(smoke_run):
    work, log = smoke_run
    jobs = squeue_jobs(run_id_from_log(log))
    by_rule = sorted((j.rule, j.comment) for j in jobs)
    assert by_rule == [
        ("explore", "rule_explore_wildcards_p"),
        ("explore", "rule_explore_wildcards_q"),
        ("prepare", "rule_prepare_wildcards_p"),
        ("prepare", "rule_prepare_wildcards_q"),
    ]
    assert {j.state for j in jobs} == {"COMPLETED"}

    # The job completion log is Slurm's record that each job ran to the end, in our directory.
    records = jobcomp_records(slurm_config()["JobCompLoc"])
    for job in jobs:
        rec = records[job.job_id]
        assert rec["JobState"] == "COMPLETED"
        assert rec["ExitCode"] == "0:0"
        assert rec["WorkDir"] == str(work)

    # Each rule's shell ran inside its own Slurm job.
    ids = {j.comment: j.job_id for j in jobs}
    for x in ("p", "q"):
        lines = (work / f"out/{x}.txt").read_text().splitlines()
        prep_id, (explore_id, cpus) = lines[0], lines[1].split()
        assert prep_id == ids[f"rule_prepare_wildcards_{x}"]
        assert explore_id == ids[f"rule_explore_wildcards_{x}"]
        assert cpus == "2"


def test_threads_and_set_resources_reach_sbatch(smoke_run):
    _, log = smoke_run
    jobs = squeue_jobs(run_id_from_log(log))
    # threads: 2 -> --cpus-per-task=2 (no profile sets cpus_per_task, so threads win); default threads 1.
    assert {(j.rule, j.cpus) for j in jobs} == {("explore", 2), ("prepare", 1)}
    # profiles/slurm-local: default mem_mb 1000, set-resources explore mem_mb 2000.
    assert {(j.rule, j.min_memory) for j in jobs} == {("explore", "2000M"), ("prepare", "1000M")}


def test_teacher_slots_limit_serializes_explore(smoke_run):
    _, log = smoke_run
    jobs = squeue_jobs(run_id_from_log(log))
    records = jobcomp_records(slurm_config()["JobCompLoc"])
    explore = sorted((records[j.job_id] for j in jobs if j.rule == "explore"), key=lambda r: r["SubmitTime"])
    assert len(explore) == 2
    # Each explore asks for 8 of the 8 slots, so the second is submitted only after the first ended
    # (ISO timestamps compare as strings).
    assert explore[1]["SubmitTime"] >= explore[0]["EndTime"]
