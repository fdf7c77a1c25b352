"""Synthetic Coral-shaped run folders for the tests and the benchmark of `sftree import-coral`.

A real Coral run is made by tests/test_import_coral_real.py (`coral start`); this builds the same layout directly
with `git fast-import`, fast enough for 10k attempts and free to shape (bad records, missing objects, hostile
content), without Coral installed:

    run/.coral/config.yaml                     task name, grader.direction
    run/.coral/public/attempts/<commit>.json   each attempt's record (Attempt.to_dict, json.dumps(indent=2))
    run/.coral/public/eval_count               attempts graded
    run/.coral/public/.git                     one checkpoint commit per submission (coral/hub/checkpoint.py):
                                               attempts/ as they were then (earlier ones pending or graded),
                                               notes, skills, roles, logs, eval_count, ...
    run/repo/.git                              the code: one branch per agent, one commit per attempt

A multi-island run (a spec with `island`, as upstream Coral's `hub/_island.py` lays it out): each island's hub is
`run/.coral/islands/<id>/` (attempts/, eval_count, its own checkpoint repository .git, notes, skills, ...) in place
of `.coral/public`; the code repository is the run's one `repo/`. Records carry what upstream's writers put in
`metadata`: `island_id` at submission (`hooks/post_commit.py` `submit_eval`), `budget_class` `tune` at submission
of a `coral eval --tune`, and the final class the grader daemon stamps (`grader/daemon.py` `_grade_one`: `real`,
`tune`, or `grader_error` when the grader timed out or raised).

As in Coral, attempt i is checkpointed, then its pending record written; it is graded (its record rewritten)
before the submission of attempt i + `graded_after`, unless it stays pending.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

GIT_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "coral",
    "GIT_AUTHOR_EMAIL": "coral@local",
    "GIT_COMMITTER_NAME": "coral",
    "GIT_COMMITTER_EMAIL": "coral@local",
}
T0 = datetime(2026, 3, 1, 9, 0, 0, tzinfo=UTC)


@dataclass
class Spec:
    """One attempt. `files`: code paths changed by this attempt (bytes; ("x", bytes) executable; ("l", target)
    a symlink); `public`: files of .coral/public written before its submission (notes/..., skills/..., logs/...)."""

    agent: str
    files: dict = field(default_factory=dict)
    status: str = "improved"  # the final status; "pending": never graded
    score: float | None = 1.0
    public: dict = field(default_factory=dict)
    graded_after: int = 1
    title: str = ""
    shared_state: bool = True  # False: the record has no shared_state_hash (an older Coral)
    budget: str | None = "real"  # the budget class; None: a Coral before budget classes (no metadata at all)
    island: str | None = None  # the island's id in a multi-island run


@dataclass
class Built:
    run: Path
    commits: list[str]  # per spec, in submission order
    checkpoints: list[str]
    records: list[dict]  # final records as written
    timestamps: list[str]


def git(*args, cwd=None, input=None, check=True) -> str:
    p = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, env=GIT_ENV, check=False)
    if check and p.returncode != 0:
        raise RuntimeError(f"git {args[:3]} failed: {p.stderr.decode(errors='replace')}")
    return p.stdout.decode()


def _data(b: bytes) -> bytes:
    return b"data %d\n" % len(b) + b + b"\n"


def _m(path: str, value) -> bytes:
    if isinstance(value, tuple) and value[0] == "x":
        return b"M 100755 inline " + path.encode() + b"\n" + _data(value[1])
    if isinstance(value, tuple) and value[0] == "l":
        return b"M 120000 inline " + path.encode() + b"\n" + _data(value[1].encode())
    if value is None:
        return b"D " + path.encode() + b"\n"
    return b"M 100644 inline " + path.encode() + b"\n" + _data(value)


def record(spec: Spec, commit: str, parent: str | None, stamp: str, ssh: str | None, final: bool) -> dict:
    """The record Coral writes: pending at submission, then the grader daemon's final one."""
    graded = final and spec.status != "pending"
    d = {
        "commit_hash": commit,
        "agent_id": spec.agent,
        "title": spec.title or f"attempt by {spec.agent}",
        "score": spec.score if graded else None,
        "status": spec.status if graded else "pending",
        "parent_hash": parent,
        "timestamp": stamp,
        "feedback": f"score {spec.score}" if graded else "",
    }
    if ssh is not None:
        d["shared_state_hash"] = ssh
    meta: dict = {}
    if spec.budget == "tune":  # submit_eval(tune=True) marks the pending record
        meta["budget_class"] = "tune"
    if spec.island is not None:
        meta["island_id"] = spec.island
    if graded and spec.budget is not None:  # the daemon carries the pending metadata and stamps the class
        meta["budget_class"] = spec.budget
    if meta:
        d["metadata"] = meta
    return d


