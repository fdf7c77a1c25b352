"""Agent backends behind one interface (`AgentBackend.run_turn`), chosen by config `agent.backend`.

`native` (agents/native.py) is a Python loop with OpenCode's tool names and schemas. `opencode` (the real
OpenCode CLI behind a recording proxy, agents/opencode.py and docs/opencode.md) needs the opencode binary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sftree.agents.base import AgentBackend, Teacher, ToolOutcome, TurnOutcome, TurnRun
from sftree.errors import InputError
from sftree.jsontypes import Config, cfg_section

if TYPE_CHECKING:
    from sftree.world.world import World

__all__ = ["AgentBackend", "Teacher", "ToolOutcome", "TurnOutcome", "TurnRun", "make_agent"]


def make_agent(
    config: Config, *, teacher: Teacher, task_cfg: Config | None = None, world: World | None = None
) -> AgentBackend:
    """The configured backend. `config` is the whole validated config; `world` the tree's (sftree.world)."""
    agent_cfg = dict(cfg_section(config, "agent"))
    backend = agent_cfg.get("backend", "native")
    if backend == "native":
        from sftree.agents.native import NativeAgent

        return NativeAgent(teacher, agent_cfg)
    if backend == "opencode":
        from sftree.agents.opencode import OpenCodeAgent

        return OpenCodeAgent(teacher, agent_cfg, search_cfg=cfg_section(config, "search"), world=world)
    raise InputError(f"agent.backend: unknown backend {backend!r} (native | opencode)")
