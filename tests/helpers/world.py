"""A World over the example task (stand-in or the real Coral) and hand-made attempt records."""

from __future__ import annotations

from pathlib import Path

from helpers.coral import coral_settings
from sftree.world.task import load_coral_task
from sftree.world.world import World

TASK = Path(__file__).resolve().parents[2] / "examples" / "circle_packing"


def make(kind, task_dir=TASK, agents=1):
    install = None
    if kind == "coral":
        from sftree.world.locate import locate

        install = locate(coral_settings())
    return World(
        load_coral_task(task_dir, "circle_packing"), agent_id="agent-1", agents=agents, install=install
    )


def rec(i, score, title="t", feedback="", cls=None):
    r = {
        "commit_hash": f"{i:03d}" + "f" * 37,
        "agent_id": "agent-1",
        "title": title,
        "score": score,
        "status": "improved",
        "parent_hash": None,
        "timestamp": f"2026-01-01T00:00:{i:02d}+00:00",
        "feedback": feedback,
    }
    if cls:
        r["metadata"] = {"budget_class": cls}
    return r
