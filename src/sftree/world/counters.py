"""The host's Coral counters for one branch of a tree: what Coral's grader daemon and manager keep, from the host's
own records only (never from files the agent can write).

    c = CoralCounters.from_root(root_attempts, agent_id="agent-1", eval_count=57, direction="maximize")
    status = c.status_for(score)                  # Coral's grader daemon: improved | baseline | regressed | crashed
    c2 = advance(c, finalized_record, "maximize") # after one graded eval (pure; c is unchanged)
    json.dumps(c2.to_dict()); CoralCounters.from_dict(d)   # stored with the node, carried by forks

What each field is in Coral (read at coral/grader/daemon.py `_compute_status`, coral/agent/manager.py `monitor_loop`,
coral/hub/attempts.py `increment_eval_count`):

- `global_evals`: `.coral/public/eval_count`, bumped by the daemon for every finalized attempt of any agent; the
  `#N` of `coral eval`'s block. At the root: the snapshot's `eval_count`.
- `agent_evals`: the manager's per-agent count of finalized attempts; the `N` of `## Eval #N Results`.
- `agent_best`: the daemon's status baseline: the best score of this agent's earlier attempts with a score, of any
  budget class (a tune attempt counts here).
- `real_best`, `since_improvement`: the manager's plateau state: best score of this agent's `real` attempts and the
  number of `real` attempts since it last improved (a `real` attempt without a score counts as not improving; tune
  and grader-error attempts leave both alone). The pivot heartbeat reads `since_improvement`.
- `latest`: this agent's newest attempt record (the manager's restart prompt quotes it).

Coral's manager counts from its own start; a Student run that was resumed restarted those counts. sftree counts
from the run's first attempt (the root snapshot's attempt records, read once when the tree starts, in timestamp
order), as one manager running the whole run would. Coral's manager also builds a fresh `HeartbeatRunner` for every
eval, so the pivot heartbeat's cooldown never carries over between evals: nothing of it needs to be kept here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from sftree.jsontypes import CoralDoc

REAL = "real"
BUDGET_CLASSES = ("real", "grader_error", "tune")


def budget_class(record: CoralDoc) -> str:
    """Coral's `get_budget_class`: the attempt's metadata `budget_class`, `real` when missing or unknown."""
    meta = record.get("metadata") or {}
    cls = meta.get("budget_class") if isinstance(meta, dict) else None
    return cls if cls in BUDGET_CLASSES else REAL


def _num(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x)


def better(a: float, b: float, direction: str) -> bool:
    return a < b if direction == "minimize" else a > b


def daemon_status(score: float | None, prev_best: float | None, direction: str) -> str:
    """Coral's grader daemon (`_compute_status`): no score -> crashed; no earlier scored attempt of the agent, or
    strictly better than its best -> improved; equal -> baseline; else regressed."""
    if score is None:
        return "crashed"
    if prev_best is None or better(score, prev_best, direction):
        return "improved"
    if score == prev_best:
        return "baseline"
    return "regressed"


@dataclass(frozen=True)
class CoralCounters:
    agent_id: str
    global_evals: int = 0
    agent_evals: int = 0
    agent_best: float | None = None
    real_best: float | None = None
    since_improvement: int = 0
    latest: CoralDoc | None = None

    def status_for(self, score: float | None, direction: str) -> str:
        return daemon_status(score, self.agent_best, direction)

    def to_dict(self) -> CoralDoc:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: CoralDoc) -> CoralCounters:
        keys = cls.__dataclass_fields__
        unknown = set(data) - set(keys)
        if unknown:
            raise ValueError(f"CoralCounters: unknown fields {sorted(unknown)}")
        return cls(**data)

    @classmethod
    def from_root(
        cls, attempts: list[CoralDoc], *, agent_id: str, eval_count: int | None, direction: str
    ) -> CoralCounters:
        """The counters at a root snapshot: its attempt records (any order; replayed by timestamp, pending ones
        skipped, as the manager skips them) and the snapshot's `eval_count` (None: the number of finalized
        records)."""
        done = [a for a in attempts if isinstance(a, dict) and a.get("status") != "pending"]
        done.sort(key=lambda a: str(a.get("timestamp") or ""))
        c = cls(agent_id=agent_id)
        for rec in done:
            if rec.get("agent_id") == agent_id:
                c = advance(c, rec, direction, count_global=False)
        total = len(done) if eval_count is None else int(eval_count)
        return replace(c, global_evals=total)


def advance(
    c: CoralCounters, record: CoralDoc, direction: str, *, count_global: bool = True
) -> CoralCounters:
    """The counters after one finalized attempt `record` of this agent (Attempt.to_dict fields): the daemon bumps
    the global count and its best; the manager bumps the agent's count and, for a `real` attempt, the plateau."""
    score = _num(record.get("score"))
    agent_best = c.agent_best
    if score is not None and (agent_best is None or better(score, agent_best, direction)):
        agent_best = score
    real_best, since = c.real_best, c.since_improvement
    if budget_class(record) == REAL:
        if score is not None and (real_best is None or better(score, real_best, direction)):
            real_best, since = score, 0
        else:
            since += 1
    return replace(
        c,
        global_evals=c.global_evals + (1 if count_global else 0),
        agent_evals=c.agent_evals + 1,
        agent_best=agent_best,
        real_best=real_best,
        since_improvement=since,
        latest=dict(record),
    )
