"""`coral` inside an agent's workspace: `coral eval` is answered by the host; the rest runs in the sandbox.

How it runs (docs/runtime.md): the agent's PATH starts with a small `coral` client (CLIENT_SCRIPT, run by the
sandbox user). `coral eval` (and `coral wait`) go over a Unix socket to this edge's `CoralServer` thread in the
explore process, outside the sandbox, which commits what the worktree holds (the host reads it:
runtime/folderreader.py), grades a copy of exactly that commit with the task's grader, writes the attempt record
and answers with what Coral's `coral eval` prints and the import that brings the agent's own repository to the
new commit (the client runs it, as the sandbox user). Every other command runs inside the sandbox: the user's
Coral CLI, or sftree's stand-in in Coral's formats (`$CORAL_CLI`, from `sftree.world`), over the edge's
Coral-shaped run directory; they read the knowledge, and the worktree's own git (`coral diff`, `checkout`,
`revert`).

The host's records rule: the score, the status, the eval number and the best scores come from the host's
grading and its records of the branch (`NodeState.counters`, from the root snapshot's attempts read once and
advanced by each graded eval), never from a file the agent can write; what `coral eval` prints is rendered by
the world (Coral's own `_print_attempt_result`, or the stand-in) from the host's record. Requests are bounded
(REQUEST_MAX bytes, REQUEST_TIMEOUT s to arrive).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from sftree.errors import SftreeError
from sftree.jsontypes import CoralDoc
from sftree.runtime import safefs, tempdirs
from sftree.runtime.checkout import write_files
from sftree.runtime.folderreader import QuotaExceeded, UnsafeWorkspace
from sftree.runtime.objects import flatten
from sftree.runtime.procs import run_group
from sftree.runtime.unixsock import Listener, RequestError, read_request
from sftree.world.text import one_line, own_line, safe_attempt

if TYPE_CHECKING:  # (annotations: the `coral` client run by `sftree coral` imports none of them)
    from datetime import datetime

    from sftree.runtime.diskquota import DiskQuota
    from sftree.runtime.workspace import EdgeWorkspace
    from sftree.world.counters import CoralCounters
    from sftree.world.locate import CoralInstall
    from sftree.world.task import TaskSpec
    from sftree.world.world import CommandOutput, EvalArgs

log = logging.getLogger(__name__)

FEEDBACK_CAP = 4000
REQUEST_MAX = 1 << 20
REQUEST_TIMEOUT = 10.0
RULE = "=" * 50


@dataclass
class EvalResult:
    """One `coral eval` call, as the host recorded it."""

    number: int | None  # Coral's global eval number #N (None: nothing was evaluated)
    commit: str | None
    score: float | None
    status: str  # improved|baseline|regressed|crashed|timeout|nothing_to_commit|error
    feedback: str
    message: str
    output: str  # what `coral eval` printed to the agent (stdout and stderr)
    grader_s: float = 0.0
    parent: str | None = None
    record: CoralDoc | None = None  # the attempt record (Attempt.to_dict fields) of a graded eval
    counters_before: CoralDoc | None = None  # the host's Coral counters before it (CoralCounters.to_dict)

    def to_dict(self) -> CoralDoc:
        return asdict(self)


# ---- grading -------------------------------------------------------------------------------------------------
def parse_grader_output(stdout: str) -> tuple[float | None, str]:
    """A grader command prints JSON `{"score": float|null, "feedback": str}` on its last non-empty line."""
    lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
    if not lines:
        raise ValueError("grader printed nothing")
    data = json.loads(lines[-1])
    if not isinstance(data, dict) or "score" not in data:
        raise ValueError("grader's last line has no `score`")
    score = data["score"]
    if score is not None:
        score = float(score)
        if score != score or score in (float("inf"), float("-inf")):
            score = None
    return score, str(data.get("feedback", ""))


def run_grader(task_cfg: CoralDoc, code_dir: Path, sandbox: str) -> tuple[float | None, str, str]:
    """Run the task's grader command on `code_dir` (a copy of the commit the host wrote): (score, feedback,
    status scored|crashed|timeout). The grader is the user's (trusted); the code it grades is not: a grader
    built on `sftree.runtime.gradebox` confines it (`SFTREE_SANDBOX`, docs/security.md)."""
    grader = task_cfg.get("grader")
    if not grader:
        return None, "no grader command is configured for this task", "crashed"
    timeout = float(task_cfg.get("grader_timeout", 120))
    cmd = grader.format(
        code_dir=shlex.quote(str(code_dir)), task_dir=shlex.quote(str(task_cfg.get("task_dir", "")))
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORAL_", "SFTREE_"))}
    env["SFTREE_SANDBOX"] = sandbox
    res = run_group(cmd, timeout=timeout, shell=True, cwd=str(code_dir.parent), env=env, max_output=4 << 20)
    if res.timed_out:
        return None, f"grader timed out after {timeout:g}s", "timeout"
    stdout, stderr = res.stdout.decode("utf-8", "replace"), res.stderr.decode("utf-8", "replace")
    if res.returncode != 0:
        tail = (stderr.strip() or stdout.strip())[-FEEDBACK_CAP:]
        return None, f"grader exited with code {res.returncode}: {tail}", "crashed"
    try:
        score, feedback = parse_grader_output(stdout)
    except (ValueError, json.JSONDecodeError) as exc:
        return (
            None,
            f"grader output unreadable ({exc}): {(stderr or stdout).strip()[-FEEDBACK_CAP:]}",
            "crashed",
        )
    return score, feedback[:FEEDBACK_CAP], ("scored" if score is not None else "crashed")


def attempt_file(record: CoralDoc) -> bytes:
    """An attempt record as Coral's `write_attempt` writes it (`json.dumps(Attempt.to_dict(), indent=2)`), its
    title and feedback as the agent-text rule shows them: `coral log` and `coral show` print them in blocks of
    their own."""
    keys = ("commit_hash", "agent_id", "title", "score", "status", "parent_hash", "timestamp", "feedback")
    d = safe_attempt({k: record.get(k) for k in keys})
    for k in ("shared_state_hash", "parent_shared_state_hash"):
        if record.get(k) is not None:
            d[k] = record[k]
    if record.get("metadata"):
        d["metadata"] = record["metadata"]
    return json.dumps(d, indent=2).encode()


# ---- the runtime (outside the sandbox) ---------------------------------------------------------------------
# What a second `coral eval` of one turn prints (the first ended the turn; sftree's own message, not Coral's).
TURN_ENDED = "Error: this turn already ended at its eval; nothing was committed or graded.\n"


class RuntimeWorld(Protocol):
    """What the host's `coral` commands use of the Teacher's world (world/world.py `World`): how Coral parses and
    prints an eval, and the task it grades; and what the agent backends read of it through the runtime
    (agents/base.py `CoralSession.world`: the worktree's opencode.json)."""

    @property
    def agent_id(self) -> str: ...
    @property
    def run_dir(self) -> str: ...
    @property
    def spec(self) -> TaskSpec: ...
    @property
    def install(self) -> CoralInstall | None: ...

    def parse_eval(self, argv: list[str]) -> EvalArgs | CommandOutput: ...
    def eval_output(
        self,
        record: CoralDoc | None,
        eval_count: int | None = None,
        *,
        error: str | None = None,
        wait: bool = False,
    ) -> CommandOutput: ...
    def opencode_json(self) -> str: ...
    def eval_time(self, number: int) -> datetime: ...


class CoralRuntime:
    """Executes the host's coral commands (`eval`, `wait`) for one edge; records every eval in `evals`.

    `world` (sftree.world.World) says how Coral parses, prints and counts; `counters` (CoralCounters) are the
    host's records of the branch so far, advanced by each graded eval."""

    def __init__(
        self,
        ws: EdgeWorkspace,
        world: RuntimeWorld,
        task_cfg: CoralDoc,
        counters: CoralCounters,
        *,
        sandbox: str,
        grade_quota: DiskQuota | None = None,
    ) -> None:
        self.ws = ws
        self.grade_quota = grade_quota  # diskquota.DiskQuota of one grading (None: grading.GRADE_QUOTA)
        self.world = world
        self.sandbox = sandbox
        self.task_cfg = task_cfg
        self.direction = world.spec.direction
        self.counters = counters
        self.evals: list[EvalResult] = []
        self.grader_s = 0.0
        self._lock = threading.Lock()
        self.turn_ended = False  # the turn's first eval was taken: no other until the next turn opens

    def open_turn(self) -> None:
        """A turn starts (search/edge.py): its first `coral eval` ends it, and the runtime takes no other."""
        with self._lock:
            self.turn_ended = False

    def handle(self, argv: list[str]) -> CoralDoc:
        """Run one host-side coral command; the reply {rc, stdout, stderr[, repo: the import stream for the agent's
        repository, in a file the caller sends on and closes]}. Never raises."""
        # Every argument on one line before anything reads it: Coral echoes arguments (a refusal of its parser,
        # `wait`'s "No attempt matches"), and the message is the title and the commit's message.
        argv = [one_line(a) for a in argv]
        cmd = next((a for a in argv if not a.startswith("-")), "")
        try:
            with self._lock:
                if cmd == "eval":
                    return self.cmd_eval(argv)
                if cmd == "wait":
                    return self.cmd_wait(argv)
            return {"rc": 2, "stdout": "", "stderr": f"coral: {cmd!r} is not answered by the host\n"}
        except Exception as exc:  # noqa: BLE001 - report to the agent, keep serving
            log.exception("coral %s failed", argv)
            return {"rc": 1, "stdout": "", "stderr": f"Error: internal error: {one_line(str(exc))}\n"}

    def cmd_eval(self, argv: list[str]) -> CoralDoc:
        from sftree.world.counters import advance
        from sftree.world.world import EvalArgs

        args = self.world.parse_eval(argv[argv.index("eval") + 1 :])
        if not isinstance(args, EvalArgs):  # Coral's own refusal (a missing -m, an unknown flag): no eval
            return {"rc": args.rc, "stdout": args.stdout, "stderr": args.stderr}
        msg = args.message
        if self.turn_ended:  # the turn ended at its first eval: this one would grade what came after it
            return {"rc": 1, "stdout": "", "stderr": TURN_ENDED}
        self.turn_ended = True
        have = self.ws.parent_for_commit()
        try:
            commit, _info = self.ws.commit_code(
                own_line(msg)
            )  # `git log`, `coral show` print it on its own line
        except (QuotaExceeded, UnsafeWorkspace, OSError) as exc:  # its text may name the agent's files
            ev = EvalResult(None, None, None, "error", str(exc), msg, f"Error: {one_line(str(exc))}\n")
            self.evals.append(ev)
            return {"rc": 1, "stdout": "", "stderr": ev.output}
        if commit is None:
            out = self.world.eval_output(None, error="nothing_to_commit")
            self.evals.append(
                EvalResult(None, None, None, "nothing_to_commit", "Nothing to commit", msg, out.stderr)
            )
            return {"rc": out.rc, "stdout": out.stdout, "stderr": out.stderr}
        before = self.counters
        number = before.global_evals + 1
        # Coral checkpoints the shared knowledge when the agent submits (coral/hub/checkpoint.py).
        shared = self.ws.commit_knowledge(f"checkpoint: {self.world.agent_id}: {one_line(msg)[:200]}")
        t0 = time.monotonic()
        score, feedback, gstatus, meta = self._grade(commit, msg, args.tune)
        secs = time.monotonic() - t0
        self.grader_s += secs
        status = before.status_for(score, self.direction) if gstatus == "scored" else gstatus
        record = {
            "commit_hash": commit, "agent_id": self.world.agent_id, "title": msg, "score": score,
            "status": status, "parent_hash": have, "timestamp": self.world.eval_time(number).isoformat(),
            "feedback": feedback, "shared_state_hash": shared, "metadata": meta,
        }  # fmt: skip
        shown = self.world.eval_output(record, number)
        self.counters = advance(before, record, self.direction)
        ev = EvalResult(number, commit, score, status, feedback, msg, shown.stdout + shown.stderr, secs, have,
                        record, before.to_dict())  # fmt: skip
        self.evals.append(ev)  # the host's record first; what follows is for the agent
        self.ws.graded.append(commit)
        try:
            self.ws.write_attempt(commit, attempt_file(record))
            safefs.write_bytes_atomic(self.ws.knowledge_dir, "eval_count", f"{number}".encode())
        except OSError as exc:  # a link planted where the counter goes: not written through it
            log.warning("edge %s: attempt record for %s: %s", self.ws.edge_id, commit, exc)
        # the file the reply's stream is sent from (`CoralServer._one` sends and closes it)
        return {
            "rc": shown.rc,
            "stdout": shown.stdout,
            "stderr": shown.stderr,
            "repo": self.ws.repo_update(commit, have),
        }

    def _grade(self, commit: str, title: str, tune: bool) -> tuple[float | None, str, str, CoralDoc]:
        """Grade a copy of exactly `commit`, written by the host from its store, outside the workspace:
        (score, feedback, scored|crashed|timeout, the record's metadata)."""
        db = self.ws.store.code
        with tempdirs.temporary("sftree-grade-") as tmp:
            code_dir = Path(tmp) / "code"
            code_dir.mkdir()
            write_files(db, flatten(db, db.commit_tree(commit)), code_dir)
            spec = self.world.spec
            if spec.kind != "coral":
                score, feedback, status = run_grader(self.task_cfg, code_dir, self.sandbox)
                return score, feedback, status, {}
            from sftree.world.grading import grade

            r = grade(
                spec, code_dir, commit=commit, install=self.world.install, sandbox=self.sandbox,
                agent_id=self.world.agent_id, title=title, tune=tune, run_dir=self.world.run_dir,
                quota=self.grade_quota,
            )  # fmt: skip
            return r.score, r.feedback, r.status, dict(r.metadata or {})

    def cmd_wait(self, argv: list[str]) -> CoralDoc:
        """`coral wait HASH`: every eval here is graded before `coral eval` returns, so it prints the result."""
        rest = [a for a in argv[argv.index("wait") + 1 :] if not a.startswith("-")]
        target = rest[0] if rest else ""
        for ev in self.evals:
            if target and ev.commit and ev.commit.startswith(target) and ev.record is not None:
                out = self.world.eval_output(ev.record, ev.number, wait=True)
                return {"rc": out.rc, "stdout": out.stdout, "stderr": out.stderr}
        return {"rc": 1, "stdout": "", "stderr": f"Error: No attempt matches '{target}'.\n"}


# ---- socket server and client ------------------------------------------------------------------------------
HOST_COMMANDS = (
    "eval",
    "wait",
)  # the host's; the others run in the sandbox ($CORAL_CLI: Coral's CLI or the stand-in)
CLIENT_SCRIPT = r'''#!{python} -IS
"""coral: `eval` and `wait` go to the sftree runner outside the sandbox; the rest runs here."""
import json, os, socket, subprocess, sys
HOST = {host}
argv = sys.argv[1:]
cmd = next((a for a in argv if not a.startswith("-")), "")
if cmd not in HOST:
    cli = json.loads(os.environ.get("CORAL_CLI") or "[]")
    if not cli:
        sys.exit("coral: CORAL_CLI is not set (not inside an sftree workspace)")
    os.execv(cli[0], [*cli, *argv])
path = os.environ.get("CORAL_SOCKET")
if not path:
    sys.exit("coral: CORAL_SOCKET is not set (not inside an sftree workspace)")
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(path)
except OSError as e:
    sys.exit(f"coral: cannot reach the sftree runner at {{path}}: {{e}}")
s.sendall(json.dumps({{"argv": argv, "cwd": os.getcwd()}}).encode() + b"\n")
def take(n):
    got = b""
    while len(got) < n:
        chunk = s.recv(n - len(got))
        if not chunk:
            break
        got += chunk
    return got
# the reply: its length in 10 digits, the reply, then the import stream (when it says "repo") until the end
head = take(10)
reply = json.loads(take(int(head)).decode() if head.isdigit() else '{{"rc": 1, "stderr": "coral: empty reply\\n"}}')
if reply.get("repo"):
    wt = os.environ.get("CORAL_WORKTREE", ".")
    # git reads the stream from the socket itself: nothing of it is held here
    r = subprocess.run(["/bin/sh", "-c", "git fast-import --quiet --force && git reset -q"], cwd=wt,
                       stdin=s.fileno(), capture_output=True)
    if r.returncode:
        sys.stderr.write("coral: the worktree's git was not updated: " + r.stderr.decode(errors="replace")[-300:] + "\n")
sys.stdout.write(reply.get("stdout", ""))
sys.stderr.write(reply.get("stderr", ""))
sys.exit(reply.get("rc", 1))
'''


class CoralServer:
    """Serves one workspace's host-side coral commands on a Unix socket in a short temp folder."""

    def __init__(self, runtime: CoralRuntime):
        self.runtime = runtime
        self.dir = tempdirs.make("sftree-coral-")
        self.bin_dir = self.dir / "bin"
        self.bin_dir.mkdir()
        client = self.bin_dir / "coral"
        # The running interpreter, isolated and without site: no shim (pyenv) and ~10x faster startup.
        client.write_text(CLIENT_SCRIPT.format(python=sys.executable, host=repr(HOST_COMMANDS)))
        client.chmod(0o755)
        self.socket_path = self.dir / "coral.sock"
        self._listener: Listener | None = None

    def env(self, inside: str | None = None) -> dict[str, str]:
        """Environment for the agent's commands; `inside` = where self.dir is mounted in a sandbox."""
        base = Path(inside) if inside else self.dir
        return {"CORAL_SOCKET": str(base / "coral.sock"), "CORAL_BIN": str(base / "bin")}

    def start(self) -> None:
        self._listener = Listener(self.socket_path, self._one, name=f"coral-{self.runtime.ws.edge_id}")

    def _one(self, conn: socket.socket) -> None:
        with conn:
            reply = self._answer(conn)
            stream: IO[bytes] | None = reply.pop("repo", None)
            try:
                doc = json.dumps({**reply, "repo": True} if stream else reply).encode("utf-8")
                conn.settimeout(REQUEST_TIMEOUT)
                conn.sendall(b"%010d" % len(doc) + doc)
                if stream:
                    conn.sendfile(stream)  # (each send within REQUEST_TIMEOUT, as the reply's)
            except OSError:
                pass
            finally:
                if stream:
                    stream.close()

    def _answer(self, conn: socket.socket) -> CoralDoc:
        """Read one request (at most REQUEST_MAX bytes, within REQUEST_TIMEOUT s) and answer it."""
        try:
            req = json.loads(read_request(conn, REQUEST_MAX, REQUEST_TIMEOUT).decode("utf-8"))
            argv = [str(a) for a in req.get("argv", [])]
        except RequestError as exc:
            return {"rc": 2, "stdout": "", "stderr": f"coral: {exc}\n"}
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            return {"rc": 2, "stdout": "", "stderr": f"coral: bad request: {one_line(str(exc))}\n"}
        return self.runtime.handle(argv)

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.stop()
        tempdirs.remove(self.dir)


# ---- `sftree coral` ------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="eval -m MSG | wait HASH")


def run(args: argparse.Namespace) -> int:
    path = os.environ.get("CORAL_SOCKET")
    if not path:
        raise SftreeError(
            "CORAL_SOCKET is not set: `sftree coral` works inside an sftree agent workspace only"
        )
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as exc:
        raise SftreeError(f"cannot reach the sftree runner at {path}: {exc}") from None
    with s:
        s.sendall(json.dumps({"argv": args.argv, "cwd": os.getcwd()}).encode() + b"\n")
        f = s.makefile("rb")
        head = f.read(10)  # the reply's length; a repository stream after it is for the client in a worktree
        body = f.read(int(head)) if head.isdigit() else b""
    reply = json.loads(body.decode() or '{"rc": 1, "stderr": "coral: empty reply\\n"}')
    print(reply.get("stdout", ""), end="")
    print(reply.get("stderr", ""), end="", file=sys.stderr)
    return int(reply.get("rc", 1))
