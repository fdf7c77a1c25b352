"""`tasks.<task>.coral_run`: the workflow imports a Coral run folder (rule import_coral) before select_roots."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from helpers.coralrun import build_run, record_bytes, simple_specs
from helpers.examples import REPO


def snakemake(workdir, *args, timeout=300):
    cmd = [
        "snakemake",
        *args,
        "--cores",
        "2",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
    ]
    cmd += ["--configfile", str(workdir / "config.yaml")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=workdir)


def write_config(tmp_path, run, **extra):
    config = {
        "snapshots": "all_snapshots",
        "results": "results",
        "tasks": {"synth": {"direction": "maximize", "coral_run": str(run), "grader": "true"}},
        "select_roots": {"num_roots": 2},
        **extra,
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.mark.slow
def test_select_roots_starts_from_the_imported_coral_run(tmp_path):
    built = build_run(tmp_path / "run", simple_specs(10))
    write_config(tmp_path, built.run)
    proc = snakemake(tmp_path, "results/synth/stages.tsv")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "rule import_coral:" in proc.stderr
        and "select_roots synth: snapshots all_snapshots/synth" in proc.stderr
    )
    snaps = tmp_path / "all_snapshots" / "synth"
    assert len([p for p in snaps.iterdir() if p.name.startswith("eval-")]) == 10
    rows = (tmp_path / "results/synth/stages.tsv").read_text().splitlines()
    assert len(rows) == 1 + 9  # the pending attempt is skipped
    log = (tmp_path / "results/synth/logs/import_coral.log").read_text()
    assert "10 attempt records -> 10 snapshots" in log
    again = snakemake(tmp_path, "results/synth/stages.tsv", "-n")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    # the run goes on: the pending attempt is graded, so the attempts folder changes and the import reruns
    last = built.records[-1]
    graded = dict(last, status="improved", score=2.0, feedback="ok")
    path = built.run / ".coral/public/attempts" / f"{last['commit_hash']}.json"
    tmp = path.with_name(f".{path.name}.tmp")  # as Coral writes a record: a temporary file, then a rename
    tmp.write_bytes(record_bytes(graded))
    os.replace(tmp, path)
    proc = snakemake(tmp_path, "results/synth/stages.tsv")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 rebuilt" in (tmp_path / "results/synth/logs/import_coral.log").read_text()
    assert len((tmp_path / "results/synth/stages.tsv").read_text().splitlines()) == 1 + 10
    report = json.loads((snaps / "import-coral.json").read_text())
    assert report["counts"]["pending"] == 0 and report["coral"]["task"] == "Synthetic Task"


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"example_run": {"count": 8}}, "coral_run and example_run exclude each other"),
        ({"tasks_snapshots": True}, "has coral_run and snapshots"),
        ({"tasks_bad": True}, "coral_run"),
    ],
)
def test_coral_run_config_errors_are_clear(tmp_path, extra, message):
    write_config(tmp_path, tmp_path / "run")
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    if extra.pop("tasks_snapshots", False):
        config["tasks"]["synth"]["snapshots"] = str(tmp_path / "elsewhere")
    if extra.pop("tasks_bad", False):
        config["tasks"]["synth"]["coral_run"] = 3
    config |= extra
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "-n")
    assert proc.returncode != 0 and message in proc.stdout + proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow
def test_a_multi_island_run_is_imported_and_selected_per_island(tmp_path):
    """The rule follows every island's attempts folder; select_roots.per_island gives each island its roots."""
    from helpers.coralrun import Spec

    specs = []
    for i in range(12):
        island = "1" if i % 4 == 3 else "0"
        budget = "tune" if i == 5 else "real"
        specs.append(Spec(f"agent-{island}", {"v.py": f"{i}\n".encode()}, "improved", 0.1 + 0.01 * i,
                          title=f"attempt {i}", budget=budget, island=island))  # fmt: skip
    built = build_run(tmp_path / "run", specs)
    write_config(tmp_path, built.run, select_roots={"num_roots": 4, "per_island": True})
    proc = snakemake(tmp_path, "results/synth/stages.tsv")
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (tmp_path / "results/synth/logs/import_coral.log").read_text()
    assert "12 attempt records -> 11 snapshots" in log and "left out (no score of the run): 1 tune" in log
    roots = tmp_path / "results/synth/roots"
    islands = sorted(json.loads((p / "metadata.json").read_text())["island_id"] for p in roots.glob("eval-*"))
    assert islands == ["0", "0", "1", "1"]
    # a record of island 1 is rewritten (as Coral writes one: a temporary file, then a rename): the import reruns
    again = snakemake(tmp_path, "results/synth/stages.tsv", "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
    rec = built.records[3]
    path = built.run / ".coral/islands/1/attempts" / f"{rec['commit_hash']}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(record_bytes(dict(rec, feedback="regraded")))
    os.replace(tmp, path)
    later = snakemake(tmp_path, "results/synth/stages.tsv", "-n")
    assert "import_coral" in later.stdout + later.stderr
