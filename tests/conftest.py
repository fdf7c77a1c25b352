"""Shared fixtures, and the fast tier. Test helpers live in the tests/helpers/ package (`from helpers.x import y`;
tests/ is on sys.path)."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Tests call `snakemake`, `sftree` and `python3` by name: take them from the environment pytest runs in
# (`.venv/bin/python -m pytest` finds the venv's tools without the venv being activated).
_BIN = os.path.dirname(sys.executable)
if os.path.isfile(os.path.join(_BIN, "sftree")):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")

from helpers.examples import example_snapshots  # noqa: E402
from helpers.tiers import SLOW_MARKERS, is_measured_slow  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """The fast tier is `-m "not slow"` (README, docs/architecture.md "Tests"): a test is slow when it is marked
    so, when it needs one of the installs or services the other markers name, or when it is in the measured list
    (tests/helpers/tiers.py)."""
    for item in items:
        if "slow" in item.keywords:
            continue
        if any(m in item.keywords for m in SLOW_MARKERS) or is_measured_slow(item.nodeid):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def example_snapshots_dir(tmp_path_factory) -> Path:
    """A simulated Student run of both example tasks (40 snapshots each, seed 0), generated once per session.

    Read-only: copy a task folder before changing anything in it.
    """
    return example_snapshots(tmp_path_factory, count=40)
