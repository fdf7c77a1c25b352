"""Score records as a task's grader builds them (the stand-in's; see coral/__init__.py here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Task:
    id: str
    name: str
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Score:
    value: float | int | None
    name: str
    explanation: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class ScoreBundle:
    scores: dict[str, Score]
    aggregated: float | None = None
    is_public: bool = True
    feedback: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str) -> Score | None:
        return self.scores.get(name)
