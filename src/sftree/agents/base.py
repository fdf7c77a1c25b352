"""The agent backend interface. Every backend records its model calls through the `StepRecorder` it is handed
(`sftree.records.steplog`, the one writer of step records: docs/architecture.md)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from sftree.records.steplog import StepRecorder
from sftree.records.tree import TurnEnd


@dataclass
class ToolOutcome:
    """One tool call's result as the model sees it, plus the two flags DESIGN.md defines."""

    content: str
    error: bool = (
        False  # the tool itself failed (bad args, unknown tool, missing file, no match, timeout, denied)
    )
    knowledge: bool = False  # read or wrote shared knowledge


@dataclass
class TurnRun:
    """Inputs of one rollout turn. `messages` is the session; the backend appends to it in place."""

    workspace: Any  # sftree.runtime.workspace.EdgeWorkspace
    box: Any  # sftree.runtime.edgebox.EdgeBox: where the edge's commands run
    coral: Any  # sftree.world.coral_command.CoralRuntime (its `evals` grows when the agent runs `coral eval`)
    messages: list[dict]
    prompt: str  # the user message that opens the turn
    turn: int
    headers: dict[str, str]
    recorder: StepRecorder
    agent_cfg: dict
    task_cfg: dict
    instructions: str = ""  # the instruction file the host wrote into the worktree (AGENTS.md)
    context_used: int = 0  # the session's context length so far (last step's usage; 0 = not known)
    final: bool = False  # the edge's last turn (search/edge.py plans the turns): the session ends after it


@dataclass
class TurnOutcome:
    ended: TurnEnd  # records.tree.TURN_ENDS (a backend ends a turn with edge_error when its session breaks)
    steps: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    knowledge: bool = False
    tokens: int = 0  # prompt + completion tokens of the turn's last step
    eval: Any = None  # sftree.world.coral_command.EvalResult of the turn's first `coral eval`, if any
    error: str | None = None
    compacted: bool = False  # the backend compacted the session: its real context was replaced (OpenCode)


class AgentBackend(ABC):
    """Runs one rollout turn in a workspace: model steps until the first `coral eval` or a limit."""

    name = "base"

    @abstractmethod
    def run_turn(self, run: TurnRun) -> TurnOutcome: ...

    def end_edge(self, edge_id: str) -> None:  # noqa: B027 - most backends hold nothing per edge
        """Release what the backend holds for one edge (a uid, a proxy key); called once the edge has ended,
        however it ended, so a failed edge gives its holdings back before the tree does."""

    needs_probe = False  # `prepare` wants a turn at the root the host starts itself, before any edge

    def prepare(self, run: TurnRun) -> None:  # noqa: B027 - only a backend with `needs_probe` overrides it
        """Learn what the backend's fresh session looks like (OpenCode: its pristine system prompt and tools,
        agents/chain.py) from a turn at the root that no Teacher acts in."""

    def close(self) -> None:  # noqa: B027 - most backends hold nothing; overriding is optional
        """Release what the backend holds for the whole tree (servers, sockets); called by EdgeContext.close."""
