"""The agent backend interface. Every backend records its model calls through the `StepRecorder` it is handed
(`sftree.records.steplog`, the one writer of step records: docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sftree.jsontypes import JSONObject, JSONValue
from sftree.records.steplog import StepRecorder
from sftree.records.tree import TurnEnd

# At run time too: the records' readers resolve these dataclasses' field types (typing.get_type_hints).
from sftree.runtime.edgebox import EdgeBox
from sftree.runtime.workspace import EdgeWorkspace
from sftree.world.coral_command import EvalResult

if TYPE_CHECKING:
    from sftree.teacher.client import Completion
    from sftree.teacher.params import RequestParams
    from sftree.teacher.transport import Policy


@dataclass
class ToolOutcome:
    """One tool call's result as the model sees it, plus the two flags DESIGN.md defines."""

    content: str
    error: bool = (
        False  # the tool itself failed (bad args, unknown tool, missing file, no match, timeout, denied)
    )
    knowledge: bool = False  # read or wrote shared knowledge


class CoralWorld(Protocol):
    """Coral's world as a backend asks it (world/world.py `World`)."""

    def opencode_json(self) -> str: ...  # the worktree's `.opencode/opencode.json`, as Coral writes it


class CoralSession(Protocol):
    """What a backend uses of the edge's Coral runtime (world/coral_command.py `CoralRuntime`)."""

    # every `coral eval` of the edge, in order (the agent's `coral eval` adds one)
    @property
    def evals(self) -> Sequence[EvalResult]: ...
    @property
    def world(self) -> CoralWorld: ...


@dataclass
class TurnRun:
    """Inputs of one rollout turn. `messages` is the session; the backend appends to it in place."""

    workspace: EdgeWorkspace
    box: EdgeBox  # where the edge's commands run
    coral: CoralSession  # its `evals` grows when the agent runs `coral eval`
    messages: list[JSONObject]
    prompt: str  # the user message that opens the turn
    turn: int
    headers: dict[str, str]
    recorder: StepRecorder
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
    eval: EvalResult | None = None  # the turn's first `coral eval`, if any
    error: str | None = None
    compacted: bool = False  # the backend compacted the session: its real context was replaced (OpenCode)


class Teacher(Protocol):
    """What the backends use of the Teacher's client (sftree.teacher.client.TeacherClient): the native agent
    chats through it; the OpenCode backend's proxy sends on with its URL, key, policy and request settings."""

    @property
    def base_url(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def temperature(self) -> float | None: ...
    @property
    def context_tokens(self) -> int | None: ...
    @property
    def extra_body(self) -> Mapping[str, JSONValue]: ...
    @property
    def tool_choice(self) -> str | None: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def params(self) -> RequestParams: ...

    def chat(
        self,
        messages: list[JSONObject],
        tools: list[JSONObject] | None = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> Completion: ...


class AgentBackend(Protocol):
    """Runs one rollout turn in a workspace: model steps until the first `coral eval` or a limit. The native and
    OpenCode backends (agents/native.py, agents/opencode.py) are both this, and callers use nothing else."""

    @property
    def name(self) -> str: ...  # tree.json `backend`
    @property
    def sandbox(self) -> str: ...  # bwrap | none (runtime/sandbox.py `resolve_mode`): tree.json `sandbox`
    @property
    def student_model(self) -> str | None: ...  # the id OpenCode built its prompt and tools for; None: native
    @property
    def needs_probe(self) -> bool: ...  # `prepare` wants a turn at the root the host starts, before any edge

    def run_turn(self, run: TurnRun) -> TurnOutcome: ...

    def prepare(self, run: TurnRun) -> None:
        """Learn what the backend's fresh session looks like (OpenCode: its pristine system prompt and tools,
        agents/chain.py) from a turn at the root that no Teacher acts in; only called when `needs_probe`."""

    def end_edge(self, edge_id: str) -> None:
        """Release what the backend holds for one edge (a uid, a proxy key); called once the edge has ended,
        however it ended, so a failed edge gives its holdings back before the tree does."""

    def close(self) -> None:
        """Release what the backend holds for the whole tree (servers, sockets); called by EdgeContext.close."""
