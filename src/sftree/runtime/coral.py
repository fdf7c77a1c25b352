"""`coral` inside an agent workspace: eval, log, show, notes, skills (DESIGN.md "Teacher, agent, eval").

How it runs (**Choice**, docs/runtime.md): the agent's bash (inside bubblewrap, where the grader, the store and
the other branches are not visible) finds a tiny `coral` client on its PATH. The client sends its argv and cwd
over a Unix socket to a `CoralServer` thread in the explore process, outside the sandbox, which does the work
(commit, grade a clean checkout, write the attempt record) and sends back the text and exit code - the way
Coral's grader daemon sits outside the agent. A socket rather than intercepting the bash command line: it works
for any command shape (`cd x && coral eval -m ...`), for both agent backends, and with or without bwrap (a
filesystem socket is reachable from bwrap's separate network namespace through a bind mount).

`sftree coral ...` is the same client (it forwards to `$CORAL_SOCKET`).

`coral eval -m MSG`: `git add -A` + commit in the worktree ("Nothing to commit" -> no score), grade a clean
`git archive` of that commit in a temp folder outside the workspace with the task's grader under
`grader_timeout`, write `.opencode/attempts/<commit>.json` (Coral's Attempt.to_dict fields), print:

    CORAL Eval (#58): 2.634
    Commit: 1a2b3c4d5e6f
    Status: improved (previous best 2.611)
    Feedback: ...

Status: `baseline` (no earlier numeric attempt on this branch), `improved` (strictly better than the branch's
best, direction-aware), `regressed` (otherwise), `crashed` (grader failed or gave no score), `timeout`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import socket
import sys
import tarfile
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from sftree.errors import SftreeError
from sftree.runtime import safefs, tempdirs
from sftree.runtime.attempts import AttemptView, view_for
from sftree.runtime.procs import run_group

log = logging.getLogger(__name__)

FEEDBACK_CAP = 4000
SHA_RE = re.compile(r"^[0-9a-f]{4,64}$")


@dataclass
class EvalResult:
    """One `coral eval` call."""

    number: int | None  # Coral's #N (None: nothing was evaluated)
    commit: str | None
    score: float | None
    status: str  # improved|baseline|regressed|crashed|timeout|nothing_to_commit
    feedback: str
    message: str
    output: str  # the text printed to the agent
    grader_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


# ---- grading (pure-ish helpers) ----------------------------------------------------------------------------
def parse_grader_output(stdout: str) -> tuple[float | None, str]:
    """The grader prints JSON `{"score": float|null, "feedback": str}` on its last non-empty line."""
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


def fmt_score(score: float | None) -> str:
    return "FAILED" if score is None else f"{score:.6g}"


def format_block(ev: EvalResult, best_before: float | None) -> str:
    if ev.status == "nothing_to_commit":
        return "Nothing to commit: the working tree has no changes since the last eval. No eval was run.\n"
    status = ev.status
    if ev.status in ("improved", "regressed") and best_before is not None:
        status += f" (previous best {fmt_score(best_before)})"
    return (
        f"CORAL Eval (#{ev.number}): {fmt_score(ev.score)}\n"
        f"Commit: {ev.commit}\n"
        f"Status: {status}\n"
        f"Feedback: {ev.feedback}\n"
    )


BLOCK_RE = re.compile(r"CORAL Eval \(#(\d+)\): (\S+)\nCommit: (\S+)\nStatus: ([^\n]*)\nFeedback: (.*)", re.S)


def parse_block(text: str) -> dict | None:
    """Read back a printed eval block (used to build the next turn's results prompt from a session)."""
    m = BLOCK_RE.search(text or "")
    if not m:
        return None
    score = None if m.group(2) == "FAILED" else float(m.group(2))
    return {
        "number": int(m.group(1)),
        "score": score,
        "commit": m.group(3),
        "status": m.group(4).split(" ")[0],
        "feedback": m.group(5).strip(),
    }


def evals_since_improvement(attempts: list[dict] | AttemptView) -> int:
    """Trailing attempts that did not improve (for the pivot heartbeat)."""
    if isinstance(attempts, AttemptView):
        return attempts.since_improvement()
    n = 0
    for a in reversed(attempts):
        if a.get("status") in ("improved", "baseline"):
            break
        n += 1
    return n


def run_grader(
    task_cfg: dict, commit: str, git_dir: Path, sandbox: str = "auto"
) -> tuple[float | None, str, str, float]:
    """Grade a clean checkout of `commit` outside the workspace: (score, feedback, status, seconds).

    The grader is trusted (the user's); the code it grades is not. `SFTREE_SANDBOX` tells a grader built on
    `sftree.runtime.gradebox` how to confine the graded code (docs/security.md)."""
    grader = task_cfg.get("grader")
    timeout = float(task_cfg.get("grader_timeout", 120))
    t0 = time.monotonic()
    with tempdirs.temporary("sftree-grade-") as tmp:
        code_dir = Path(tmp) / "code"
        code_dir.mkdir()
        from sftree.runtime.workspace import git

        archive = Path(tmp) / "code.tar"
        git(["archive", "--format=tar", "-o", str(archive), commit], git_dir=git_dir)
        try:
            with tarfile.open(archive) as tf:
                tf.extractall(code_dir, filter="data")  # refuses links out of the code, device files
        except tarfile.FilterError as exc:
            return None, f"the commit cannot be graded: {exc}", "crashed", time.monotonic() - t0
        archive.unlink()
        if not grader:
            return None, "no grader command is configured for this task", "crashed", time.monotonic() - t0
        cmd = grader.format(
            code_dir=shlex.quote(str(code_dir)), task_dir=shlex.quote(str(task_cfg.get("task_dir", "")))
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CORAL_", "SFTREE_"))}
        env["SFTREE_SANDBOX"] = sandbox
        res = run_group(cmd, timeout=timeout, shell=True, cwd=tmp, env=env, max_output=4 * 1024 * 1024)
        if res.timed_out:
            return None, f"grader timed out after {timeout:g}s", "timeout", time.monotonic() - t0
    secs = time.monotonic() - t0
    stdout, stderr = res.stdout.decode("utf-8", "replace"), res.stderr.decode("utf-8", "replace")
    if res.returncode != 0:
        tail = (stderr.strip() or stdout.strip())[-FEEDBACK_CAP:]
        return None, f"grader exited with code {res.returncode}: {tail}", "crashed", secs
    try:
        score, feedback = parse_grader_output(stdout)
    except (ValueError, json.JSONDecodeError) as exc:
        return (
            None,
            f"grader output unreadable ({exc}): {(stderr or stdout).strip()[-FEEDBACK_CAP:]}",
            "crashed",
            secs,
        )
    return score, feedback[:FEEDBACK_CAP], ("ok" if score is not None else "crashed"), secs


# ---- the runtime (outside the sandbox) ---------------------------------------------------------------------
class CoralRuntime:
    """Executes coral commands for one edge workspace; records every eval in `evals`."""

    def __init__(self, ws, task_cfg: dict, *, eval_count: int, agent_id: str, sandbox: str = "auto"):
        self.ws = ws
        self.sandbox = sandbox
        self.task_cfg = task_cfg
        self.direction = task_cfg.get("direction", "maximize")
        self.eval_count = int(eval_count)
        self.agent_id = agent_id
        self.evals: list[EvalResult] = []
        self.grader_s = 0.0
        self._lock = threading.Lock()

    @property
    def attempts_dir(self) -> Path:
        return self.ws.knowledge_dir / "attempts"

    def handle(self, argv: list[str]) -> tuple[int, str]:
        """Run one coral command; (exit code, text). Never raises."""
        parser = _coral_parser()
        try:
            args = parser.parse_args(argv)
        except _ParseError as exc:
            return 2, f"coral: {exc}\n{parser.format_usage()}"
        try:
            with self._lock:
                return getattr(self, f"cmd_{args.cmd}")(args)
        except Exception as exc:  # noqa: BLE001 - report to the agent, keep serving
            log.exception("coral %s failed", argv)
            return 1, f"coral: internal error: {exc}\n"

    def cmd_eval(self, args) -> tuple[int, str]:
        msg = " ".join(args.message or []).strip() or "(no message)"
        attempts = view_for(self.attempts_dir)  # before the commit: the branch best as the agent left it
        parent = self.ws.head()
        commit = self.ws.commit_code(msg)
        if commit is None:
            ev = EvalResult(None, None, None, "nothing_to_commit", "Nothing to commit", msg, "")
            ev.output = format_block(ev, None)
            self.evals.append(ev)
            return 1, ev.output
        number = self.eval_count + sum(1 for e in self.evals if e.number is not None) + 1
        score, feedback, gstatus, secs = run_grader(
            self.task_cfg, commit, self.ws.store.code_git, self.sandbox
        )
        self.grader_s += secs
        best = attempts.best(self.direction, exclude=commit)
        if score is None:
            status = "timeout" if gstatus == "timeout" else "crashed"
        elif best is None:
            status = "baseline"
        else:
            status = "improved" if is_better(score, best, self.direction) else "regressed"
        record = {
            "commit_hash": commit,
            "agent_id": self.agent_id,
            "title": msg,
            "score": score,
            "status": status,
            "parent_hash": parent or None,
            "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
            "feedback": feedback,
            "metadata": {"eval_number": number, "source": "sftree", "grader_s": round(secs, 3)},
        }
        ev = EvalResult(number, commit, score, status, feedback, msg, "", secs)
        ev.output = format_block(ev, best)
        self.evals.append(ev)  # the host's record comes first; the workspace copy is for the agent
        data = (json.dumps(record, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
        try:
            safefs.write_bytes_atomic(self.ws.root, f".opencode/attempts/{commit}.json", data)
        except OSError as exc:  # a link planted in .opencode: the record is not written through it
            log.warning("attempt record for %s not written: %s", commit, exc)
            ev.output += f"(attempt record not written: {exc})\n"
        return (0 if score is not None else 1), ev.output

    def cmd_log(self, args) -> tuple[int, str]:
        attempts = view_for(self.attempts_dir)
        if not len(attempts):
            return 0, "No attempts yet.\n"
        rows = attempts.last(args.n if args.n and args.n > 0 else None)
        lines = [
            f"{len(attempts)} attempts (showing {len(rows)}; best {fmt_score(attempts.best(self.direction))})"
        ]
        for a in rows:
            lines.append(f"{a.commit_hash[:12]}  {fmt_score(a.score):>10}  {a.status:<9}  {a.title[:80]}")
        return 0, "\n".join(lines) + "\n"

    def cmd_show(self, args) -> tuple[int, str]:
        attempts = view_for(self.attempts_dir)
        hit = attempts.find(args.hash)
        a = attempts.read(hit) if hit is not None else None
        if a is None:  # none matches, or the file changed since the refresh into something unreadable
            return 1, f"coral show: no attempt matches {args.hash!r}\n"
        out = json.dumps(a, indent=2, ensure_ascii=False) + "\n"
        sha = str(a.get("commit_hash"))
        if not SHA_RE.match(sha):  # agent-written text: never an option such as --output=FILE
            return 0, out + f"\n(commit_hash {sha!r} is not a commit hash: no diff shown)\n"
        stat = self.ws.store_git(["show", "--stat", "--format=%s", "--end-of-options", sha])
        if stat:
            out += "\n" + stat + "\n"
        return 0, out

    def _list_dir(self, sub: str, read: str | None) -> tuple[int, str]:
        rel = Path(".opencode") / sub
        files = safefs.list_files(self.ws.root, rel)  # links are neither listed nor followed
        if read:
            try:
                data = safefs.read_bytes(self.ws.root, rel / read)
            except OSError:
                return 1, f"coral {sub}: no such entry {read!r}\n"
            return 0, data.decode("utf-8", "replace")
        if not files:
            return 0, f"No {sub} yet (.opencode/{sub}/ is empty).\n"
        lines = []
        for name in files:
            try:
                text = safefs.read_bytes(self.ws.root, rel / name, limit=65536).decode("utf-8", "replace")
            except OSError:
                continue
            first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
            lines.append(f".opencode/{sub}/{name}  {first[:100]}")
        return 0, "\n".join(lines) + "\n"

    def cmd_notes(self, args) -> tuple[int, str]:
        return self._list_dir("notes", args.name)

    def cmd_skills(self, args) -> tuple[int, str]:
        return self._list_dir("skills", args.name)


class _ParseError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # never exit the server thread
        raise _ParseError(message)


def _coral_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="coral", add_help=False)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    e = sub.add_parser("eval", add_help=False)
    e.add_argument("-m", "--message", nargs="+")
    lg = sub.add_parser("log", add_help=False)
    lg.add_argument("-n", type=int, default=20)
    s = sub.add_parser("show", add_help=False)
    s.add_argument("hash")
    for name in ("notes", "skills"):
        q = sub.add_parser(name, add_help=False)
        q.add_argument("name", nargs="?")
    return p


# ---- socket server and client ------------------------------------------------------------------------------
CLIENT_SCRIPT = r'''#!{python} -IS
"""coral: forwards to the sftree runner outside the sandbox (sftree.runtime.coral)."""
import json, os, socket, sys
path = os.environ.get("CORAL_SOCKET")
if not path:
    sys.exit("coral: CORAL_SOCKET is not set (not inside an sftree workspace)")
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(path)
except OSError as e:
    sys.exit(f"coral: cannot reach the sftree runner at {path}: {e}")
s.sendall(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd()}).encode() + b"\n")
buf = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    buf += chunk
reply = json.loads(buf.decode() or '{"rc": 1, "output": "coral: empty reply\\n"}')
sys.stdout.write(reply["output"])
sys.exit(reply["rc"])
'''


class CoralServer:
    """Serves one workspace's coral commands on a Unix socket in a short temp folder (paths <108 bytes)."""

    def __init__(self, ws, task_cfg: dict, *, eval_count: int, agent_id: str, sandbox: str = "auto"):
        self.runtime = CoralRuntime(ws, task_cfg, eval_count=eval_count, agent_id=agent_id, sandbox=sandbox)
        self.dir = tempdirs.make("sftree-coral-")
        self.bin_dir = self.dir / "bin"
        self.bin_dir.mkdir()
        client = self.bin_dir / "coral"
        # The running interpreter, isolated and without site: no shim (pyenv) and ~10x faster startup.
        client.write_text(CLIENT_SCRIPT.replace("{python}", sys.executable, 1))
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
        self._thread = threading.Thread(
            target=self._serve, name=f"coral-{self.runtime.ws.edge_id}", daemon=True
        )
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
                conn.settimeout(None)
                try:
                    buf = b""
                    while not buf.endswith(b"\n"):
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        buf += chunk
                    req = json.loads(buf.decode("utf-8"))
                    rc, out = self.runtime.handle([str(a) for a in req.get("argv", [])])
                except Exception as exc:  # noqa: BLE001
                    rc, out = 1, f"coral: bad request: {exc}\n"
                try:
                    conn.sendall(json.dumps({"rc": rc, "output": out}).encode("utf-8"))
                except OSError:
                    pass

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
    parser.add_argument(
        "argv", nargs=argparse.REMAINDER, help="eval -m MSG | log [-n N] | show HASH | notes | skills"
    )


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
    reply = json.loads(buf.decode() or '{"rc": 1, "output": "coral: empty reply\\n"}')
    print(reply["output"], end="")
    return int(reply["rc"])