def record_bytes(d: dict) -> bytes:
    return json.dumps(d, indent=2).encode()


def build_run(
    run: Path,
    specs: list[Spec],
    *,
    seed_files: dict | None = None,
    task: str = "Synthetic Task",
    direction: str = "maximize",
    step_s: float = 30.0,
) -> Built:
    run = Path(run)
    public = run / ".coral" / "public"
    (public / "attempts").mkdir(parents=True)
    (run / ".coral" / "config.yaml").write_text(
        f"task:\n  name: {task}\n  description: synthetic\ngrader:\n  direction: {direction}\n  timeout: 60\n"
    )
    # --- the code repository: a seed commit, then one commit per attempt on its agent's branch
    repo = run / "repo"
    git("init", "-q", str(repo))
    seed = seed_files or {"solution.py": b"VALUE = 1.0\n", "README.md": b"seed\n"}
    stream = [
        b"commit refs/heads/main\nmark :1\ncommitter coral <coral@local> 1700000000 +0000\n" + _data(b"seed")
    ]
    stream += [_m(p, v) for p, v in seed.items()]
    heads: dict[str, str] = {}
    for i, s in enumerate(specs, 2):
        ref = f"refs/heads/coral/{s.agent}".encode()
        stream.append(
            b"commit " + ref + b"\nmark :%d\ncommitter coral <coral@local> %d +0000\n" % (i, 1700000000 + i)
        )
        stream.append(_data((s.title or f"attempt {i - 1}").encode()))
        stream.append(b"from " + (heads.get(s.agent) or ":1").encode() + b"\n")
        heads[s.agent] = f":{i}"
        stream += [_m(p, v) for p, v in s.files.items()]
    marks = run / "code.marks"
    git("fast-import", "--quiet", f"--export-marks={marks}", cwd=repo, input=b"".join(stream))
    by_mark = dict(line.split() for line in marks.read_text().splitlines())
    marks.unlink()
    commits = [by_mark[f":{i}"] for i in range(2, len(specs) + 2)]
    parents, last = [], {}
    for s, c in zip(specs, commits, strict=True):
        parents.append(last.get(s.agent, by_mark[":1"]))
        last[s.agent] = c
    git("update-ref", "HEAD", by_mark[":1"], cwd=repo)
    # --- one hub per island (or .coral/public): its checkpoint repository, records and eval counter
    stamps = [(T0 + timedelta(seconds=step_s * i)).isoformat() for i in range(len(specs))]
    checkpoints: list = [None] * len(specs)
    out: list = [None] * len(specs)
    islands = list(dict.fromkeys(s.island for s in specs))
    if islands != [None] and None in islands:
        raise ValueError("a multi-island run gives every attempt an island")
    for island in islands:
        hub = public if island is None else run / ".coral" / "islands" / island
        idx = [i for i, s in enumerate(specs) if s.island == island]
        got = _hub(
            hub, [specs[i] for i in idx], [commits[i] for i in idx], [parents[i] for i in idx], idx, stamps
        )
        for i, (ck, rec) in zip(idx, got, strict=True):
            checkpoints[i], out[i] = ck, rec
    if islands != [None]:  # the manager's folder stays; the islands are the hubs
        (public / "attempts").rmdir()
    return Built(run, commits, checkpoints, out, stamps)


