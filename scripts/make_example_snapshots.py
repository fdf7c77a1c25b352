#!/usr/bin/env python3
"""Simulate a Student Coral run on the bundled example tasks and write its snapshots.

    python3 scripts/make_example_snapshots.py --out DIR [--seed 0] [--tasks circle_packing,tsp] [--count 96]

For each task, 4 agents hill-climb the numeric constants of `examples/<task>/seed/solution.py` in rounds (the
agents of one round work at the same time and only see each other's results afterwards, as in Coral). Every
candidate is graded by the task's REAL grader (the TaskGrader of `examples/<task>/eval/grader.py`, confined by
`sftree.world.grading` with sftree's stand-in Coral, in a small pool, identical code graded once). Some candidates are broken on purpose (a syntax error, a runtime error, or
code that kills the grader process: the "grader crash"), some step out of the valid range (e.g. RADIUS_SCALE > 1
overlaps circles), and a few snapshots stay pending (no `eval_ok`). Output per task:

    DIR/<task>/eval-<NNNNNN>-agent-<k>-<12 hex>/{code/solution.py, shared/, metadata.json}

`shared/` is the public knowledge as it stood at that eval: `attempts/<40-hex commit>.json` (Coral's
Attempt.to_dict), `notes/*.md`, `skills/<name>/SKILL.md`, `roles/`, `logs/`. Each task folder is built in a
temporary folder and renamed into place; a task folder whose stamp matches this version, seed and count is kept.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

VERSION = 4  # bump when the output changes, so stale stamped folders are rebuilt
REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
AGENTS = 4
START_TIME = datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Param:
    name: str
    kind: type  # int or float
    lo: float  # the walk stays inside [lo, hi]; lo/hi may include invalid values on purpose
    hi: float
    step: float


@dataclass(frozen=True)
class TaskSpec:
    direction: str
    params: tuple[Param, ...]
    crash_line: str = "import os; os._exit(3)  # kills the graded process: a crashed eval"


SPECS = {
    "circle_packing": TaskSpec(
        direction="maximize",
        params=(
            Param("ROWS", int, 3, 7, 1),
            Param("MARGIN", float, 0.05, 0.16, 0.01),
            Param("STAGGER", float, 0.0, 1.0, 0.1),
            Param("ROW_SPREAD", float, 0.85, 1.15, 0.05),
            Param("GROW_PASSES", int, 0, 6, 1),
            Param("RADIUS_SCALE", float, 0.9, 1.02, 0.01),  # > 1.0 overlaps: an invalid packing
        ),
    ),
    "tsp": TaskSpec(
        direction="minimize",
        params=(
            Param("NUM_STARTS", int, 1, 12, 1),
            Param("NEIGHBORS", int, 2, 16, 1),
            Param("TWO_OPT_ROUNDS", int, 0, 20, 1),
            Param("MIN_GAIN", float, 0.0, 0.2, 0.02),
        ),
    ),
}

SKILLS = {
    "constant-sweep": "Sweep one numeric constant at a time around its current value, keep the best, then move to "
    "the next constant. Record each sweep in notes so other agents do not repeat it.",
    "validate-before-eval": "Run `python3 -c 'import solution'` before `coral eval`: a syntax error or a crash at "
    "import costs an eval and gives no score.",
    "read-the-leaderboard": "Start each session with `coral log` and build on the best attempt, not on your own "
    "last commit, unless you are testing a different idea on purpose.",
}


@dataclass
class Event:
    """One eval of the simulated run, in global order."""

    index: int
    agent: int
    eval_count: int
    values: dict
    code: str
    title: str
    parent_hash: str
    commit_hash: str = ""
    score: float | None = None
    feedback: str = ""
    status: str = "pending"
    eval_ok: bool | None = None
    timestamp: str = ""
    notes: dict = field(default_factory=dict)  # relative path -> text written after this eval
    skill: str | None = None


# --- code -------------------------------------------------------------------------------------------------


def read_constants(template: str, spec: TaskSpec) -> dict:
    """The starting values of the tunable constants, as written in the task's solution.py."""
    values = {}
    for p in spec.params:
        m = re.search(rf"^{p.name} = (.+?)\s*(#.*)?$", template, flags=re.M)
        if not m:
            raise SystemExit(f"constant {p.name} not found in the solution template")
        values[p.name] = p.kind(ast.literal_eval(m.group(1)))
    return values


def render_code(template: str, values: dict) -> str:
    """Replace `NAME = value` lines of the template with the given constants."""
    out = template
    for name, value in values.items():
        text = repr(round(value, 6)) if isinstance(value, float) else repr(value)
        out, n = re.subn(rf"^{name} = .*$", f"{name} = {text}", out, count=1, flags=re.M)
        if n != 1:
            raise SystemExit(f"constant {name} not found in the solution template")
    return out


