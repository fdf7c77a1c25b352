"""The host's memory at an edge's end is bounded whatever the workspace holds: a 120 MiB sparse file the agent
made and graded (`coral eval`) is committed, copied for the grader and sent to the agent's own repository without
the host holding it. Open: the grading copy (runtime/checkout.write_files) and the repository update (the
fast-import stream of runtime/agentrepo.import_stream, sent base64 in one JSON reply by world/coral_command.py)
each hold the file whole, ~480 MiB at the peak, so this fails (strict xfail) until they stream. Without an eval
(the edge's last snapshot alone) the file is streamed into the store and costs nothing (measured: passes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


# Not strict: measured alone it fails (~480 MiB), but inside the whole suite's process history it has passed, so a
# pass is not yet proof of the fix (issue 53: the fault is open)
@pytest.mark.xfail(
    strict=False, reason="open: an eval's grading copy and repository update hold a file whole"
)
def test_a_120_mib_sparse_file_graded_costs_the_host_no_memory(tmp_path):
    steps = [[["bash", {"command": "truncate -s 120M big.bin && coral eval -m big"}]]]
    spec = {"base": str(tmp_path / "mem"), "script": {"1": steps}}
    (tmp_path / "mem").mkdir()
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), *sys.path])}  # helpers, this sftree
    proc = subprocess.run([sys.executable, "-m", "helpers.scripted", json.dumps(spec)],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] is None, out
    # graded (a score): an eval that never ran, say timed out on a loaded machine, would hold nothing and pass
    assert any(isinstance(x, (int, float)) for x in out["scores"]), out
    assert out["peak_mb"] - out["before_mb"] < 60, out