def _hub(hub: Path, specs: list[Spec], commits, parents, order: list[int], stamps) -> list[tuple[str, dict]]:
    """A hub's checkpoint repository (one commit per submission, through an interactive fast-import), final
    records and eval_count; (checkpoint, record) per spec. `order`: each spec's place in the whole run."""
    (hub / "attempts").mkdir(parents=True, exist_ok=True)
    git("init", "-q", str(hub))
    proc = subprocess.Popen(
        ["git", "fast-import", "--quiet", "--done"],
        cwd=hub,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=GIT_ENV,
    )

    def commit(mark: int, msg: str, changes: list[bytes], when: int) -> str:
        head = b"commit refs/heads/master\nmark :%d\ncommitter coral <coral@local> %d +0000\n" % (mark, when)
        proc.stdin.write(head + _data(msg.encode()) + b"".join(changes) + b"\nget-mark :%d\n" % mark)
        proc.stdin.flush()
        return proc.stdout.readline().decode().strip()

    init = commit(1, "init: shared state tracking", [_m(".gitignore", b"coral.lock\n")], 1700000000)
    assert len(init) in (40, 64), init
    checkpoints: list[str] = []
    finals: list[dict] = []
    pendings: list[dict] = []
    graded_at = [i + s.graded_after if s.status != "pending" else None for i, s in enumerate(specs)]
    written: set[int] = set()  # final records already in the hub
    graded_count = 0
    for i, s in enumerate(specs):
        changes = []
        if i > 0:  # the previous submission's pending record, written right after its checkpoint
            changes.append(_m(f"attempts/{commits[i - 1]}.json", record_bytes(pendings[i - 1])))
        for j in range(i):
            if j not in written and graded_at[j] is not None and graded_at[j] <= i:
                changes.append(_m(f"attempts/{commits[j]}.json", record_bytes(finals[j])))
                written.add(j)
                graded_count += 1
        changes.append(_m("eval_count", str(graded_count).encode()))
        changes += [_m(p, v) for p, v in s.public.items()]
        when = 1700000000 + 10 * order[i]
        ssh = commit(i + 2, f"checkpoint: {s.agent} - {s.title or order[i]}", changes, when)
        checkpoints.append(ssh)
        ssh_rec = ssh if s.shared_state else None
        pendings.append(record(s, commits[i], parents[i], stamps[order[i]], ssh_rec, final=False))
        finals.append(record(s, commits[i], parents[i], stamps[order[i]], ssh_rec, final=True))
    proc.stdin.write(b"done\n")
    proc.stdin.close()
    if proc.wait() != 0:
        raise RuntimeError("git fast-import failed on the checkpoint repository")
    proc.stdout.close()
    git("update-ref", "HEAD", "refs/heads/master", cwd=hub, check=False)
    out = []
    for s, fin, pen, ssh in zip(specs, finals, pendings, checkpoints, strict=True):
        rec = fin if s.status != "pending" else pen
        (hub / "attempts" / f"{rec['commit_hash']}.json").write_bytes(record_bytes(rec))
        out.append((ssh, rec))
    (hub / "eval_count").write_text(str(sum(1 for s in specs if s.status != "pending")))
    return out


def simple_specs(n: int, agents: int = 2, pending_tail: int = 1) -> list[Spec]:
    """n attempts of `agents` agents: a rising score, a crash and a timeout, notes now and then, a growing log,
    the last `pending_tail` left pending."""
    specs = []
    for i in range(n):
        agent = f"agent-{i % agents + 1}"
        status, score = "improved" if i % 3 else "regressed", round(0.5 + 0.01 * i, 6)
        if i == 2:
            status, score = "crashed", None
        elif i == 4 and n > 6:
            status, score = "timeout", None
        if i >= n - pending_tail:
            status, score = "pending", None
        public = {f"logs/{agent}.0.log": (f"log of {agent} up to attempt {i}\n" * (i + 1)).encode()}
        if i % 3 == 1:
            public[f"notes/{agent}-{i:03d}.md"] = f"# note {i}\n".encode()
        if i == 0:
            public |= {"roles/agent-1.md": b"# role 1\n", "roles/agent-2.md": b"# role 2\n"}
            public |= {"skills/sweep/SKILL.md": b"---\nname: sweep\n---\n", "agent.pids": b"123\n"}
        files = {"solution.py": f"VALUE = {1.0 + i / 10}\n".encode()}
        specs.append(Spec(agent, files, status, score, public, title=f"attempt {i}"))
    return specs
