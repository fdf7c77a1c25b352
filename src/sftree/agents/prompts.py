"""Prompt templates (src/sftree/prompts/*.md, overridable by config `agent.prompts`) and their rendering.

Templates use `${name}` placeholders (string.Template, so literal braces in task text are safe):
start.md (first turn of a fresh session: task, knowledge base, how to submit), turn.md (each later turn: Coral's
`## Eval #N Results` block plus heartbeat actions), turn_failed.md (a later turn after a turn with no graded
eval), nudge.md (the model stopped without `coral eval`), agents_md.md (AGENTS.md, the standing instructions),
system.md (the native agent's system prompt; like OpenCode, it carries the workspace's AGENTS.md).

Heartbeats follow Coral's defaults: reflect after every eval, consolidate every 10 evals, pivot after 5 evals
without improvement.
"""

from __future__ import annotations

import string
from pathlib import Path

from sftree.errors import InputError
from sftree.runtime.coral import evals_since_improvement, fmt_score, one_line, quoted_lines

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "prompts"
NAMES = {
    "start": "start.md",
    "turn": "turn.md",
    "turn_failed": "turn_failed.md",
    "nudge": "nudge.md",
    "agents_md": "agents_md.md",
    "system": "system.md",
}
CONSOLIDATE_EVERY = 10
PIVOT_AFTER = 5

HEARTBEAT_REFLECT = (
    "- Reflect: what did this eval teach you? Record the insight in a short note under `.opencode/notes/`."
)
HEARTBEAT_CONSOLIDATE = (
    "- Consolidate: this is eval #{n}. Review `.opencode/notes/` and merge what has proven "
    "useful into skills under `.opencode/skills/`."
)
HEARTBEAT_PIVOT = (
    "- Pivot: the last {k} evals did not improve on the best score. Step back and try a "
    "substantially different approach."
)


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


def direction_text(task_cfg: dict) -> str:
    return "lower is better" if task_cfg.get("direction") == "minimize" else "higher is better"


def task_text(task_cfg: dict) -> str:
    task_dir = task_cfg.get("task_dir")
    if task_dir and (Path(task_dir) / "task.md").is_file():
        return (Path(task_dir) / "task.md").read_text(encoding="utf-8").strip()
    return f"(no task.md found for task {task_cfg.get('name', '?')}; read the code to find out what it does)"


def start_prompt(task_cfg: dict, overrides: dict | None = None) -> str:
    return render(
        "start",
        overrides,
        task=task_text(task_cfg),
        task_name=task_cfg.get("name", "task"),
        direction_text=direction_text(task_cfg),
    ).strip()


def nudge_prompt(overrides: dict | None = None) -> str:
    return render("nudge", overrides).strip()


def agents_md(task_cfg: dict, overrides: dict | None = None) -> str:
    """The instruction file's text (the workspace writes it as AGENTS.md)."""
    return render(
        "agents_md",
        overrides,
        task_name=task_cfg.get("name", "task"),
        direction_text=direction_text(task_cfg),
    )


def heartbeat(eval_number: int | None, attempts: list[dict]) -> str:
    """`attempts`: the host's records of the branch's graded attempts (dicts with `status`), oldest first."""
    lines = [HEARTBEAT_REFLECT]
    if eval_number and eval_number % CONSOLIDATE_EVERY == 0:
        lines.append(HEARTBEAT_CONSOLIDATE.format(n=eval_number))
    k = evals_since_improvement(attempts)
    if k >= PIVOT_AFTER:
        lines.append(HEARTBEAT_PIVOT.format(k=k))
    return "\n".join(lines) + "\n"


def turn_record(ev, ended: str) -> dict:
    """The host's own record of how a turn ended: its first `coral eval` (EvalResult or None) and why it ended.

    The next turn's prompt is built from this alone, never from text in the session: the agent's tools can
    print anything, including a fake eval block (docs/security.md)."""
    return {"eval": ev.to_dict() if ev is not None else None, "ended": ended}


def next_turn_prompt(
    last: dict | None, attempts: list[dict], task_cfg: dict, overrides: dict | None = None
) -> str:
    """Coral's interrupt-style prompt for the turn that follows a turn whose host record is `last`; `attempts`:
    the host's records of the branch's graded attempts (never files the agent can write)."""
    ev = (last or {}).get("eval") or None
    if ev is None or ev.get("number") is None:
        reason = (
            "nothing to commit"
            if ev is not None and ev.get("status") == "nothing_to_commit"
            else "no eval was submitted"
        )
        return render(
            "turn_failed",
            overrides,
            reason=reason,
            heartbeat=heartbeat(None, attempts),
            direction_text=direction_text(task_cfg),
        ).strip()
    return render(
        "turn",
        overrides,
        eval_number=ev["number"],
        score=fmt_score(ev.get("score")),
        commit=ev.get("commit"),
        status=ev.get("status"),
        title=one_line(ev.get("message", "")),  # the agent's text never reads as a line of the host's
        feedback=quoted_lines(ev.get("feedback", "")),
        heartbeat=heartbeat(ev["number"], attempts),
        direction_text=direction_text(task_cfg),
    ).strip()
