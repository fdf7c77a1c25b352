"""sftree's stand-ins for Coral's texts, used when no Coral is installed (a fresh machine, the demo): the same
operations as the bridge (`bridge_main.py`), in Coral's formats, with the project's own short texts
(`texts/*.md`). Coral's formats are kept where a program or a model could rely on them: the manager's eval header
(`## Eval #N Results`, a blank line, `Score:` with 10 decimals or `FAILED`, `Commit:` 12 hex, `What you did:`,
optional `Budget:` and `Feedback:`), prompts joined by a blank line, the ruled `coral eval` block, exit codes,
and the heartbeat schedule of Coral's defaults (reflect every eval; consolidate and lint_wiki every 10 global
evals; pivot after 5 real evals without improvement), overridable in the task's task.yaml as in Coral
(`agents.heartbeat: [{name, every, global, trigger, prompt}]`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

import yaml

from sftree.jsontypes import CoralDoc

TEXTS = Path(__file__).with_name("texts")
RULE = "=" * 50
DEFAULT_OPENCODE_MODEL = "openai/gpt-5"  # the model Coral's config fills in for its opencode runtime
DEFAULT_ACTIONS = [  # Coral's defaults (coral/config.py): name, every, global, trigger
    ("reflect", 1, False, "interval"),
    ("consolidate", 10, True, "interval"),
    ("pivot", 5, False, "plateau"),
    ("lint_wiki", 10, True, "interval"),
]
DEFAULT_GLOBAL = {n: g for n, _e, g, _t in DEFAULT_ACTIONS}
DEFAULT_TRIGGER = {n: t for n, _e, _g, t in DEFAULT_ACTIONS}


def text(name: str) -> str:
    return (TEXTS / f"{name}.md").read_text(encoding="utf-8")


def _agents(task: CoralDoc) -> CoralDoc:
    return dict(task.get("agents") or {})


def config_yaml(task: CoralDoc, agents: int | None = None) -> str:
    data = json.loads(json.dumps(task))
    ag = _agents(data)
    ag["runtime"] = "opencode"
    if agents is not None:
        ag["count"] = int(agents)
        ag.pop("assignments", None)
    data["agents"] = ag
    return yaml.safe_dump(data, default_flow_style=False, sort_keys=False)


def coral_md(task: CoralDoc, agent_id: str, single_agent: bool, shared_dir: str = ".opencode") -> str:
    t = task.get("task") or {}
    tips = t.get("tips") or ""
    minimize = (task.get("grader") or {}).get("direction") == "minimize"
    team = (
        ""
        if single_agent
        else f"\nOther agents work on the same task; `{shared_dir}/` (notes, skills, attempts) is shared with them."
    )
    return text("coral_md").format(
        task_name=t.get("name", ""),
        task_description=t.get("description", ""),
        tips_section=f"\n## Tips\n{tips}\n" if tips else "",
        score_direction="lower is better" if minimize else "higher is better",
        agent_id=agent_id,
        shared_dir=shared_dir,
        team=team,
    )


def start_prompt(resume: bool = False) -> str:
    return text("resume" if resume else "start").strip()


def opencode_json(coral_dir: str, research: bool = True) -> str:
    """Permissions in the shape Coral gives OpenCode: everything allowed, Coral's private folder denied."""
    private = str(Path(coral_dir) / "private") + "/**"
    public = str(Path(coral_dir) / "public") + "/**"
    web = "allow" if research else "deny"
    settings = {
        "$schema": "https://opencode.ai/config.json",
        "permission": {
            "*": "allow",
            "external_directory": {public: "allow"},
            **{k: {private: "deny"} for k in ("read", "bash", "edit", "write")},
            "question": "deny",
            "doom_loop": "allow",
            "webfetch": web,
            "websearch": web,
        },
    }
    return json.dumps(settings, indent=2) + "\n"


def _action(name: str, every: int, is_global: bool, trigger: str, prompt: str = "") -> CoralDoc:
    return {"name": name, "every": every, "global": is_global, "trigger": trigger, "prompt": prompt}


