"""What the Teacher is shown of Coral, for one tree: rendered by the user's Coral (through the bridge) or, without
one, by sftree's stand-ins in the same formats. Built once per explore job; thread-safe; every method is a pure
function of its arguments and the tree's fixed context (task, agent id, number of agents, heartbeat actions).

    w = open_world(settings.coral, spec, run_dir=settings.agent.run_dir, agent_id="agent-1", agents=1, root_heartbeat=None)
    w.kind                       # "coral" | "stand-in" (tree.json, dataset card, report)
    w.instructions()             # AGENTS.md (CORAL.md for the agent)
    w.start_prompt()             # a fresh session's first prompt
    tp = w.turn_prompt(counters, record)      # after a graded eval: TurnPrompt(text, fired, counters after)
    w.restart_prompt(counters)   # after a turn with no graded eval, and the nudge
    w.eval_output(record, eval_count) / w.eval_output(None, error="nothing_to_commit")   # CommandOutput
    w.parse_eval(argv)           # EvalArgs or CommandOutput (Coral's refusal)
    w.opencode_json(); w.config_yaml(); w.student_model(configured)
    w.close()

Records passed in are the host's own (Attempt.to_dict fields); the agent-text rule (`text.safe_attempt`) is applied
here, before Coral's code formats them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from sftree.jsontypes import CoralDoc
from sftree.settings import CoralSettings
from sftree.world import standin
from sftree.world.counters import CoralCounters, advance
from sftree.world.locate import CoralInstall, locate
from sftree.world.task import TaskSpec
from sftree.world.text import safe_attempt

T = TypeVar("T")

log = logging.getLogger(__name__)
SHARED_DIR = ".opencode"  # Coral's OpenCode runtime
INSTRUCTION_FILE = "AGENTS.md"
DEFAULT_RUN_DIR = "/workspace/results/{task}"


@dataclass(frozen=True)
class CommandOutput:
    stdout: str
    stderr: str
    rc: int


@dataclass(frozen=True)
class EvalArgs:
    message: str
    tune: bool = False
    wait: bool = True
    timeout: float | None = None
    agent: str | None = None
    workdir: str | None = None


@dataclass(frozen=True)
class TurnPrompt:
    text: str
    fired: tuple[str, ...]  # heartbeat actions that fired (Coral would not interrupt the agent when empty)
    counters: CoralCounters  # the host's counters after the attempt


class World:
    def __init__(
        self,
        spec: TaskSpec,
        *,
        agent_id: str,
        agents: int = 1,
        install: CoralInstall | None = None,
        run_dir: str | None = None,
        root_heartbeat: CoralDoc | None = None,
    ):
        self.spec = spec
        self.agent_id = agent_id
        self.agents = max(1, int(agents))
        self.install = install
        self.kind = "coral" if install else "stand-in"
        self.run_dir = (run_dir or DEFAULT_RUN_DIR).format(task=spec.name)
        self._bridge = None
        if install:
            from sftree.world.bridge import CoralBridge

            self._bridge = CoralBridge(install)
        rh = root_heartbeat or {}
        self.actions = self._call(
            "heartbeat_actions",
            lambda: standin.heartbeat_actions(spec.coral, agent_id, rh.get("local"), rh.get("global")),
            local=rh.get("local"),
            **{"global": rh.get("global")},
        )

    # -- plumbing
    def _call(self, op: str, fallback: Callable[[], T], **req: object) -> T:
        """The bridge's answer to `op` (Coral's own code; in the shape the stand-in's `fallback` gives), or the
        stand-in's without an installed Coral."""
        if self._bridge is None:
            return fallback()
        base = {"task": self.spec.coral, "agents": self.agents, "agent_id": self.agent_id}
        answer: T = self._bridge.call(op, **{**base, **req})
        return answer

    @property
    def single_agent(self) -> bool:
        return self.agents == 1

    @property
    def coral_dir(self) -> str:
        return f"{self.run_dir}/.coral"

    @property
    def worktree(self) -> str:
        return f"{self.run_dir}/agents/{self.agent_id}"

    def describe(self) -> CoralDoc:
        """For tree.json, the dataset card and the report."""
        out = {"world": self.kind, "agent_id": self.agent_id, "agents": self.agents, "run_dir": self.run_dir}
        if self.install:
            out["coral"] = self.install.to_dict()
        return out

    # -- files of the workspace
    def instructions(self) -> str:
        return self._call(
            "coral_md",
            lambda: standin.coral_md(self.spec.coral, self.agent_id, self.single_agent, SHARED_DIR),
            single_agent=self.single_agent,
            shared_dir=SHARED_DIR,
        )

    def opencode_json(self, research: bool | None = None) -> str:
        research = (
            bool((self.spec.coral.get("agents") or {}).get("research", True))
            if research is None
            else research
        )
        return self._call(
            "opencode_json",
            lambda: standin.opencode_json(self.coral_dir, research),
            coral_dir=self.coral_dir,
            research=research,
        )

    def student_model(self, configured: str | None = None) -> str:
        """The Student's model as Coral's config names it ("provider/model"): `configured` (agent.student_model),
        else the task's `agents.model` when it is for Coral's opencode runtime, else what Coral fills in for that
        runtime (its registry). A model named for another runtime (claude_code's `claude-opus-4-6`) is not an
        OpenCode model id: the default stands in, with a warning."""
        if configured:
            return str(configured)
        agents = self.spec.coral.get("agents") or {}
        runtime = str(agents.get("runtime") or "opencode")
        if agents.get("model") and runtime == "opencode":
            return str(agents["model"])
        found = self._call("default_model", lambda: standin.DEFAULT_OPENCODE_MODEL, runtime="opencode")
        model = str(found or standin.DEFAULT_OPENCODE_MODEL)
        if agents.get("model"):
            log.warning(
                "task %s: agents.model %r is for Coral's %s runtime, not OpenCode; the Student's model id is %s "
                "(set agent.student_model to name it)", self.spec.name, agents["model"], runtime, model,
            )  # fmt: skip
        return model

    def config_yaml(self) -> str:
        return self._call("config_yaml", lambda: standin.config_yaml(self.spec.coral, self.agents))

    # -- prompts
    def start_prompt(self, resume: bool = False) -> str:
        return self._call("start_prompt", lambda: standin.start_prompt(resume), resume=resume)

    def turn_prompt(self, counters: CoralCounters, record: CoralDoc) -> TurnPrompt:
        """After the host graded `record` (this agent's finalized attempt): Coral's manager's interrupt prompt,
        from `counters` as they were before the attempt. The returned counters are the host's `advance`; the
        manager's own (from Coral's code in real mode) must agree, or a CoralError says where."""
        rec = safe_attempt({**record, "agent_id": self.agent_id})
        after = advance(counters, record, self.spec.direction)
        before = {
            "agent_evals": counters.agent_evals,
            "real_best": counters.real_best,
            "since_improvement": counters.since_improvement,
        }
        out = self._call(
            "turn_prompt",
            lambda: standin.turn_prompt(
                self.actions, self.agent_id, before, after.global_evals, rec, self.spec.direction, SHARED_DIR
            ),
            actions=self.actions,
            counters=before,
            global_evals=after.global_evals,
            attempt=rec,
        )
        mine = {
            "agent_evals": after.agent_evals,
            "real_best": after.real_best,
            "since_improvement": after.since_improvement,
        }
        if out["counters"] != mine:
            from sftree.world.bridge import CoralError

            raise CoralError(
                f"Coral's manager counted {out['counters']} after {record.get('commit_hash')}, sftree {mine}"
            )
        return TurnPrompt(out["prompt"] or "", tuple(out["fired"]), after)

    def restart_prompt(self, counters: CoralCounters) -> str:
        """The prompt Coral's manager restarts a stopped agent with (a turn that ended without a graded eval, the
        nudge): the agent's latest attempt and the global count, or, without an attempt, the runtime's resume."""
        rec = safe_attempt(counters.latest) if counters.latest else None
        text = self._call(
            "restart_prompt",
            lambda: standin.restart_prompt(rec, counters.global_evals),
            attempt=rec,
            global_evals=counters.global_evals,
        )
        return text if text else self.start_prompt(resume=True)

    # -- `coral eval` / `coral wait`
    def eval_output(
        self,
        record: CoralDoc | None,
        eval_count: int | None = None,
        *,
        error: str | None = None,
        wait: bool = False,
    ) -> CommandOutput:
        rec = safe_attempt(record) if record else None
        header = "CORAL Wait" if wait else "CORAL Eval"
        out = self._call(
            "eval_output",
            lambda: standin.eval_output(rec, eval_count, error, header),
            attempt=rec,
            eval_count=eval_count,
            error=error,
            header=header,
        )
        return CommandOutput(out["stdout"], out["stderr"], int(out["rc"]))

    def parse_eval(self, argv: list[str]) -> EvalArgs | CommandOutput:
        out = self._call("parse_eval", lambda: standin.parse_eval(list(argv)), argv=list(argv))
        if out.get("args") is None:
            return CommandOutput(out["stdout"], out["stderr"], int(out["rc"]) or 2)
        a = out["args"]
        return EvalArgs(
            message=a["message"],
            tune=bool(a.get("tune")),
            wait=a.get("wait", True) is not False,
            timeout=a.get("timeout"),
            agent=a.get("agent"),
            workdir=a.get("workdir"),
        )

    # -- the read-only `coral` commands inside the sandbox
    READ_ONLY = ("log", "show", "notes", "skills", "status")

    def sandbox_roots(self) -> tuple[str, ...]:
        """Folders a sandbox must show read-only for `cli_command` (Coral's interpreter and package)."""
        return self.install.roots if self.install else ()

    def cli_command(self, argv: list[str], standin_script: str) -> list[str]:
        """The command that answers a read-only `coral ...` inside the agent's sandbox, run in its worktree: the
        user's Coral CLI, or the stand-in CLI at `standin_script` (a copy of `standin_cli_source()` the runtime
        placed where the sandbox can read it; the project checkout is hidden there)."""
        if self.install:
            boot = (
                f"import sys; sys.path.insert(0, {self.install.root!r}); from coral.cli import main; main()"
            )
            return [self.install.python, "-I", "-B", "-c", boot, *argv]
        return [sys.executable, "-I", "-B", standin_script, *argv]

    def close(self) -> None:
        if self._bridge is not None:
            self._bridge.close()


def standin_cli_source() -> str:
    """The stand-in `coral` CLI (world/standin_cli.py: standard library only), for the runtime to place."""
    return (Path(__file__).with_name("standin_cli.py")).read_text(encoding="utf-8")


def open_world(
    coral: CoralSettings,
    spec: TaskSpec,
    *,
    run_dir: str | None,
    agent_id: str,
    agents: int = 1,
    root_heartbeat: CoralDoc | None = None,
) -> World:
    """The world of one tree from the config's `coral:` (locate) and `agent.run_dir`."""
    install = locate(coral)
    return World(
        spec,
        agent_id=agent_id,
        agents=agents,
        install=install,
        run_dir=run_dir,
        root_heartbeat=root_heartbeat,
    )


__all__ = ["CommandOutput", "EvalArgs", "TurnPrompt", "World", "open_world", "replace", "standin_cli_source"]
