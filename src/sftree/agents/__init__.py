"""Agent backends behind one interface (`AgentBackend.run_turn`), chosen by config `agent.backend`.

`native` (agents/native.py) is a Python loop with OpenCode's tool names and schemas. `opencode` (the real
OpenCode CLI behind a recording proxy, agents/opencode.py and docs/opencode.md) needs the opencode binary.
"""

from __future__ import annotations

from sftree.agents.base import AgentBackend, StepRecorder, ToolOutcome, TurnOutcome, TurnRun
from sftree.errors import InputError

__all__ = ["AgentBackend", "StepRecorder", "ToolOutcome", "TurnOutcome", "TurnRun", "make_agent"]


def make_agent(config: dict, *, teacher, task_cfg: dict | None = None, hidden=None) -> AgentBackend:
    """The configured backend. `config` is the whole validated config; `hidden` = extra paths the sandbox hides."""
    agent_cfg = dict(config.get("agent", {}))
    backend = agent_cfg.get("backend", "native")
    extra = list(hidden or [])
    if config.get("results"):
        from pathlib import Path

        extra.append(Path(config["results"]).resolve())  # relative to the job's cwd, as Snakemake runs it
    if backend == "native":
        from sftree.agents.native import NativeAgent

        return NativeAgent(teacher, agent_cfg, hidden=extra)
    if backend == "opencode":
        from sftree.agents.opencode import OpenCodeAgent

        return OpenCodeAgent(teacher, agent_cfg, search_cfg=config.get("search"), hidden=extra)
    raise InputError(f"agent.backend: unknown backend {backend!r} (native | opencode)")
