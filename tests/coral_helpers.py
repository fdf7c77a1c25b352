"""The real Coral for tests: `.venv-coral` made by scripts/install_coral.sh from ../shared/coral.

from coral_helpers import coral_python, coral_run, needs_coral
pytestmark = needs_coral          # skipped, with the reason, where Coral is not installed
out = coral_run("from coral.template.coral_md import generate_coral_md; ...")   # stdout of a script in Coral's Python
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORAL_SRC = Path(os.environ.get("CORAL_SRC", REPO.parent / "shared" / "coral"))
VENV = REPO / ".venv-coral"


@functools.cache
def coral_python() -> str | None:
    """The interpreter that imports the pinned Coral, installing it once when its source is here; None if absent."""
    py = VENV / "bin" / "python"
    if not (CORAL_SRC / "pyproject.toml").is_file():
        return None
    if (
        not py.exists()
        or subprocess.run([str(py), "-c", "import coral.config"], capture_output=True).returncode
    ):
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "install_coral.sh")], capture_output=True, text=True
        )
        if proc.returncode:
            return None
    return str(py)


needs_coral = pytest.mark.skipif(
    coral_python() is None,
    reason=f"the real Coral is not installed: no {CORAL_SRC} or scripts/install_coral.sh failed",
)
coral = pytest.mark.coral


def coral_run(script: str, *args: str, cwd: str | None = None, timeout: float = 120) -> str:
    """Run a Python script in Coral's interpreter; its stdout (a failure raises with its stderr)."""
    proc = subprocess.run(
        [coral_python(), "-c", script, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )
    if proc.returncode:
        raise AssertionError(f"Coral script failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


def coral_config(**world) -> dict:
    """A config's `coral:` section for the pinned Coral."""
    return {"python": coral_python(), "mode": "coral", **world}
