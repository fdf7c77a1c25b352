"""What the tree takes from its root snapshot for Coral's world, read once when the tree starts (the Student's
snapshot, never a workspace): the agent whose run it is, the attempt history, the eval count, the number of agents
and the run's heartbeat files.

    rc = read_root_context(root_dir)     # RootContext
    rc.counters("maximize")              # CoralCounters at the root
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from sftree.errors import InputError
from sftree.world.counters import CoralCounters


@dataclass(frozen=True)
class RootContext:
    agent_id: str
    eval_count: int | None
    attempts: list[dict] = field(default_factory=list)
    agents: int = 1  # distinct agent ids in the attempt history (at least 1)
    heartbeat: dict = field(default_factory=dict)  # {"local": [...]|None, "global": [...]|None}

    def counters(self, direction: str) -> CoralCounters:
        return CoralCounters.from_root(
            self.attempts, agent_id=self.agent_id, eval_count=self.eval_count, direction=direction
        )


def _json(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path}: {what} cannot be read: {exc}") from None


def read_root_context(root_dir: str | Path, agent_id: str | None = None) -> RootContext:
    root_dir = Path(root_dir)
    meta = _json(root_dir / "metadata.json", "root metadata")
    if not isinstance(meta, dict):
        raise InputError(f"{root_dir / 'metadata.json'}: expected a JSON object")
    agent = agent_id or meta.get("agent_id")
    if not isinstance(agent, str) or not agent:
        raise InputError(f"{root_dir / 'metadata.json'}: no `agent_id` (the Student agent whose run this is)")
    attempts = []
    adir = root_dir / "shared" / "attempts"
    if adir.is_dir():
        for p in sorted(adir.glob("*.json")):
            if p.name.startswith("."):
                continue
            rec = _json(p, "attempt record")
            if not isinstance(rec, dict):
                raise InputError(f"{p}: an attempt record must be a JSON object")
            attempts.append(rec)
    hb = {}
    hdir = root_dir / "shared" / "heartbeat"
    for key, name in (("local", f"{agent}.json"), ("global", "_global.json")):
        p = hdir / name
        if p.is_file():
            data = _json(p, "heartbeat file")
            acts = data.get("actions") if isinstance(data, dict) else None
            if not isinstance(acts, list) or not all(
                isinstance(a, dict) and "name" in a and "every" in a for a in acts
            ):
                raise InputError(f'{p}: expected {{"actions": [{{"name", "every", ...}}]}}')
            hb[key] = acts
    ids = {a.get("agent_id") for a in attempts if a.get("agent_id")} | {agent}
    ec = meta.get("eval_count")
    return RootContext(
        agent_id=agent,
        eval_count=ec if isinstance(ec, int) else None,
        attempts=attempts,
        agents=len(ids),
        heartbeat=hb,
    )
