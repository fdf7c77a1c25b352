"""The workflow passes Snakemake's linter and snakefmt, and the Python code passes ruff.

Each tool runs on the repository read-only: snakemake from a scratch directory (it writes .snakemake/ where it
runs), ruff without its cache.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "examples" / "demo.yaml"


def _tool(name: str) -> str:
    path = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(path).exists():
        pytest.fail(f"`{name}` is not installed (pip install -e '.[dev]')")
    return path


def _show(proc: subprocess.CompletedProcess) -> str:
    return (proc.stdout + proc.stderr)[-6000:]


def test_snakemake_lint(tmp_path):
    # The Snakefile's `configfile: "config.yaml"` is read from the working directory.
    shutil.copy(REPO / "config.yaml", tmp_path / "config.yaml")
    cmd = [_tool("snakemake"), "--snakefile", str(REPO / "Snakefile"), "--lint"]
    if DEMO_CONFIG.exists():
        cmd += ["--configfile", str(DEMO_CONFIG)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, "snakemake --lint found problems:\n" + _show(proc)
    assert "Lints for" not in proc.stdout + proc.stderr


def test_snakefmt_check():
    files = [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
    proc = subprocess.run(
        [_tool("snakefmt"), "--check", *map(str, files)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        diff = subprocess.run(
            [_tool("snakefmt"), "--diff", *map(str, files)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        pytest.fail("snakefmt --check failed; the changes it wants:\n" + _show(diff))


def test_ruff_check():
    dirs = [d for d in ("src", "tests", "benchmarks", "scripts") if (REPO / d).exists()]
    proc = subprocess.run(
        [_tool("ruff"), "check", "--no-cache", *dirs],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, "ruff check failed:\n" + _show(proc)
