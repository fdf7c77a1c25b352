"""`coral` inside an agent's workspace: `coral eval` is answered by the host; the rest runs in the sandbox.

How it runs (docs/runtime.md): the agent's PATH starts with a small `coral` client (CLIENT_SCRIPT, run by the
sandbox user). `coral eval` (and `coral wait`) go over a Unix socket to this edge's `CoralServer` thread in the
explore process, outside the sandbox, which commits what the worktree holds (the host reads it:
runtime/snapshot.py), grades a copy of exactly that commit with the task's grader, writes the attempt record
and answers with what Coral's `coral eval` prints and the import that brings the agent's own repository to the
new commit (the client runs it, as the sandbox user). The other commands read the knowledge: the client
answers them itself, inside the sandbox (`sftree.world` supplies Coral's own CLI or the stand-in), or, for
those it cannot, asks the host, which answers from its own records.

The host's records rule: the score, the status, the eval number and the best scores come from the host's
grading and its records of the branch (`NodeState.evals` and the root snapshot's attempts, read once), never
from a file the agent can write. Requests are bounded (REQUEST_MAX bytes, REQUEST_TIMEOUT s to arrive).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import shlex
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sftree.errors import SftreeError
from sftree.runtime import safefs, tempdirs
from sftree.runtime.checkout import write_files
from sftree.runtime.objects import flatten
from sftree.runtime.procs import run_group
from sftree.runtime.snapshot import Quota, QuotaExceeded, UnsafeWorkspace, walk

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

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Graded:
    """A graded attempt in the host's records of a branch."""

    commit: str
    agent_id: str
    score: float | None
    status: str
    title: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Graded:
        return cls(
            str(d["commit"]),
            str(d.get("agent_id", "")),
            d.get("score"),
            str(d.get("status", "")),
            str(d.get("title", "")),
        )


# ---- the rules (pure) ----------------------------------------------------------------------------------------
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


def is_better(a: float, b: float, direction: str) -> bool:
    return a < b if direction == "minimize" else a > b


def status_of(score: float | None, previous: list[float | None], direction: str) -> str:
    """Coral's grader daemon's status of an attempt against the same agent's earlier ones: `crashed` without a
    score, `improved` for the first score or a better one, `baseline` for a tie, else `regressed`."""
    if score is None:
        return "crashed"
    prev = [s for s in previous if s is not None]
    if not prev:
        return "improved"
    best = min(prev) if direction == "minimize" else max(prev)
    if is_better(score, best, direction):
        return "improved"
    return "baseline" if score == best else "regressed"


def fmt_score(score: float | None) -> str:
    return "FAILED" if score is None else f"{score:.10f}"


def one_line(text: str) -> str:
    """The agent's text on one line, so it can never read as a line of the host's."""
    return " ".join(str(text).split())


def quoted_lines(text: str) -> str:
    """Multi-line text that is not the host's (graded code's messages): every line after the first indented."""
    lines = str(text).splitlines() or [""]
    return "\n".join([lines[0], *("  " + ln for ln in lines[1:])])


def eval_block(ev: EvalResult) -> str:
    """What Coral's `coral eval` prints for a finished attempt (coral/cli/eval.py, `_print_attempt_result`)."""
    out = [
        "",
        RULE,
        f"CORAL Eval (#{ev.number}): {fmt_score(ev.score)}",
        f"Commit:  {(ev.commit or '')[:12]}",
    ]
    out.append(f"Status:  {ev.status}")
    if ev.feedback:
        out.append(f"Feedback: {quoted_lines(ev.feedback)}")
    out += [RULE, "", ""]
    return "\n".join(out)


def evals_since_improvement(attempts: list[dict]) -> int:
    """Trailing attempts (oldest first) that did not improve (for the pivot heartbeat)."""
    n = 0
    for a in reversed(attempts):
        if a.get("status") in ("improved", "baseline"):
            break
        n += 1
    return n


def root_records(db, knowledge_commit: str, limit: int = 1 << 20) -> list[Graded]:
    """The graded attempts of the root snapshot's `attempts/` (read once from the store, each record at most
    `limit` bytes), oldest first: the Student's history, from which statuses and counts start."""
    from sftree.runtime.workspace import attempt_entries, split_knowledge

    entries = attempt_entries(db, split_knowledge(db, knowledge_commit)[1])
    names = sorted(n for n in entries if n.endswith(".json"))
    rows = []
    for name, (_kind, data) in zip(names, db.read_many([entries[n][1] for n in names]), strict=True):
        if len(data) > limit:
            continue
        try:
            rec = json.loads(data)
        except ValueError:
            continue
        if not isinstance(rec, dict) or rec.get("status") in (None, "pending"):
            continue
        score = rec.get("score")
        score = float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None
        commit = str(rec.get("commit_hash") or name[:-5])
        g = Graded(
            commit, str(rec.get("agent_id", "")), score, str(rec.get("status")), str(rec.get("title", ""))
        )
        rows.append((str(rec.get("timestamp", "")), name, g))
    return [g for _t, _n, g in sorted(rows, key=lambda r: (r[0], r[1]))]


