"""Fixtures of the security tests: a base folder outside /tmp, and a scripted-Teacher tree in it."""

from __future__ import annotations

import shutil

import pytest
from helpers.scripted import Scripted, make_base


@pytest.fixture
def base():
    b = make_base()
    yield b
    shutil.rmtree(b, ignore_errors=True)


@pytest.fixture
def scripted(base):
    """scripted(script, agent={...}, extra={...}) -> Scripted; closed at the end of the test."""
    made = []

    def make(script: dict, agent: dict | None = None, extra: dict | None = None) -> Scripted:
        s = Scripted(base, script, agent=agent, extra=extra)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()
