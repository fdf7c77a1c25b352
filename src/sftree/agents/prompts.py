"""The Teacher's prompts, from Coral's world (sftree.world): what Coral's manager and OpenCode runtime would send.

With a World (`sftree.world.world.World`, one per tree) and the host's counters (`CoralCounters`, kept with each
node):

    start_prompt(task_cfg, world=w)                        # a fresh session's first prompt (Coral's OpenCode runtime)
    write_agents_md(root, task_cfg, world=w)               # AGENTS.md = Coral's CORAL.md for the agent
    turn_prompt(w, counters, record)                       # after a graded eval -> TurnPrompt (text, fired, counters)
    failed_turn_prompt(w, counters)                        # after a turn without a graded eval (Coral's restart prompt)
    nudge_prompt()                                         # the model stopped without `coral eval` (sftree's reminder)

Coral's prose is rendered by the installed Coral (or sftree's stand-ins, `world/texts/`) and overridden as in Coral:
the task's task.yaml (`agents.heartbeat[].prompt`, ...) and the run's heartbeat files. The one template of sftree's
own is `system.md` (the native agent's system prompt, which carries AGENTS.md the way OpenCode's does), overridable
by `agent.prompts.system`.

The names the runtime calls today (`start_prompt`, `write_agents_md`, `next_turn_prompt`, `nudge_prompt`,
`turn_record`, `render`) keep working without a world or counters: they use the task's world (`world_for`, cached
per task) and, for the turn prompt, counters rebuilt from the host's record of the last turn. Pass `world=` and
`counters=` (the host's, carried by the node state) to get Coral's exact counts and the plateau heartbeat.
"""

from __future__ import annotations

import atexit
import os
import string
import threading
from pathlib import Path

from sftree.errors import InputError
from sftree.runtime import remove
from sftree.world.counters import CoralCounters
from sftree.world.task import load_task
from sftree.world.world import TurnPrompt, World

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "prompts"
NAMES = {"system": "system.md"}

_WORLDS: dict[tuple, World] = {}
_LOCK = threading.Lock()


def load_template(name: str, overrides: dict | None = None) -> str:
    path = (overrides or {}).get(name)
    p = Path(path) if path else TEMPLATE_DIR / NAMES[name]
    try:
        return p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"prompt template {name!r} ({p}) cannot be read: {exc}") from None


def render(name: str, overrides: dict | None = None, **values) -> str:
    return string.Template(load_template(name, overrides)).safe_substitute(
        {k: ("" if v is None else str(v)) for k, v in values.items()}
    )


def world_for(task_cfg: dict) -> World:
    """The task's world as `sftree.config.task_config` describes it (`coral`, `run_dir`, `agent_id`, `agents`),
    built once per task and process (a real Coral's bridge process is shared)."""
    from sftree.world.locate import locate

    coral = task_cfg.get("coral") or {}
    key = (
        task_cfg.get("name"),
        task_cfg.get("coral_task") or task_cfg.get("task_dir"),
        coral.get("mode"),
        coral.get("python"),
        task_cfg.get("agent_id"),
        task_cfg.get("agents"),
        task_cfg.get("run_dir"),
    )
    with _LOCK:
        w = _WORLDS.get(key)
        if w is None:
            spec = load_task(task_cfg, task_cfg.get("name", "task"))
            w = World(
                spec,
                agent_id=task_cfg.get("agent_id") or "agent-1",
                agents=int(task_cfg.get("agents") or 1),
                install=locate(coral),
                run_dir=task_cfg.get("run_dir"),
            )
            _WORLDS[key] = w
        return w


@atexit.register
def _close_worlds() -> None:
    with _LOCK:
        for w in _WORLDS.values():
            w.close()
        _WORLDS.clear()


def start_prompt(task_cfg: dict, overrides: dict | None = None, *, world: World | None = None) -> str:
    return (world or world_for(task_cfg)).start_prompt()


def write_agents_md(
    root: Path, task_cfg: dict, overrides: dict | None = None, *, world: World | None = None
) -> None:
    """Write AGENTS.md (Coral's CORAL.md for the agent) afresh: whatever is there (a symlink the agent left, a
    file) is replaced, never written through."""
    text = (world or world_for(task_cfg)).instructions()
    path = Path(root) / "AGENTS.md"
    remove.tree(path)  # a folder the agent made there, of any shape, or a link (never followed)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def turn_prompt(world: World, counters: CoralCounters, record: dict) -> TurnPrompt:
    """After the host graded `record` (Attempt.to_dict fields): the manager's header and the heartbeats that fire."""
    return world.turn_prompt(counters, record)


def failed_turn_prompt(world: World, counters: CoralCounters) -> str:
    """After a turn that ended without a graded eval (nothing to commit, step or time limit, no eval): what Coral's
    manager sends an agent it restarts (its latest attempt, or the runtime's resume prompt)."""
    return world.restart_prompt(counters)


def nudge_prompt(
    overrides: dict | None = None, *, world: World | None = None, counters: CoralCounters | None = None
) -> str:
    """The model stopped talking without `coral eval`, mid-turn: sftree's own short reminder (world/texts/nudge.md),
    the same in both worlds. Coral has no such message (it restarts a stopped agent with its restart prompt, which
    is what the next turn opens with: `failed_turn_prompt`); a reminder that differs from every turn's opening
    prompt keeps a nudge from reading as a new turn (teacher-sim tells them apart by it)."""
    from sftree.world import standin

    return standin.text("nudge").strip()


def turn_record(ev, ended: str) -> dict:
    """The host's own record of how a turn ended: its first `coral eval` (EvalResult or None) and why it ended.

    The next turn's prompt is built from this alone, never from text in the session: the agent's tools can
    print anything, including a fake eval block (docs/security.md)."""
    return {"eval": ev.to_dict() if ev is not None else None, "ended": ended}


def record_of(ev: dict, agent_id: str) -> dict:
    """An attempt record (Attempt.to_dict fields) from the host's EvalResult dict."""
    return {
        "commit_hash": ev.get("commit") or "",
        "agent_id": agent_id,
        "title": ev.get("message") or "",
        "score": ev.get("score"),
        "status": ev.get("status") or "crashed",
        "parent_hash": None,
        "timestamp": "",
        "feedback": ev.get("feedback") or "",
        **({"metadata": ev["metadata"]} if ev.get("metadata") else {}),
    }


def next_turn_prompt(
    last: dict | None,
    knowledge_dir: Path | None,
    task_cfg: dict,
    overrides: dict | None = None,
    *,
    world: World | None = None,
    counters: CoralCounters | None = None,
) -> str:
    """The prompt of the turn after a turn whose host record is `last` (`turn_record`). With `counters` (the host's
    counters before that turn's eval) it is Coral's exact prompt; without, the counters are rebuilt from `last`
    alone (the eval number as both counts, no plateau): what the runtime gets until it keeps counters per node.
    `knowledge_dir` is not read (files the agent can write never set a prompt)."""
    w = world or world_for(task_cfg)
    ev = (last or {}).get("eval") or None
    if ev is None or ev.get("number") is None:
        c = counters or CoralCounters(w.agent_id)
        return failed_turn_prompt(w, c)
    rec = record_of(ev, w.agent_id)
    if counters is None:
        n = max(0, int(ev["number"]) - 1)
        counters = CoralCounters(w.agent_id, global_evals=n, agent_evals=n)
    return turn_prompt(w, counters, rec).text
