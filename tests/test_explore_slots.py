"""A global `--resources teacher_slots=N` below search.parallel_width caps each explore job's own width."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers_examples import example_snapshots

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_granted_teacher_slots_reach_the_explore_job(tmp_path, tmp_path_factory):
    snaps = example_snapshots(tmp_path_factory, count=12, tasks=("circle_packing",))
    config = yaml.safe_load((REPO / "examples" / "demo.yaml").read_text())
    config["snapshots"] = str(snaps)
    config["tasks"] = {"circle_packing": config["tasks"]["circle_packing"]}
    config["tasks"]["circle_packing"]["task_dir"] = str(REPO / "examples" / "circle_packing")
    config["select_roots"]["num_roots"] = 1
    config["search"].update(root_children=3, max_depth=1, max_valid_edges=3, parallel_width=3)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cmd = ["snakemake", "--cores", "2", "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
           "--configfile", str(tmp_path / "config.yaml")]  # fmt: skip
    cap = ["--resources", "teacher_slots=1"]  # last: it takes every argument after it
    results = tmp_path / "results" / "circle_packing"
    # the checkpoint first, then the one explore job it leads to (asked for by its output)
    proc = subprocess.run(
        [*cmd, "--until", "select_roots", *cap], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (root,) = [d.name for d in (results / "roots").iterdir() if d.name.startswith("eval-")]
    tree_file = results / "trees" / root / "tree.json"
    proc = subprocess.run(
        [cmd[0], str(tree_file.relative_to(tmp_path)), *cmd[1:], *cap],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "teacher_slots=1" in proc.stdout + proc.stderr  # what Snakemake granted
    tree = json.loads(tree_file.read_text())
    assert tree["params"]["parallel_width"] == 1
    edges = sorted(tree["edges"], key=lambda e: e["started_at"])
    assert len(edges) >= 3
    # one expansion at a time: each edge starts after the one before it finished (with width 3 they overlap)
    assert all(b["started_at"] >= a["finished_at"] for a, b in zip(edges, edges[1:], strict=False))
    log = (tree_file.parent / "explore.log").read_text()
    assert "parallel_width 3 capped to 1 granted teacher slots" in log


def test_width_lowers_never_raises_and_must_be_positive():
    from sftree.errors import InputError
    from sftree.explore import cap_width
    from sftree.tree import SearchParams

    params = SearchParams(parallel_width=4)
    assert cap_width(params, None).parallel_width == 4
    assert cap_width(params, 2).parallel_width == 2
    assert cap_width(params, 8).parallel_width == 4
    with pytest.raises(InputError, match="--width must be at least 1"):
        cap_width(params, 0)
