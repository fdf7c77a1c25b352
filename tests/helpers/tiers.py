"""The fast tier (`pytest -m "not slow"`, docs/architecture.md "Tests"): what conftest.py marks slow besides the
tests marked so in their own file.

- SLOW_MARKERS: a test that needs an install or a service beyond `.venv` (Slurm, the OpenCode CLI, the real Coral,
  llama-server, sglang-router, the trainer venv) is slow whatever its own time.
- MEASURED: tests (or whole files) measured at a second or more each (`pytest --durations=0` on 2 shared cores);
  an entry names a file, `file::test` (all its parameters) or one parametrised id. A test renamed or removed
  fails tests/test_conventions_fast_tier.py until its entry follows it.
"""

from __future__ import annotations

SLOW_MARKERS = ("slurm", "opencode", "coral", "llm", "router", "trainer")

MEASURED: tuple[str, ...] = ()


def _base(nodeid: str) -> str:
    return nodeid.split("[", 1)[0]


def is_measured_slow(nodeid: str) -> bool:
    return any(nodeid == e or _base(nodeid) == e or nodeid.startswith(e + "::") for e in MEASURED)


# The command README.md names for the fast tier (tests/test_readme_commands.py, tests/test_conventions_fast_tier.py)
FAST_COMMAND = '.venv/bin/python -m pytest -q -m "not slow"'
