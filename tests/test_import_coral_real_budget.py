"""Budget classes through the real Coral (../shared/coral, pinned 0af5127): a `coral eval --tune` is left out of
the import; the `real` ones, a crash and a program that ran past the grader's timeout among them (the task's
grader reports both as failed evals, which Coral keeps `real`), become snapshots. Coral stamps `grader_error` only
when the grader itself raises or the daemon's own timeout wins the race with the grader's (the daemon's comment),
which a scripted agent cannot cause reliably: that class is tested on fixtures in upstream's format
(tests/test_import_coral_islands.py). The pinned Coral has no islands (`hub/_island.py` came later): island runs
are tested on such fixtures only.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.coral import CoralRun, coral, coral_python, needs_coral

from sftree.roots.import_coral import REPORT_JSON, run_import

pytestmark = [needs_coral, coral, pytest.mark.slow]


def coral_classes(run_dir: Path) -> dict[str, str]:
    """commit -> budget class, as Coral itself reads them (read_attempts, Attempt.budget_class)."""
    code = (
        "import json, sys\nfrom coral.hub.attempts import read_attempts\n"
        "print(json.dumps({a.commit_hash: a.budget_class for a in read_attempts(sys.argv[1])}))"
    )
    out = subprocess.run(
        [coral_python(), "-c", code, str(run_dir / ".coral")], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_a_real_coral_run_with_tune_and_grader_error_attempts(tmp_path):
    plan = {
        "agent-1": [
            {"message": "baseline: the seed as it is"},
            {"message": "tune: a smaller ring on the dev split", "set": {"INNER_RING": 0.2}, "tune": True},
            {"message": "hangs in the grader", "sleep": 120},  # past the grader's timeout: a failed eval
            {"message": "half-finished edit", "break": "syntax"},  # the code crashed: stays real
            {"message": "inner ring 0.28", "set": {"INNER_RING": 0.28}},
        ]
    }
    with CoralRun(tmp_path / "coral", "circle_packing", plan, grader_timeout=20) as run:
        records = run.wait(
            lambda rs: len(rs) == 5 and all(r["status"] != "pending" for r in rs),
            timeout=600,
            what="5 graded",
        )
        run.stop()
    classes = coral_classes(run.run_dir)
    assert sorted(classes.values()) == ["real", "real", "real", "real", "tune"], records
    out = tmp_path / "snaps" / "circle"
    result = run_import(run.run_dir, out)
    assert result.problems == []
    got = sorted(json.loads((p / "metadata.json").read_text())["commit_hash"] for p in out.glob("eval-*"))
    assert got == sorted(c for c, k in classes.items() if k == "real")
    report = json.loads((out / REPORT_JSON).read_text())
    assert report["budget_classes"] == {"real": 4, "tune": 1, "grader_error": 0}
    tune = next(c for c, k in classes.items() if k == "tune")
    rows = [r.split("\t") for r in (out / "import-coral.tsv").read_text().splitlines()]
    assert [r[7] for r in rows if r[2] == tune] == ["left out: budget_class tune"]