# ---- grading -------------------------------------------------------------------------------------------------
def run_grader(task_cfg: dict, code_dir: Path, sandbox: str = "auto") -> tuple[float | None, str, str]:
    """Run the task's grader command on `code_dir` (a copy of the commit the host wrote): (score, feedback,
    status ok|crashed|timeout). The grader is the user's (trusted); the code it grades is not: a grader built on
    `sftree.runtime.gradebox` confines it (`SFTREE_SANDBOX`, docs/security.md)."""
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
    return score, feedback[:FEEDBACK_CAP], ("ok" if score is not None else "crashed")


# ---- the runtime (outside the sandbox) ---------------------------------------------------------------------
@dataclass
class Records:
    """The host's records a branch's statuses and counts come from."""

    agent_id: str
    eval_count: int  # Coral's global eval count at the parent
    root: list[Graded] = field(default_factory=list)  # the root snapshot's graded attempts (oldest first)
    path: list[Graded] = field(default_factory=list)  # the Teacher's graded evals on root..parent

    def agent_scores(self) -> list[float | None]:
        return [g.score for g in (*self.root, *self.path) if g.agent_id == self.agent_id]


class CoralRuntime:
    """Executes the host's coral commands for one edge workspace; records every eval in `evals`."""

    def __init__(self, ws, task_cfg: dict, records: Records, *, sandbox: str = "auto", grade=None):
        self.ws = ws
        self.sandbox = sandbox
        self.task_cfg = task_cfg
        self.direction = task_cfg.get("direction", "maximize")
        self.records = records
        self.evals: list[EvalResult] = []
        self.grader_s = 0.0
        self._grade = grade or self._grade_command
        self._lock = threading.Lock()

    @property
    def graded(self) -> list[Graded]:
        """The branch's graded attempts so far: the path's and this edge's (host records)."""
        return [*self.records.path, *(self._as_graded(e) for e in self.evals if e.number is not None)]

    def _as_graded(self, ev: EvalResult) -> Graded:
        return Graded(ev.commit or "", self.records.agent_id, ev.score, ev.status, ev.message)

    def handle(self, argv: list[str]) -> dict:
        """Run one host-side coral command; the reply {rc, stdout, stderr[, repo]}. Never raises."""
        parser = _coral_parser()
        try:
            args = parser.parse_args(argv)
        except _ParseError as exc:
            return {"rc": 2, "stdout": "", "stderr": f"\nerror: {exc}\n"}
        try:
            with self._lock:
                return getattr(self, f"cmd_{args.cmd}")(args)
        except Exception as exc:  # noqa: BLE001 - report to the agent, keep serving
            log.exception("coral %s failed", argv)
            return {"rc": 1, "stdout": "", "stderr": f"Error: internal error: {exc}\n"}

    def cmd_eval(self, args) -> dict:
        msg = " ".join(args.message or []).strip()
        have = self.ws.parent_for_commit()
        try:
            commit, _info = self.ws.commit_code(msg or "(no message)")
        except (QuotaExceeded, OSError) as exc:
            ev = EvalResult(None, None, None, "error", str(exc), msg, f"Error: {exc}\n")
            self.evals.append(ev)
            return {"rc": 1, "stdout": "", "stderr": ev.output}
        if commit is None:
            text = "Error: Nothing to commit — no changes detected.\n"
            self.evals.append(
                EvalResult(None, None, None, "nothing_to_commit", "Nothing to commit", msg, text)
            )
            return {"rc": 1, "stdout": "", "stderr": text}
        number = self.records.eval_count + sum(1 for e in self.evals if e.number is not None) + 1
        t0 = time.monotonic()
        score, feedback, gstatus = self._grade(commit)
        secs = time.monotonic() - t0
        self.grader_s += secs
        if gstatus == "timeout":
            status = "timeout"
        else:
            scores = [*self.records.agent_scores(), *(g.score for g in self.graded[len(self.records.path) :])]
            status = status_of(score, scores, self.direction)
        ev = EvalResult(number, commit, score, status, feedback, msg, "", secs, have)
        ev.output = eval_block(ev)
        self.evals.append(ev)  # the host's record first; what follows is for the agent
        self.ws.graded.append(commit)
        self._write_records(ev)
        repo = self.ws.repo_update(commit, have)
        return {"rc": 0, "stdout": ev.output, "stderr": "", "repo": base64.b64encode(repo).decode()}

    def _write_records(self, ev: EvalResult) -> None:
        record = {
            "commit_hash": ev.commit,
            "agent_id": self.records.agent_id,
            "title": ev.message,
            "score": ev.score,
            "status": ev.status,
            "parent_hash": ev.parent,
            "timestamp": datetime.now(UTC).isoformat(),
            "feedback": ev.feedback,
            "metadata": {"eval_number": ev.number, "source": "sftree", "grader_s": round(ev.grader_s, 3)},
        }
        data = (json.dumps(record, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
        try:
            self.ws.write_attempt(ev.commit, data)
            safefs.write_bytes_atomic(self.ws.knowledge_dir, "eval_count", f"{ev.number}\n".encode())
        except OSError as exc:  # a link planted where the counter goes: not written through it
            log.warning("edge %s: attempt record for %s: %s", self.ws.edge_id, ev.commit, exc)

    def _grade_command(self, commit: str) -> tuple[float | None, str, str]:
        """Grade a copy of exactly `commit`, written by the host from its store, outside the workspace."""
        db = self.ws.store.code
        with tempdirs.temporary("sftree-grade-") as tmp:
            code_dir = Path(tmp) / "code"
            code_dir.mkdir()
            write_files(db, flatten(db, db.commit_tree(commit)), code_dir)
            return run_grader(self.task_cfg, code_dir, self.sandbox)

    def cmd_wait(self, args) -> dict:
        """`coral wait HASH`: every eval here is graded before `coral eval` returns, so it prints the result."""
        for ev in self.evals:
            if ev.commit and ev.commit.startswith(args.hash) and ev.number is not None:
                return {"rc": 0, "stdout": ev.output.replace("CORAL Eval", "CORAL Wait", 1), "stderr": ""}
        return {"rc": 1, "stdout": "", "stderr": f"Error: No attempt matches '{args.hash}'.\n"}

    # The read-only commands when no in-sandbox CLI is configured: answered from the host's records and from
    # bounded reads of the knowledge that never follow a link.
    def cmd_log(self, args) -> dict:
        rows = [*self.records.root, *self.graded]
        if not rows:
            return {"rc": 0, "stdout": "No attempts yet.\n", "stderr": ""}
        shown = rows[-args.n :] if args.n and args.n > 0 else rows
        lines = [f"{len(rows)} attempts (showing {len(shown)})"]
        lines += [
            f"{g.commit[:12]}  {fmt_score(g.score):>14}  {g.status:<9}  {one_line(g.title)[:80]}"
            for g in shown
        ]
        return {"rc": 0, "stdout": "\n".join(lines) + "\n", "stderr": ""}

    def cmd_show(self, args) -> dict:
        hit = next(
            (g for g in reversed([*self.records.root, *self.graded]) if g.commit.startswith(args.hash)), None
        )
        if hit is None:
            return {"rc": 1, "stdout": "", "stderr": f"Error: No attempt matches '{args.hash}'.\n"}
        return {
            "rc": 0,
            "stdout": json.dumps(hit.to_dict(), indent=2, ensure_ascii=False) + "\n",
            "stderr": "",
        }

    def _list(self, sub: str, name: str | None) -> dict:
        root = self.ws.knowledge_dir
        if name:
            try:
                data = safefs.read_bytes(root, Path(sub) / name, limit=1 << 20)
            except (OSError, ValueError):
                return {"rc": 1, "stdout": "", "stderr": f"Error: no such entry {name!r}\n"}
            return {"rc": 0, "stdout": data.decode("utf-8", "replace"), "stderr": ""}
        files = _listing(root / sub)
        if not files:
            return {"rc": 0, "stdout": f"No {sub} yet.\n", "stderr": ""}
        return {"rc": 0, "stdout": "".join(f"{sub}/{f}\n" for f in files), "stderr": ""}

    def cmd_notes(self, args) -> dict:
        return self._list("notes", args.read or args.name)

    def cmd_skills(self, args) -> dict:
        return self._list("skills", args.read or args.name)


def _listing(folder: Path, limit: int = 500) -> list[str]:
    """The regular files under `folder` (relative, sorted), at most `limit`, links neither listed nor followed."""
    out: list[str] = []
    try:
        for _fd, rel, entry in walk(folder, Quota(files=20 * limit, depth=16)):
            if entry.is_file(follow_symlinks=False):
                out.append(rel)
                if len(out) >= limit:
                    break
    except (QuotaExceeded, UnsafeWorkspace, OSError):
        pass
    return sorted(out)


class _ParseError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # never exit the server thread
        raise _ParseError(message)


def _coral_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="coral", add_help=False)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    e = sub.add_parser("eval", add_help=False)
    e.add_argument("-m", "--message", nargs="+", required=True)
    e.add_argument("--agent")
    e.add_argument("--workdir")
    e.add_argument("--no-wait", dest="wait", action="store_false")
    e.add_argument("--timeout", type=float)
    e.add_argument("--tune", action="store_true")
    w = sub.add_parser("wait", add_help=False)
    w.add_argument("hash")
    w.add_argument("--workdir")
    w.add_argument("--timeout", type=float)
    lg = sub.add_parser("log", add_help=False)
    lg.add_argument("-n", type=int, default=20)
    lg.add_argument("--recent", action="store_true")
    lg.add_argument("--agent")
    lg.add_argument("--search")
    lg.add_argument("--all", action="store_true")
    s = sub.add_parser("show", add_help=False)
    s.add_argument("hash")
    s.add_argument("--diff", action="store_true")
    for name in ("notes", "skills"):
        q = sub.add_parser(name, add_help=False)
        q.add_argument("name", nargs="?")
        q.add_argument("--read", "-r")
        q.add_argument("--search", "-s")
        q.add_argument("-n", "--recent", type=int)
    return p


# ---- socket server and client ------------------------------------------------------------------------------
HOST_COMMANDS = ("eval", "wait")  # always the host's; the others too when CORAL_CLI is not set
CLIENT_SCRIPT = r'''#!{python} -IS
"""coral: `eval` and `wait` go to the sftree runner outside the sandbox; the rest runs here."""
import base64, json, os, socket, subprocess, sys
HOST = {host}
argv = sys.argv[1:]
cmd = next((a for a in argv if not a.startswith("-")), "")
cli = os.environ.get("CORAL_CLI")
if cmd not in HOST and cli:
    os.execv(cli.split()[0], [*cli.split(), *argv])
path = os.environ.get("CORAL_SOCKET")
if not path:
    sys.exit("coral: CORAL_SOCKET is not set (not inside an sftree workspace)")
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(path)
except OSError as e:
    sys.exit(f"coral: cannot reach the sftree runner at {{path}}: {{e}}")
s.sendall(json.dumps({{"argv": argv, "cwd": os.getcwd()}}).encode() + b"\n")
chunks = []
while True:
    chunk = s.recv(1 << 20)
    if not chunk:
        break
    chunks.append(chunk)
reply = json.loads(b"".join(chunks).decode() or '{{"rc": 1, "stderr": "coral: empty reply\\n"}}')
if reply.get("repo"):
    wt = os.environ.get("CORAL_WORKTREE", ".")
    r = subprocess.run(["/bin/sh", "-c", "git fast-import --quiet --force && git reset -q"], cwd=wt,
                       input=base64.b64decode(reply["repo"]), capture_output=True)
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
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def env(self, inside: str | None = None) -> dict[str, str]:
        """Environment for the agent's commands; `inside` = where self.dir is mounted in a sandbox."""
        base = Path(inside) if inside else self.dir
        return {"CORAL_SOCKET": str(base / "coral.sock"), "CORAL_BIN": str(base / "bin")}

    def start(self) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.socket_path))
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        name = f"coral-{self.runtime.ws.edge_id}"
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            with conn:
                reply = self._answer(conn)
                try:
                    conn.settimeout(REQUEST_TIMEOUT)
                    conn.sendall(json.dumps(reply).encode("utf-8"))
                except OSError:
                    pass

    def _answer(self, conn: socket.socket) -> dict:
        """Read one request (at most REQUEST_MAX bytes, within REQUEST_TIMEOUT s) and answer it."""
        conn.settimeout(REQUEST_TIMEOUT)
        deadline = time.monotonic() + REQUEST_TIMEOUT
        chunks, size = [], 0
        try:
            while True:
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = conn.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > REQUEST_MAX:
                    return {"rc": 2, "stdout": "", "stderr": "coral: request too large\n"}
                if chunk.endswith(b"\n"):
                    break
            req = json.loads(b"".join(chunks).decode("utf-8"))
            argv = [str(a) for a in req.get("argv", [])]
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            return {"rc": 2, "stdout": "", "stderr": f"coral: bad request: {exc}\n"}
        return self.runtime.handle(argv)

    def stop(self) -> None:
        self._stop.set()
        if self._sock:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept() at once
            except OSError:
                pass
            self._sock.close()
        if self._thread:
            self._thread.join(timeout=5)
        tempdirs.remove(self.dir)


# ---- `sftree coral` ------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="eval -m MSG | wait HASH")


def run(args) -> int:
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
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
    reply = json.loads(buf.decode() or '{"rc": 1, "stderr": "coral: empty reply\\n"}')
    print(reply.get("stdout", ""), end="")
    print(reply.get("stderr", ""), end="", file=sys.stderr)
    return int(reply.get("rc", 1))
