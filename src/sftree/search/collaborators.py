"""What the search needs of the things it is handed (TreeQuest-style: the consumer states the interface): Coral's
world, the grader of an edge, the store of the tree's commits. The agent backend that runs
a turn is agents/base.py's `AgentBackend` (with its `TurnOutcome`), all of which the search uses, and the Teacher's
client is agents/base.py's `Teacher` (one interface for the backends and the search). `search/edge.py`
and `search/explore.py` call these members and nothing else; the concrete classes (teacher/client.py, world/,
runtime/store.py) match them structurally, checked by mypy where `EdgeContext.create` builds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from sftree.agents.base import CoralSession
from sftree.jsontypes import JSONObject
from sftree.world.coral_command import RuntimeWorld

if TYPE_CHECKING:
    from sftree.runtime.folderreader import Quota
    from sftree.runtime.objects import ObjectDB
    from sftree.runtime.workspace import EdgeWorkspace, NodeState
    from sftree.world.counters import CoralCounters


class TurnPrompt(Protocol):
    @property
    def text(self) -> str: ...


class World(RuntimeWorld, Protocol):
    """Coral's texts, CLI and layout for the Teacher's sessions (world/world.py `World`), and what the edge's
    `coral` commands use of it (world/coral_command.py `RuntimeWorld`)."""

    @property
    def agent_id(self) -> str: ...  # the Student's agent the root snapshot belongs to
    @property
    def run_dir(self) -> str: ...  # where the sandbox shows the edge's Coral run directory
    @property
    def kind(self) -> str: ...  # coral | stand-in

    def describe(self) -> Mapping[str, object]: ...
    def instructions(self) -> str: ...
    def config_yaml(self) -> str: ...
    def start_prompt(self) -> str: ...
    def turn_prompt(self, counters: CoralCounters, record: JSONObject) -> TurnPrompt: ...
    def restart_prompt(self, counters: CoralCounters) -> str: ...
    def cli_command(self, argv: list[str], standin_script: str) -> list[str]: ...
    def sandbox_roots(self) -> tuple[str, ...]: ...
    def close(self) -> None: ...


class Grader(CoralSession, Protocol):
    """An edge's Coral runtime as the search reads it (world/coral_command.py `CoralRuntime`), and hands it to the
    backend with each turn (agents/base.py `CoralSession`)."""

    @property
    def counters(self) -> CoralCounters: ...  # the host's counters, advanced by each graded eval
    @property
    def grader_s(self) -> float: ...  # seconds spent grading

    def open_turn(self) -> None: ...


class Store(Protocol):
    """The tree's commits and edge folders (runtime/store.py `TreeStore`)."""

    @property
    def knowledge(self) -> ObjectDB: ...

    def fork(
        self,
        state: NodeState,
        edge_id: str,
        *,
        agent_id: str = ...,
        inside: str | None = ...,
        uid: int | None = ...,
        quota: Quota | None = ...,
    ) -> EdgeWorkspace: ...
    def diff(self, repo: str, a: str, b: str) -> str: ...
    def cleanup_stale(self, keep: set[str]) -> None: ...
    def close(self) -> None: ...
    def pack_loose(self) -> bool: ...
