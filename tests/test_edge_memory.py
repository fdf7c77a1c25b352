"""The host's memory at an edge's end is bounded whatever the workspace holds: a 120 MiB sparse file the agent
made and graded (`coral eval`) is committed, copied for the grader (runtime/checkout.write_files) and sent to the
agent's own repository (runtime/agentrepo.import_stream into a host file, sent after the reply by
world/coral_command.py), each streamed a chunk at a time from the store. Held whole, as before, they cost ~480 MiB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


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
