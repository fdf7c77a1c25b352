"""The folders pyproject.toml's [tool.mypy] names are clean under `mypy --strict` (their signatures say what they
take and give: no bare dict, no untyped def, no Any returned as a typed value)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_strict_is_clean_on_the_named_folders():
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout
