"""Snakemake resources that keep a fleet of explore jobs within one Teacher server, in real snakemake runs:
`teacher_trees=K` caps the trees explored at once, and `teacher_slots=N` below search.parallel_width caps each
job's own width (the granted value reaches `sftree explore --width`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers.examples import example_snapshots

REPO = Path(__file__).resolve().parents[1]


def _span(tree: dict) -> tuple[str, str]:
    return min(e["started_at"] for e in tree["edges"]), max(e["finished_at"] for e in tree["edges"])


def _overlap(edges: list[dict]) -> bool:
    edges = sorted(edges, key=lambda e: e["started_at"])
    return any(b["started_at"] < a["finished_at"] for a, b in zip(edges, edges[1:], strict=False))


@pytest.mark.slow
def test_teacher_trees_and_granted_teacher_slots(tmp_path, tmp_path_factory):
    snaps = example_snapshots(tmp_path_factory, count=12, tasks=("circle_packing",))
    config = yaml.safe_load((REPO / "examples" / "demo.yaml").read_text())
    config["snapshots"] = str(snaps)
    config["tasks"] = {"circle_packing": config["tasks"]["circle_packing"]}
    config["tasks"]["circle_packing"]["task_dir"] = str(REPO / "examples" / "circle_packing")
    config["select_roots"]["num_roots"] = 2
    config["agent"]["backend"] = "native"  # the scheduling is under test: the fast backend
    config["search"].update(root_children=3, max_depth=1, max_valid_edges=3, parallel_width=3)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cmd = ["snakemake", "--cores", "2", "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
           "--configfile", str(tmp_path / "config.yaml")]  # fmt: skip
    results = tmp_path / "results" / "circle_packing"

    def run(targets: list, flags: list, resources: str) -> str:
        # targets first (--configfile takes every argument after it), --resources last (the same)
        full = [cmd[0], *map(str, targets), *cmd[1:], *flags, "--resources", resources]
        proc = subprocess.run(full, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        return proc.stdout + proc.stderr

    run([], ["--until", "select_roots"], "teacher_trees=1")
    roots = sorted(d.name for d in (results / "roots").iterdir() if d.name.startswith("eval-"))
    assert len(roots) == 2
    files = [Path("results/circle_packing/trees") / r / "tree.json" for r in roots]  # relative to tmp_path

    # two explore jobs, two cores, one tree at a time: the trees never overlap, each at its full width
    run(files, [], "teacher_trees=1")
    trees = [json.loads((tmp_path / f).read_text()) for f in files]
    (a0, a1), (b0, b1) = sorted(_span(t) for t in trees)
    assert a1 <= b0, "the second tree started before the first one finished"
    assert all(t["params"]["parallel_width"] == 3 for t in trees)
    assert any(_overlap(t["edges"]) for t in trees)  # width 3 really ran expansions side by side

    # teacher_slots=1 below parallel_width 3: the job runs with the granted width 1
    out = run(files[:1], ["--forcerun", "explore"], "teacher_slots=1")
    assert "teacher_slots=1" in out  # what Snakemake granted
    tree = json.loads((tmp_path / files[0]).read_text())
    assert tree["params"]["parallel_width"] == 1 and len(tree["edges"]) >= 3
    assert not _overlap(tree["edges"])  # one expansion at a time
    log = (tmp_path / files[0].parent / "explore.log").read_text()
    assert "parallel_width 3 capped to 1 granted teacher slots" in log


def test_width_lowers_never_raises_and_must_be_positive():
    from helpers.mcts import search_params

    from sftree.errors import InputError
    from sftree.search.explore import cap_width

    params = search_params(parallel_width=4)
    assert cap_width(params, None).parallel_width == 4
    assert cap_width(params, 2).parallel_width == 2
    assert cap_width(params, 8).parallel_width == 4
    with pytest.raises(InputError, match="--width must be at least 1"):
        cap_width(params, 0)
