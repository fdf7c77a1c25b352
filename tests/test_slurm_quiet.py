"""profiles/slurm-local on the localhost cluster (no accounting database) runs without account warnings.

snakemake-executor-plugin-slurm 2.8.0, given no `slurm_account`, guesses one with sacct and warns ("not able
to get a SLURM account via sacct") on every run; `slurm-no-account: true` in the profile says none is wanted
and the workflow drops those warnings (workflow/rules/common.smk). One select_roots job through sbatch.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml
from helpers.examples import task_config
from helpers.slurm import REPO, require_cluster, run_id_from_log, snakemake_env, squeue_jobs

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_no_account_warnings_on_a_cluster_without_accounting(tmp_path_factory, example_snapshots_dir):
    require_cluster()
    work = tmp_path_factory.mktemp("slurm_quiet")  # under /tmp: the Slurm job (root, same machine) sees it
    (work / "config.yaml").write_text(yaml.safe_dump(task_config(example_snapshots_dir, num_roots=2)))
    cmd = ["snakemake", "--snakefile", str(REPO / "Snakefile"), "--configfile", str(work / "config.yaml")]
    cmd += ["--profile", str(REPO / "profiles" / "slurm-local"), "results/tsp/stages.tsv"]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=300, env=snakemake_env())
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    jobs = squeue_jobs(run_id_from_log(log))
    assert [(j.rule, j.state) for j in jobs] == [
        ("select_roots", "COMPLETED")
    ]  # it really went through sbatch
    assert "account" not in log.lower(), [ln for ln in log.splitlines() if "account" in ln.lower()]