def heartbeat_actions(
    task: CoralDoc,
    agent_id: str,
    local: Iterable[CoralDoc] | None = None,
    global_: Iterable[CoralDoc] | None = None,
) -> CoralDoc:
    """The local and global actions: given ones (a run's heartbeat files), else the task's `agents.heartbeat`
    merged with the defaults as Coral merges them; reflect (local) and consolidate (global) always present."""
    if local is None or global_ is None:
        raw = _agents(task).get("heartbeat")
        if raw is None:
            items = [_action(*d) for d in DEFAULT_ACTIONS]
        else:
            items = [dict(h) for h in raw]
            named = {h.get("name") for h in items}
            items += [_action(*d) for d in DEFAULT_ACTIONS if d[0] not in named]
        norm = []
        for h in items:
            g = bool(h.get("global", False)) or DEFAULT_GLOBAL.get(h["name"], False)
            trig = h.get("trigger") or DEFAULT_TRIGGER.get(h["name"], "interval")
            norm.append(
                {
                    "name": h["name"],
                    "every": int(h["every"]),
                    "prompt": h.get("prompt") or "",
                    "trigger": trig,
                    "g": g,
                }
            )
        if local is None:
            local = [{k: v for k, v in h.items() if k != "g"} for h in norm if not h["g"]]
        if global_ is None:
            global_ = [{k: v for k, v in h.items() if k != "g"} for h in norm if h["g"]]
    local, global_ = list(local), list(global_)
    if "reflect" not in {a["name"] for a in local}:
        local.append({"name": "reflect", "every": 1, "prompt": ""})
    if "consolidate" not in {a["name"] for a in global_}:
        global_.append({"name": "consolidate", "every": 10, "prompt": ""})
    return {"local": local, "global": global_}


def _fires(action: CoralDoc, is_global: bool, local_n: int, global_n: int, since: int) -> bool:
    trigger = action.get("trigger") or DEFAULT_TRIGGER.get(action["name"], "interval")
    every = int(action["every"])
    if trigger == "plateau":
        return since >= every  # Coral's manager builds a fresh runner per eval: no cooldown carries over
    count = global_n if is_global else local_n
    return count > 0 and count % every == 0


def _prompt_of(action: CoralDoc, shared_dir: str, agent_id: str) -> str:
    tpl = action.get("prompt") or (text(action["name"]) if (TEXTS / f"{action['name']}.md").is_file() else "")
    return tpl.format(shared_dir=shared_dir, agent_id=agent_id).strip() if tpl else ""


def fmt_score(score: float | None) -> str:
    return f"{score:.10f}" if score is not None else "FAILED"


def budget_class(meta: object) -> str:
    cls = (meta or {}).get("budget_class") if isinstance(meta, dict) else None
    return cls if cls in ("real", "grader_error", "tune") else "real"


def eval_header(attempt: CoralDoc, agent_eval_count: int) -> str:
    lines = [
        f"## Eval #{agent_eval_count} Results",
        "",
        f"Score: {fmt_score(attempt.get('score'))}",
        f"Commit: {str(attempt.get('commit_hash', 'unknown'))[:12]}",
        f"What you did: {attempt.get('title', '')}",
    ]
    cls = budget_class(attempt.get("metadata"))
    if cls != "real":
        lines.append(f"Budget: {cls} ({text('budget').strip()})")
    if attempt.get("feedback"):
        lines.append(f"Feedback: {attempt['feedback']}")
    lines.append("")
    return "\n".join(lines)


