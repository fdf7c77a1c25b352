"""Helpers for the tests that use the localhost Slurm cluster of scripts/slurm/start.sh.

Slurm's own record of a job comes from two places, since the test cluster has no accounting database:
squeue (finished jobs stay listed for MinJobAge seconds, with the comment the Snakemake plugin sets,
`rule_<rule>_wildcards_<...>`) and the job completion log (JobCompType=jobcomp/filetxt).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NODE = "localhost"
START_HINT = "start it with `bash scripts/slurm/start.sh` (as root; .ci/run does)"


def _run(cmd: list[str], timeout: float = 15) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def cluster_problem() -> str | None:
    """None when the localhost cluster answers and its node can take jobs, else why not."""
    for tool in ("sinfo", "sbatch", "squeue", "scontrol"):
        if shutil.which(tool) is None:
            return f"no Slurm cluster: `{tool}` is not installed; {START_HINT}"
    try:
        out = _run(["sinfo", "-h", "-n", NODE, "-o", "%t"])
    except subprocess.TimeoutExpired:
        return f"no Slurm cluster: sinfo timed out; {START_HINT}"
    state = out.stdout.strip()
    if out.returncode != 0 or not state:
        return f"no Slurm cluster: sinfo says {out.stderr.strip() or 'no node ' + NODE!r}; {START_HINT}"
    if not re.match(r"(idle|mix|alloc)", state):
        return f"Slurm node {NODE} is {state!r}, not usable; {START_HINT}"
    return None


def require_cluster() -> None:
    problem = cluster_problem()
    if problem:
        pytest.skip(problem)


def slurm_config() -> dict[str, str]:
    out = _run(["scontrol", "show", "config"])
    conf = {}
    for line in out.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            conf[key.strip()] = value.strip()
    return conf


@dataclass
class SlurmJob:
    """One job as squeue reports it."""

    job_id: str
    state: str
    name: str
    comment: str
    cpus: int
    min_memory: str

    @property
    def rule(self) -> str:
        # The plugin's comment is rule_<name> or rule_<name>_wildcards_<...>.
        return self.comment.removeprefix("rule_").split("_wildcards_")[0]


def squeue_jobs(run_name: str) -> list[SlurmJob]:
    """Every job (pending, running or finished within MinJobAge) with this job name."""
    out = _run(["squeue", "--states=all", "--noheader", "--name", run_name, "-o", "%i|%T|%j|%k|%C|%m"])
    assert out.returncode == 0, out.stderr
    jobs = []
    for line in out.stdout.splitlines():
        job_id, state, name, comment, cpus, mem = line.split("|")
        jobs.append(SlurmJob(job_id, state, name, comment, int(cpus), mem))
    return jobs


def jobcomp_records(path: str | os.PathLike, run_name: str) -> dict[str, dict[str, str]]:
    """This run's jobs in the job completion log (one `Key=Value ...` line per finished job), by JobId."""
    records = {}
    for line in Path(path).read_text().splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if fields.get("Name") == run_name:
            records[fields["JobId"]] = fields
    return records


def run_id_from_log(text: str) -> str:
    """The plugin names every job of a run after the run's UUID and logs it once."""
    match = re.search(r"SLURM run ID: (\S+)", text)
    assert match, "no 'SLURM run ID' line in snakemake's output:\n" + text[-3000:]
    return match.group(1)


def snakemake_env() -> dict[str, str]:
    env = dict(os.environ)
    # A test run inside a Slurm job would confuse the plugin; we always submit from outside.
    for key in [k for k in env if k.startswith("SLURM_")]:
        del env[key]
    return env
