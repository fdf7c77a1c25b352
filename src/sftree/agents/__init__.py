"""Agent backends behind one interface (`AgentBackend.run_turn`), chosen by config `agent.backend`.

`native` (agents/native.py) is a Python loop with OpenCode's tool names and schemas. `opencode` (the real
OpenCode CLI behind a recording proxy, agents/opencode.py and docs/opencode.md) needs the opencode binary.
"""

from __future__ import annotations

from sftree.agents.base import AgentBackend, ToolOutcome, TurnOutcome, TurnRun
from sftree.errors import InputError

__all__ = ["AgentBackend", "ToolOutcome", "TurnOutcome", "TurnRun", "make_agent"]


def make_agent(config: dict, *, teacher, task_cfg: dict | None = None, world=None) -> AgentBackend:
    """The configured backend. `config` is the whole validated config; `world` the tree's (sftree.world)."""
    agent_cfg = dict(config.get("agent", {}))
    backend = agent_cfg.get("backend", "native")
    if backend == "native":
        from sftree.agents.native import NativeAgent

        return NativeAgent(teacher, agent_cfg)
    if backend == "opencode":
        from sftree.agents.opencode import OpenCodeAgent

        return OpenCodeAgent(teacher, agent_cfg, search_cfg=config.get("search"), world=world)
    raise InputError(f"agent.backend: unknown backend {backend!r} (native | opencode)")
