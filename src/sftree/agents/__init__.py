"""Agent backends behind one interface (`AgentBackend.run_turn`), chosen by config `agent.backend`.

`native` (agents/native.py) is a Python loop with OpenCode's tool names and schemas. `opencode` (the real
OpenCode CLI behind a recording proxy, agents/opencode.py and docs/opencode.md) needs the opencode binary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sftree.agents.base import AgentBackend, Teacher, ToolOutcome, TurnOutcome, TurnRun
from sftree.errors import InputError

if TYPE_CHECKING:
    from sftree.settings import Settings
    from sftree.world.world import World

__all__ = ["AgentBackend", "Teacher", "ToolOutcome", "TurnOutcome", "TurnRun", "make_agent"]


def make_agent(settings: Settings, *, teacher: Teacher, world: World | None = None) -> AgentBackend:
    """The configured backend (`agent.backend`); `world` the tree's (sftree.world)."""
    backend = settings.agent.backend
    if backend == "native":
        from sftree.agents.native import NativeAgent

        return NativeAgent(teacher, settings.agent)
    if backend == "opencode":
        from sftree.agents.opencode import OpenCodeAgent

        return OpenCodeAgent(
            teacher, settings.agent, hard_token_limit=settings.search.hard_token_limit, world=world
        )
    raise InputError(f"agent.backend: unknown backend {backend!r} (native | opencode)")