def break_code(code: str, kind: str, spec: TaskSpec) -> str:
    if kind == "syntax":
        return code.replace("\ndef ", "\ndef broken(:\n    pass\n\n\ndef ", 1)
    if kind == "runtime":
        return (
            code
            + "\n\n"
            + (
                "def pack():\n    return [(0.5, 0.5, radius)]  # NameError: unfinished edit\n"
                if "def pack" in code
                else "def solve(points):\n    return list(range(len(points) - 1))  # drops the last city\n"
            )
        )
    if kind == "crash":
        return code + "\n\n" + spec.crash_line + "\n"
    raise ValueError(kind)


# --- grading ----------------------------------------------------------------------------------------------


class Grader:
    """Runs the task's real grader on code text, in a pool; identical code is graded once."""

    def __init__(self, task: str, workers: int):
        from sftree.world.task import load_coral_task

        self.task = task
        self.spec = load_coral_task(EXAMPLES / task, task)
        self.cache: dict[str, tuple[float | None, str, str]] = {}
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.calls = 0

    def grade_many(self, codes: list[str]) -> list[tuple[float | None, str, str]]:
        keys = [hashlib.sha256(c.encode()).hexdigest() for c in codes]
        todo = {k: c for k, c in zip(keys, codes, strict=True) if k not in self.cache}
        for k, result in zip(todo, self.pool.map(self._grade, todo.values()), strict=True):
            self.cache[k] = result
        return [self.cache[k] for k in keys]

    def _grade(self, code: str) -> tuple[float | None, str, str]:
        """(score, feedback, status) from one confined grading of the code in a scratch folder."""
        from sftree.world.grading import grade

        self.calls += 1
        commit = hashlib.sha1(code.encode()).hexdigest()
        with tempfile.TemporaryDirectory(prefix="sftree-grade-") as tmp:
            code_dir = Path(tmp) / "code"
            code_dir.mkdir()
            (code_dir / "solution.py").write_text(code)
            r = grade(
                self.spec,
                code_dir,
                commit=commit,
                install=None,
                sandbox=os.environ.get("SFTREE_SANDBOX") or "auto",
            )
        # Keep the output reproducible: the checkout's path holds the scratch folder or the commit.
        feedback = re.sub(r"/\S*/grader_checkouts/[0-9a-f]{40}", "code", r.feedback).replace(tmp, ".")
        status = {"scored": "graded"}.get(r.status, r.status)
        return r.score, feedback, status


# --- the simulated run ------------------------------------------------------------------------------------


def mutate(rng: random.Random, spec: TaskSpec, values: dict) -> tuple[dict, str]:
    """Move one or two constants by a step or two; return the new values and a commit title."""
    new = dict(values)
    changed = []
    for p in rng.sample(spec.params, 2 if rng.random() < 0.25 else 1):
        delta = p.step * rng.choice([-2, -1, -1, 1, 1, 2])
        v = min(p.hi, max(p.lo, values[p.name] + delta))
        v = int(round(v)) if p.kind is int else round(v, 6)
        if v != values[p.name]:
            new[p.name] = v
            changed.append(f"{p.name} {values[p.name]} -> {v}")
    return new, ("Tune " + ", ".join(changed)) if changed else "Re-run current constants"


def better(a: float | None, b: float | None, direction: str) -> bool:
    if a is None:
        return False
    if b is None:
        return True
    return a > b if direction == "maximize" else a < b


