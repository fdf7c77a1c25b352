"""Snakemake conventions of the workflow: rule directives, the conda env, and the profiles."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ENV_FILE = REPO / "envs" / "sftree.yaml"
PROFILES = {name: REPO / "profiles" / name / "config.yaml" for name in ("default", "slurm", "slurm-local")}
# Rules that can run for a long time and so record a benchmark: snapshot copying and the tree search.
LONG_RULES = {"select_roots", "explore"}
# Keys that say where and how wide jobs run: they belong to execution profiles, since the workflow profile
# (profiles/default, loaded by itself) overrides the same keys of any --profile.
EXECUTION_KEYS = {
    "executor",
    "cores",
    "jobs",
    "resources",
    "default-resources",
    "set-resources",
    "latency-wait",
}


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    work = tmp_path_factory.mktemp("rules")
    shutil.copy(REPO / "config.yaml", work / "config.yaml")
    with SnakemakeApi(OutputSettings()) as api:
        wf = api.workflow(
            resource_settings=ResourceSettings(),
            config_settings=ConfigSettings(),
            snakefile=REPO / "Snakefile",
            workdir=work,
        )
        return {r.name: r for r in wf._workflow.rules}


def test_every_job_rule_has_log_and_conda_env(rules):
    job_rules = {name: r for name, r in rules.items() if not r.norun}
    assert {"select_roots", "explore", "select_paths", "export_sft", "report"} <= set(job_rules)
    for name, rule in job_rules.items():
        assert rule.log, f"rule {name} has no log:"
        env = rule.conda_env
        assert env is not None, f"rule {name} has no conda:"
        # A relative conda: path is relative to the file that defines the rule.
        assert (Path(str(rule.snakefile)).parent / str(env)).resolve() == ENV_FILE, f"rule {name}: {env}"


def test_long_rules_have_benchmark(rules):
    for name in LONG_RULES:
        assert rules[name].benchmark, f"rule {name} has no benchmark:"


def _requirement_pins(requirements: list[str]) -> dict[str, str]:
    pins = {}
    for req in requirements:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s;#]+).*", req)
        assert match, f"pyproject dependency not pinned with ==: {req}"
        pins[match.group(1).lower()] = match.group(2)
    return pins


def test_conda_env_matches_pyproject_pins():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = _requirement_pins(project["dependencies"])
    # snakemake drives the rules from outside the env; the rules themselves only run `sftree`.
    wanted.pop("snakemake")
    env = yaml.safe_load(ENV_FILE.read_text())
    assert "conda-forge" in env["channels"]
    have = {}
    for dep in env["dependencies"]:
        if isinstance(dep, str):
            name, _, version = dep.partition("=")
            have[name.strip().lower()] = version.strip()
    assert have["python"] == "3.11"
    for name, version in wanted.items():
        assert have.get(name) == version, f"envs/sftree.yaml: {name}={have.get(name)}, pyproject: {version}"
    # Snakemake runs <env>.post-deploy.sh after creating the env: it installs the sftree package.
    assert (REPO / "envs" / "sftree.post-deploy.sh").exists()


def _profile(name: str) -> dict:
    return yaml.safe_load(PROFILES[name].read_text())


def test_profile_keys_are_real_options():
    from snakemake.cli import get_argument_parser
    from snakemake_executor_plugin_slurm import ExecutorSettings

    options = get_argument_parser()._option_string_actions
    slurm_fields = {f.name for f in dataclasses.fields(ExecutorSettings)}
    for name in PROFILES:
        for key in _profile(name):
            assert f"--{key}" in options, f"profiles/{name}: `{key}` is not a snakemake option"
            if key.startswith("slurm-"):
                assert key.removeprefix("slurm-").replace("-", "_") in slurm_fields, key


def test_profiles_split_workflow_and_execution_settings():
    assert not EXECUTION_KEYS & set(_profile("default")), "profiles/default would override execution profiles"
    for name in ("slurm", "slurm-local"):
        prof = _profile(name)
        assert prof["executor"] == "slurm"
        assert any(r.startswith("teacher_slots=") for r in prof["resources"])
        assert {"runtime", "mem_mb", "slurm_partition"} <= set(prof["default-resources"])
        assert {"runtime", "mem_mb"} <= set(prof["set-resources"]["explore"])
        # The rule's threads decide --cpus-per-task: no profile may set cpus_per_task.
        assert "cpus_per_task" not in yaml.safe_dump(prof)
    assert "slurm_account" in _profile("slurm")["default-resources"]
    local = _profile("slurm-local")
    assert local["slurm-no-account"] is True and local["slurm-status-command"] == "squeue"


def test_profiles_readme_explains_every_key():
    readme = (REPO / "profiles" / "README.md").read_text()
    for name in PROFILES:
        for key, value in _profile(name).items():
            assert f"`{key}" in readme, f"profiles/README.md does not explain `{key}` of profiles/{name}"
            if isinstance(value, dict):
                for sub in value:
                    assert f"{key}.{sub}" in readme or f"`{sub}`" in readme, f"{name}: {key}.{sub}"
    for needle in ("--forcerun", "--resources teacher_slots=", "--profile profiles/slurm", "--force "):
        assert needle in readme


@pytest.mark.parametrize("name", ["slurm", "slurm-local"])
def test_profile_loads_in_a_dry_run(tmp_path, name):
    """Snakemake and the plugin accept the profile: resources parse, set-resources reach the job."""
    (tmp_path / "Snakefile").write_text(
        "rule explore:\n    output:\n        'out.txt',\n    threads: 2\n    shell:\n        'echo threads={threads} > {output}'\n"
    )
    env = {"PATH": str(Path(shutil.which("snakemake")).parent) + ":/usr/bin:/bin", "HOME": str(tmp_path)}
    env |= {"SFTREE_SLURM_ACCOUNT": "acct1", "SFTREE_SLURM_PARTITION": "part1"}
    proc = subprocess.run(
        [
            "snakemake",
            "--profile",
            str(PROFILES[name].parent),
            "--dry-run",
            "--printshellcmds",
            "--cores",
            "16",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    resources = re.search(r"resources: (.*)", out).group(1)
    if name == "slurm":
        assert "mem_mb=16000" in resources and "runtime=1440" in resources
        assert "slurm_account=acct1" in resources and "slurm_partition=part1" in resources
        assert "echo threads=8 " in out  # set-threads explore=8 over the rule's 2
    else:
        assert (
            "mem_mb=2000" in resources and "runtime=30" in resources and "slurm_partition=debug" in resources
        )
        assert "echo threads=2 " in out
