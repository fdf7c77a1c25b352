"""Real OpenCode traffic kept as fixtures (tests/fixtures/real_opencode/): load a recorded edge's step records,
split them into the runs the host drove (a turn's prompt, each nudge), and replay them through the proxy's chain
check (agents/chain.py) exactly as the OpenCode backend drives it, honest or forged.

A fixture is a folder per recorded session: the edge's `steps.jsonl` and `messages.jsonl` (records/steplog.py's
encoding: each message stored once), gzipped, and `meta.json` (the model, template and settings it came from,
and for a child edge its parent's fixture). tests/fixtures/real_opencode/make_fixtures.py writes them from a tree.
"""

from __future__ import annotations

import copy
import gzip
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from sftree.agents.chain import Pristine, SessionChain, text_of
from sftree.records.steplog import STEPS_NAME, STORE_NAME, read_steps

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real_opencode"
MODEL_CALLS = ("agent", "nudge")


@dataclass
class Run:
    """One prompt to the session and the model calls it led to (agents/opencode.py `_one_run`)."""

    prompt: str | None  # the host's prompt the run's first request carries (a turn's, or a nudge)
    steps: list[dict]
    interrupted: (
        bool  # the host stopped it (eval, step limit, a cut call), rather than the session going idle
    )


def sessions() -> list[Path]:
    return sorted(p for p in FIXTURES.iterdir() if (p / "meta.json").exists()) if FIXTURES.exists() else []


def meta(folder: Path) -> dict:
    return json.loads((folder / "meta.json").read_text())


def load_steps(folder: Path, tmp: Path) -> list[dict]:
    """The fixture's step records, exactly as the tree wrote them."""
    out = tmp / folder.name
    out.mkdir(parents=True, exist_ok=True)
    for name in (STEPS_NAME, STORE_NAME):
        with gzip.open(folder / f"{name}.gz", "rb") as src, open(out / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return read_steps(out / STEPS_NAME)


def last_user_text(request: dict) -> str | None:
    msgs = request.get("messages") or []
    return text_of(msgs[-1].get("content")) if msgs and msgs[-1].get("role") == "user" else None


def interrupted(step: dict) -> bool:
    """How a run ended, from its last model call: a reply with calls (OpenCode would go on: the host stopped it),
    a cut or failed reply (the host ended the turn) - else the session went idle by itself."""
    resp = step.get("response")
    return resp is None or bool(resp.get("tool_calls")) or step.get("finish_reason") == "length"


def runs_of(steps: list[dict]) -> list[Run]:
    """The runs of an edge's model calls: a new run at each turn and at each nudge (OpenCode's own helper calls,
    title, summary, compaction, are outside the session)."""
    runs: list[Run] = []
    turn = None
    for s in steps:
        if s.get("kind") not in MODEL_CALLS:
            continue
        if not runs or s.get("turn") != turn or s.get("kind") == "nudge":  # the backend marks a nudge's first
            runs.append(Run(last_user_text(s["request"]), [], False))
        turn = s.get("turn")
        runs[-1].steps.append(s)
    for r in runs:
        r.interrupted = interrupted(r.steps[-1])
    return runs


def replay(runs: list[Run], pristine: Pristine, chain: SessionChain | None = None) -> SessionChain:
    """Drive the chain as the backend does: each run's prompt expected, each request checked, each reply given
    as the proxy received it, an interrupt at a run the host stopped. Raises ChainBreak where a request breaks it."""
    chain = chain or SessionChain(pristine)
    for run in runs:
        if run.prompt is not None:
            chain.expect_prompt(run.prompt)
        for s in run.steps:
            chain.check(s["request"])
            chain.answered(s["response"], bool(s.get("error")) or s.get("finish_reason") == "length")
        if run.interrupted:
            chain.interrupted()
    return chain


def with_request(runs: list[Run], index: int, request: dict) -> list[Run]:
    """The same runs with the index-th model call's request replaced (a forgery)."""
    out = copy.deepcopy(runs)
    k = 0
    for r in out:
        for i, _s in enumerate(r.steps):
            if k == index:
                r.steps[i] = {**r.steps[i], "request": request}
                return out
            k += 1
    raise IndexError(index)