def simulate(task: str, seed: int, count: int, grader: Grader) -> list[Event]:
    spec = SPECS[task]
    rng = random.Random(f"{task}:{seed}")
    template = (EXAMPLES / task / "seed" / "solution.py").read_text()
    start = read_constants(template, spec)
    base_hash = hashlib.sha1(f"{task}:baseline:{template}".encode()).hexdigest()
    # Per agent: current best (values, score, commit); eval counts; global best.
    own = {k: (dict(start), None, base_hash) for k in range(1, AGENTS + 1)}
    counts = dict.fromkeys(own, 0)
    best_seen: dict[int, float | None] = dict.fromkeys(own, None)
    leader: tuple[dict, float | None, str] = (dict(start), None, base_hash)
    events: list[Event] = []
    # A few evals whose grading never wrote back (pending): one in the middle, the last round's tail.
    mid_pending = rng.randrange(count // 3, 2 * count // 3)
    crash_at = rng.randrange(count // 5, count // 2)  # at least one grader crash per run
    if crash_at == mid_pending:
        crash_at -= 1
    clock = START_TIME
    while len(events) < count:
        order = rng.sample(range(1, AGENTS + 1), AGENTS)[: count - len(events)]
        batch = []
        for agent in order:
            counts[agent] += 1
            base_values, _, parent = leader if rng.random() < 0.35 else own[agent]
            if counts[agent] == 1:
                values, title = dict(base_values), "Baseline: evaluate the starting code"
            else:
                values, title = mutate(rng, spec, base_values)
            code = render_code(template, values)
            index = len(events) + len(batch) + 1
            r = rng.random()
            if index == crash_at or r < 0.015:
                code, title = break_code(code, "crash", spec), title + " (debug hook left in)"
            elif r < 0.045:
                code, title = (
                    break_code(code, rng.choice(["syntax", "runtime"]), spec),
                    title + " (half-finished edit)",
                )
            commit = hashlib.sha1(f"{task}\n{agent}\n{parent}\n{index}\n{code}".encode()).hexdigest()
            batch.append(Event(index, agent, counts[agent], values, code, title, parent, commit))
        pending = {e.index for e in batch if e.index == mid_pending or e.index > count - 2}
        results = grader.grade_many([e.code for e in batch if e.index not in pending])
        graded = iter(results)
        for e in batch:
            clock += timedelta(seconds=rng.randint(40, 240))
            e.timestamp = clock.isoformat().replace("+00:00", "Z")
            if e.index in pending:
                e.status, e.feedback = "pending", ""
                events.append(e)
                continue
            e.score, e.feedback, outcome = next(graded)
            e.eval_ok = e.score is not None
            if outcome == "timeout":
                e.status = "timeout"
            elif e.score is None:
                e.status = "crashed"
            elif e.eval_count == 1 or best_seen[e.agent] is None:
                e.status = "baseline"
            else:
                e.status = "improved" if better(e.score, best_seen[e.agent], spec.direction) else "regressed"
            if e.score is not None and better(e.score, best_seen[e.agent], spec.direction):
                best_seen[e.agent] = e.score
                own[e.agent] = (e.values, e.score, e.commit_hash)
                if better(e.score, leader[1], spec.direction):
                    leader = (e.values, e.score, e.commit_hash)
            add_knowledge(rng, e, events, count, spec)
            events.append(e)
    return events


def add_knowledge(rng: random.Random, e: Event, events: list[Event], count: int, spec: TaskSpec) -> None:
    """Notes after improvements and failures, a consolidated summary every 10 evals, skills at milestones."""
    agent = f"agent-{e.agent}"
    shown = "FAILED" if e.score is None else f"{e.score:.6f}"
    if e.status in ("improved", "crashed") or rng.random() < 0.2:
        e.notes[f"notes/{agent}-{e.eval_count:03d}.md"] = (
            f"# {agent}, eval {e.eval_count}: {e.title}\n\nScore: {shown} ({e.status}).\n\n"
            f"Constants: {json.dumps(e.values, sort_keys=True)}\n\n{e.feedback.splitlines()[0] if e.feedback else ''}\n"
        )
    if e.index % 10 == 0:
        scored = [x for x in events + [e] if x.score is not None]
        top = sorted(scored, key=lambda x: x.score, reverse=spec.direction == "maximize")[:3]
        lines = [f"- {x.score:.6f} by agent-{x.agent} ({x.commit_hash[:12]}): {x.title}" for x in top]
        e.notes["notes/summary.md"] = (
            f"# Summary after {e.index} evals\n\nBest so far:\n" + "\n".join(lines) + "\n"
        )
    if e.status == "crashed" and not any(x.skill == "validate-before-eval" for x in events):
        e.skill = "validate-before-eval"
    elif e.index == count // 3:
        e.skill = "constant-sweep"
    elif e.index == 2 * count // 3:
        e.skill = "read-the-leaderboard"


# --- writing ----------------------------------------------------------------------------------------------


def attempt_record(e: Event) -> dict:
    return {
        "commit_hash": e.commit_hash,
        "agent_id": f"agent-{e.agent}",
        "title": e.title,
        "score": e.score,
        "status": e.status,
        "parent_hash": e.parent_hash,
        "timestamp": e.timestamp,
        "feedback": e.feedback,
    }


def tree_hash(root: Path, exclude: tuple[str, ...] = ()) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not rel.startswith(exclude):
            h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def write_task(task: str, events: list[Event], out: Path) -> None:
    """Write the snapshots of one task into `out` (a fresh folder)."""
    shared = {}  # relative path under shared/ -> text, as it grows
    for k in range(1, AGENTS + 1):
        shared[f"roles/agent-{k}.md"] = (
            f"# agent-{k}\n\nYou are one of {AGENTS} agents optimising `{task}`. Read the shared notes and "
            "attempts before you start, build on the best attempt, write down what you learn.\n"
        )
    logs = {k: [] for k in range(1, AGENTS + 1)}
    for e in events:
        shared[f"attempts/{e.commit_hash}.json"] = json.dumps(attempt_record(e), indent=2) + "\n"
        shared.update(e.notes)
        if e.skill:
            shared[f"skills/{e.skill}/SKILL.md"] = f"---\nname: {e.skill}\n---\n\n{SKILLS[e.skill]}\n"
        shown = "pending" if e.status == "pending" else ("FAILED" if e.score is None else f"{e.score:.6f}")
        logs[e.agent].append(f"{e.timestamp} eval #{e.eval_count} {e.commit_hash[:12]} {shown} {e.status}")
        shared[f"logs/agent-{e.agent}.log"] = "\n".join(logs[e.agent]) + "\n"
        snap = out / f"eval-{e.index:06d}-agent-{e.agent}-{e.commit_hash[:12]}"
        (snap / "code").mkdir(parents=True)
        for sub in ("attempts", "notes", "skills", "roles", "logs"):  # Coral's layout, even while empty
            (snap / "shared" / sub).mkdir(parents=True)
        (snap / "code" / "solution.py").write_text(e.code)
        for rel, text in shared.items():
            path = snap / "shared" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        meta = {
            "eval_count": e.eval_count,
            "agent_id": f"agent-{e.agent}",
            "commit_hash": e.commit_hash,
            "shared_state_hash": tree_hash(snap / "shared", exclude=("logs/",)),
            "exported_shared_content_hash": tree_hash(snap / "shared"),
            "task": task,
            "timestamp": e.timestamp,
        }
        if e.eval_ok is not None:  # pending snapshots have no eval_ok: the grader never wrote back
            meta["eval_ok"] = e.eval_ok
        (snap / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")


def stamp_of(task: str, seed: int, count: int) -> dict:
    return {
        "generator": "make_example_snapshots",
        "version": VERSION,
        "task": task,
        "seed": seed,
        "count": count,
    }


def build(task: str, out_dir: Path, seed: int, count: int, workers: int) -> str:
    final = out_dir / task
    stamp = stamp_of(task, seed, count)
    stamp_file = final / ".example-stamp.json"
    if stamp_file.is_file():
        try:
            if json.loads(stamp_file.read_text()) == stamp:
                return f"{task}: up to date ({final}), skipped"
        except ValueError:
            pass
    elif final.exists():  # never replace a folder this script did not make (it may be a real Student run)
        raise SystemExit(f"{final} exists and was not made by this script: remove it or choose another --out")
    t0 = time.monotonic()
    grader = Grader(task, workers)
    events = simulate(task, seed, count, grader)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{task}.tmp-", dir=out_dir))
    try:
        write_task(task, events, tmp)
        (tmp / ".example-stamp.json").write_text(json.dumps(stamp) + "\n")
        old = None
        if final.exists():
            old = out_dir / f".{task}.old-{os.getpid()}"
            final.rename(old)
        tmp.rename(final)
        if old:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    ok = sum(e.eval_ok is True for e in events)
    failed = sum(e.eval_ok is False for e in events)
    pending = sum(e.eval_ok is None for e in events)
    scores = [e.score for e in events if e.score is not None]
    span = f"{scores[0]:.4f} -> best {(max if SPECS[task].direction == 'maximize' else min)(scores):.4f}"
    return (
        f"{task}: {len(events)} snapshots ({ok} ok, {failed} eval_ok=false, {pending} pending), score {span}, "
        f"{grader.calls} grader runs, {time.monotonic() - t0:.1f}s -> {final}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="output folder (one subfolder per task)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", default="circle_packing,tsp", help="comma-separated: " + ",".join(SPECS))
    parser.add_argument("--count", type=int, default=96, help="snapshots per task (>= 8)")
    parser.add_argument("--workers", type=int, default=max(2, os.cpu_count() or 2), help="grader processes")
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in SPECS]
    if unknown or not tasks:
        parser.error(f"unknown task(s) {unknown}; known: {', '.join(SPECS)}")
    if args.count < 8:
        parser.error("--count must be at least 8")
    # The tasks run side by side: each round waits on its own graders, so two tasks keep the pool busy.
    with ThreadPoolExecutor(max_workers=len(tasks)) as pool:
        for line in pool.map(lambda t: build(t, args.out, args.seed, args.count, args.workers), tasks):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