def turn_prompt(
    actions: CoralDoc,
    agent_id: str,
    counters: CoralDoc,
    global_evals: int,
    attempt: CoralDoc,
    direction: str,
    shared_dir: str = ".opencode",
) -> CoralDoc:
    """The header and the heartbeat prompts that fire after `attempt`, with the manager's counters after it."""
    from sftree.world.counters import better

    n = int(counters["agent_evals"]) + 1
    best, since = counters.get("real_best"), int(counters["since_improvement"])
    score = attempt.get("score")
    if budget_class(attempt.get("metadata")) == "real":
        if score is not None and (best is None or better(score, best, direction)):
            best, since = score, 0
        else:
            since += 1
    fired = [
        a
        for is_global, group in ((False, actions["local"]), (True, actions["global"]))
        for a in group
        if _fires(a, is_global, n, int(global_evals), since)
    ]
    parts = [eval_header(attempt, n)] + [p for p in (_prompt_of(a, shared_dir, agent_id) for a in fired) if p]
    return {
        "prompt": "\n\n".join(parts),
        "fired": [a["name"] for a in fired],
        "counters": {"agent_evals": n, "real_best": best, "since_improvement": since},
    }


def restart_prompt(attempt: CoralDoc | None, global_evals: int) -> str | None:
    if not attempt:
        return None
    lines = [
        f"Eval #{global_evals}: score={fmt_score(attempt.get('score'))} (commit {str(attempt.get('commit_hash', 'unknown'))[:12]})",
        f"What you did: {attempt.get('title', '')}",
    ]
    if attempt.get("feedback"):
        lines.append(f"Feedback: {attempt['feedback']}")
    return "\n".join([*lines, "", text("restart").strip()])


NOTHING_TO_COMMIT = "Nothing to commit: no change since the last eval."


def eval_output(
    attempt: CoralDoc | None, eval_count: int | None, error: str | None = None, header: str = "CORAL Eval"
) -> CoralDoc:
    """`coral eval`'s output in Coral's format: the ruled block on stdout and exit 0 (a null score too), or
    `Error: ...` on stderr and exit 1."""
    if error:
        msg = NOTHING_TO_COMMIT if error == "nothing_to_commit" else error
        return {"stdout": "", "stderr": f"Error: {msg}\n", "rc": 1}
    if attempt is None:
        raise ValueError("eval_output: neither an attempt record nor an error")
    status = attempt.get("status", "")
    score = "PENDING" if status == "pending" else fmt_score(attempt.get("score"))
    count = f" (#{eval_count})" if eval_count else ""
    cls = budget_class(attempt.get("metadata"))
    status_line = status if cls == "real" else f"{status}  (budget: {cls})"
    lines = [
        "",
        RULE,
        f"{header}{count}: {score}",
        f"Commit:  {str(attempt['commit_hash'])[:12]}",
        f"Status:  {status_line}",
    ]
    if attempt.get("feedback"):
        lines.append(f"Feedback: {attempt['feedback']}")
    if status == "pending":
        lines.append(f"Pending: `coral wait {str(attempt['commit_hash'])[:12]}` waits for the result.")
    lines += [RULE, ""]
    return {"stdout": "\n".join(lines) + "\n", "stderr": "", "rc": 0}


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Refused(message)


def eval_parser() -> argparse.ArgumentParser:
    """`coral eval`'s flags as Coral's CLI has them."""
    p = _Parser(prog="coral eval", add_help=False)
    p.add_argument("-m", "--message", required=True)
    p.add_argument("--agent")
    p.add_argument("--workdir")
    p.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--tune", action="store_true", default=False)
    return p


def parse_eval(argv: list[str]) -> CoralDoc:
    p = eval_parser()
    try:
        args = p.parse_args(argv)
    except _Refused as exc:
        return {"stdout": "", "stderr": f"\nerror: {exc}\n\n{p.format_usage()}", "rc": 2, "args": None}
    return {"stdout": "", "stderr": "", "rc": 0, "args": vars(args)}


def nudge_prompt() -> str:
    """The model stopped talking without `coral eval`, mid-turn: sftree's own short reminder (world/texts/nudge.md),
    the same in both worlds. Coral has no such message (it restarts a stopped agent with its restart prompt, which
    is what the next turn opens with: `World.restart_prompt`); a reminder that differs from every turn's opening
    prompt keeps a nudge from reading as a new turn (teacher-sim tells them apart by it)."""
    return text("nudge").strip()
