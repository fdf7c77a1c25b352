"""The select_roots checkpoint through the real Snakemake workflow, on the generated example run."""

import json
import shutil
import subprocess

import pytest
import yaml
from helpers.examples import REPO, task_config
from helpers.roots import read_table


def snakemake(workdir, *args):
    cmd = [
        "snakemake",
        *args,
        "--cores",
        "2",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=workdir)


@pytest.mark.slow
def test_select_roots_checkpoint(example_snapshots_dir, tmp_path):
    snaps = tmp_path / "snapshots"
    shutil.copytree(example_snapshots_dir, snaps)  # this test touches a file below
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(task_config(snaps, num_roots=10)))
    targets = [f"results/{t}/stages.tsv" for t in ("circle_packing", "tsp")]
    proc = snakemake(tmp_path, *targets)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for task in ("circle_packing", "tsp"):
        res = tmp_path / "results" / task
        rows = read_table(res / "stages.tsv")
        pending = sum(
            "eval_ok" not in json.loads((d / "metadata.json").read_text())
            for d in (snaps / task).iterdir()
            if d.name.startswith("eval-")
        )
        assert len(rows) == 40 - pending
        roots = sorted(d.name for d in (res / "roots").iterdir() if d.is_dir())  # not .snakemake_timestamp
        assert len(roots) == 10 and roots == sorted(r["snapshot"] for r in rows if r["selected"] == "true")
        for name in roots:
            meta = json.loads((res / "roots" / name / "metadata.json").read_text())
            assert meta["eval_ok"] is True and meta["task"] == task and meta["score"] is not None
            assert meta["stage"] in ("early", "middle", "late") and meta["selection_reason"]
            assert (res / "roots" / name / "code" / "solution.py").is_file()
            # the default placement: the root refers to its snapshot (docs/select_roots.md)
            assert (res / "roots" / name / "code").resolve() == (snaps / task / name / "code").resolve()
        assert (res / "report" / "stages.svg").read_text().startswith("<svg")
        assert "roots -> " in (res / "logs" / "select_roots.log").read_text()
    # A changed snapshot makes the checkpoint stale: its metadata.json is an input (Snakemake 9 compares
    # checksums, so the content must change, not only the mtime); the other task stays up to date.
    meta = next((snaps / "tsp").glob("eval-000005-*/metadata.json"))
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "note": "edited"}))
    proc = snakemake(tmp_path, "-n", *targets)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # (select_roots prints its `message:` line, "Job N: select_roots <task>: ...", not Snakemake's job details)
    assert f"Updated input files: {meta}" in proc.stdout and "select_roots tsp: " in proc.stdout
    assert "select_roots circle_packing" not in proc.stdout
