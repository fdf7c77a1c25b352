"""The real workflow for tests: `snakemake` on a work folder, and which rules a run ran."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "workflow/schemas/sft_record.schema.json").read_text())


def snakemake(workdir: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = ["snakemake", "--cores", "2", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    cmd += ["--configfile", str(workdir / "config.yaml"), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=workdir)


def rules_run(res: subprocess.CompletedProcess) -> Counter:
    return Counter(re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", res.stdout + res.stderr))
