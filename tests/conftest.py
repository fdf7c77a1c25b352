"""Shared fixtures. Test helpers live in tests/helpers_*.py (importable: pytest puts tests/ on sys.path)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers_examples import example_snapshots  # noqa: E402


@pytest.fixture(scope="session")
def example_snapshots_dir(tmp_path_factory) -> Path:
    """A simulated Student run of both example tasks (40 snapshots each, seed 0), generated once per session.

    Read-only: copy a task folder before changing anything in it.
    """
    return example_snapshots(tmp_path_factory, count=40)
