"""Grade a commit with a Coral task's own `TaskGrader`, confined (docs/security.md, "Grading a Coral task").

    r = grade(spec, code_dir, commit=sha, install=install, sandbox=settings.agent.sandbox)
    r.score, r.status ("scored" | "crashed" | "timeout"), r.feedback, r.metadata, r.seconds

Two sandboxes, two uids, one channel each way:

- **The grader** (the task's eval/grader.py, trusted) runs in Coral's interpreter (or sftree's, with the stand-in
  TaskGrader) in a bubblewrap sandbox laid out as Coral's daemon lays it out, at the agent's `run_dir`:
  `<run_dir>/.coral/config.yaml` and `private/eval/` read-only, the copy to grade at
  `private/grader_checkouts/<commit>` and `public/` (eval logs) writable; nothing else of the host, no network.
  It is started by `grade_main.py`, which writes the result to a pipe it inherited, marked close-on-exec, in a
  non-dumpable process.
- **The graded program**: every command the grader starts with `sys.executable` or `python`/`python3` (Coral's
  `get_python_command`, `run_program`, `run_script`, the subprocess calls of the example graders) is sftree's
  forwarder, which asks the host over a Unix socket to run it in a second sandbox, as another uid, in another pid
  namespace, where only the code copy (at the same path) and the task files listed in `graded_can_read` exist,
  and hands back its stdout, stderr and exit code. It never sees the grader, the eval folder, the config or the
  result pipe, and cannot signal the grader.

The host reads the score only from that pipe. A grader that trusts what the graded program prints (Coral's
circle_packing does) can still be told a score by it: that is the task's grader, not the channel
(docs/security.md says what that means).
"""

from __future__ import annotations

import base64
import errno
import functools
import json
import logging
import math
import os
import select
import shutil
import socket
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias, TypedDict

import yaml

from sftree.jsontypes import CoralDoc
from sftree.runtime import remove, tempdirs
from sftree.runtime.bounded import Capped
from sftree.runtime.diskquota import DiskQuota, grade_quota
from sftree.runtime.folderreader import Quota, QuotaExceeded, usage
from sftree.runtime.procs import GroupResult, run_group
from sftree.runtime.sandbox import UIDS, Limits, bwrap_argv, resolve_mode, wait_gone, wrap_limits
from sftree.runtime.unixsock import Listener, read_request
from sftree.settings import AgentSettings, schema_defaults
from sftree.world import grader_env
from sftree.world.locate import CoralInstall
from sftree.world.task import TaskSpec

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
GRADER_LIMITS = Limits(nproc=256, data_mb=8192, fsize_mb=1024)
GRADED_LIMITS = Limits(nproc=64, data_mb=4096, fsize_mb=256)
CTL = (
    "/tmp/.sftree-grade"  # inside the grader's sandbox: grade_main.py, the forwarder, the request (read-only)
)
SOCK = "/tmp/.sftree-grade-sock"
GRACE_S = 30 + 15  # Coral's daemon kills its worker at timeout + 30 s; sftree stops the grader a little later
NO_LIMIT_S = 6 * 3600  # grader.timeout 0 (no limit in Coral): the host still stops it
FEEDBACK_CAP = 16000
# One request from the graded sandbox's forwarder (argv, cwd, env, the program's stdin in base64): whatever in
# that sandbox connects is graded code, so a request is bounded (unixsock.read_request).
GRADED_REQUEST_MAX = 64 << 20
OUTPUT_CAP = 16 * 1024 * 1024
RESULT_MAX = 4 << 20  # the grader's result (JSON, its feedback already cut to FEEDBACK_CAP by grade_main.py)
# Everything one grading writes (the copy, what the graded programs write there and in their /tmp, the grader's
# /tmp): a tmpfs of this size as root (config `agent.quota.grade_mib`, `grade_inodes`; docs/security.md), the
# schema's where a grading is given none.
GRADE_QUOTA = grade_quota(schema_defaults(AgentSettings).quota)

FORWARDER = r'''#!{python} -I
"""sftree: runs this command as graded code in its own sandbox, outside the grader's (sftree/world/grading.py)."""
import base64, json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect({sock!r})
try:
    data = b"" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
except (OSError, ValueError):
    data = b""
req = {{"argv0": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "cwd": os.getcwd(),
        "stdin": base64.b64encode(data).decode()}}
s.sendall(json.dumps(req).encode() + b"\n")
buf = bytearray()
while True:
    chunk = s.recv(1 << 20)
    if not chunk:
        break
    buf += chunk
try:
    rep = json.loads(buf)
except ValueError:
    sys.stderr.write("sftree: the graded program's runner gave no answer\n")
    os._exit(125)
for fd, key in ((1, "stdout"), (2, "stderr")):
    view = memoryview(base64.b64decode(rep[key]))
    while view:
        view = view[os.write(fd, view):]
os._exit(rep["rc"])
'''


@dataclass
class GradeResult:
    score: float | None
    status: str  # scored | crashed | timeout
    feedback: str
    metadata: CoralDoc = field(default_factory=dict)
    seconds: float = 0.0
    sandbox: str = "bwrap"
    runs: int = 0  # graded programs the grader started

    @property
    def budget_class(self) -> str:
        cls = (self.metadata or {}).get("budget_class")
        return cls if cls in ("real", "grader_error", "tune") else "real"


def _open_tree(path: Path) -> None:
    """Both sandbox uids may read and write the shared copy (it is private to this grading)."""
    for root, _dirs, files in os.walk(path):
        os.chmod(root, 0o777)
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                mode = os.lstat(p).st_mode
                os.chmod(p, 0o666 | (0o111 if mode & stat.S_IXUSR else 0))


class _TmpArgs(TypedDict, total=False):
    """A sandbox's /tmp, as bwrap_argv takes it: a folder of the grading's tmpfs, or a tmpfs of its own."""

    tmp_bytes: int
    tmp_inodes: int
    tmp_dir: Path


# the n-th graded program's command line, working folder, environment and /tmp folder, from its request
ArgvFor: TypeAlias = Callable[[CoralDoc, int], tuple[list[str], str, dict[str, str], Path | None]]


class _Runner:
    """The host's end of the forwarder: runs each graded command in its own sandbox until `stop()`."""

    def __init__(self, sock_path: Path, argv_for: ArgvFor, deadline: float) -> None:
        self.argv_for = argv_for
        self.deadline = deadline
        self.runs = 0
        self._listener = Listener(
            sock_path, self._one, name="sftree-graded", backlog=16, threaded=True, mode=0o777
        )

    def _one(self, conn: socket.socket) -> None:
        scratch = None
        with conn:
            try:
                req = json.loads(read_request(conn, GRADED_REQUEST_MAX, 30))
                self.runs += 1
                argv, cwd, env, scratch = self.argv_for(req, self.runs)
                left = max(1.0, self.deadline - time.monotonic())
                stdin = base64.b64decode(req.get("stdin") or "")
                res = run_group(
                    argv,
                    timeout=left,
                    max_output=OUTPUT_CAP,
                    input=stdin or None,
                    check=lambda: "gone" if _peer_gone(conn) else None,  # the grader's timeout killed it
                    check_every=0.2,
                    cwd=cwd,
                    env=env,
                )
                rc = 124 if res.returncode is None else res.returncode
                if rc < 0:
                    rc = 128 - rc
                reply = {
                    "rc": rc,
                    "stdout": base64.b64encode(res.stdout).decode(),
                    "stderr": base64.b64encode(res.stderr).decode(),
                }
                conn.settimeout(None)
                conn.sendall(json.dumps(reply).encode())
            except Exception as exc:  # noqa: BLE001 - the grader sees a failed program, the host a log line
                log.warning("graded program not run: %s", exc)
                try:
                    msg = base64.b64encode(f"sftree: graded program not run: {exc}\n".encode()).decode()
                    conn.sendall(json.dumps({"rc": 126, "stdout": "", "stderr": msg}).encode())
                except OSError:
                    pass
            finally:
                if scratch is not None:
                    remove.quietly(scratch)  # its /tmp: the next program starts with an empty one

    def stop(self) -> None:
        self._listener.stop()


def _peer_gone(conn: socket.socket) -> bool:
    """The forwarder that asked for the program is gone (it sends nothing more: readable means closed)."""
    try:
        r, _, _ = select.select([conn], [], [], 0)
        return bool(r) and conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _config_yaml(spec: TaskSpec) -> str:
    data = json.loads(json.dumps(spec.coral))
    g = dict(data.get("grader") or {})
    g["timeout"] = int(math.ceil(spec.timeout)) if spec.timeout else 0
    data["grader"] = g
    return yaml.safe_dump(data, sort_keys=False)


# What every sandbox's programs start with (PATH is added per sandbox).
_ENV_BASE = {"LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}


@dataclass
class _Grading:
    """What one grading holds on the host, all released by `close()` however the grading ends: its folder, the
    runner of graded programs, the result pipe's ends, the sandbox uids."""

    tmp: Path
    mode: str
    quota: DiskQuota
    t0: float
    uids: list[int | None] = field(default_factory=list)
    runner: _Runner | None = None
    r_fd: int | None = None
    w_fd: int | None = None

    @property
    def runs(self) -> int:
        """Graded programs the grader started so far."""
        return self.runner.runs if self.runner else 0

    def failed(self, why: str) -> GradeResult:
        secs = time.monotonic() - self.t0
        return GradeResult(None, "crashed", why, {"budget_class": "grader_error"}, secs, self.mode, self.runs)

    def close(self) -> None:
        if self.runner is not None:
            self.runner.stop()
        for fd in (self.r_fd, self.w_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        for uid in self.uids:
            if uid is not None:
                wait_gone(uid)
                UIDS.release(uid)
        tempdirs.remove(self.tmp)


@dataclass(frozen=True)
class _Layout:
    """Where one grading's files are, on the host (under the grading's folder) and as its sandboxes see them."""

    tmp: Path  # the grading's folder
    kernel_quota: bool  # it is a tmpfs of `quota` (as root)
    quota: DiskQuota
    cd_host: Path  # the run folder's .coral
    checkout_host: Path  # the copy to grade
    ctl: Path  # grade_main.py, the forwarder, the request
    sock_dir: Path
    confined: bool
    ctl_in: str
    cd_in: str
    checkout_in: str
    python: str  # the grader's interpreter, also the graded programs'

    @property
    def venv_in(self) -> str:
        return f"{self.cd_in}/private/grader_venv"

    @property
    def py_bin(self) -> str:
        return str(Path(self.python).parent)

    def sandbox_tmp(self, name: str, uid: int | None) -> _TmpArgs:
        """A sandbox's /tmp: a fresh folder of the grading's tmpfs, else a tmpfs of its own of the quota."""
        if not self.kernel_quota:
            return {"tmp_bytes": self.quota.bytes, "tmp_inodes": self.quota.inodes}
        d = self.tmp / name
        d.mkdir()
        if uid is not None:
            os.chown(d, uid, uid)
        os.chmod(d, 0o1777)
        return {"tmp_dir": d}


def grade(
    spec: TaskSpec,
    code_dir: str | os.PathLike[str],
    *,
    commit: str,
    install: CoralInstall | None,
    sandbox: str,
    agent_id: str = "agent-1",
    title: str = "",
    tune: bool = False,
    run_dir: str | None = None,
    quota: DiskQuota | None = None,
) -> GradeResult:
    """Grade a host-made copy of the code (`code_dir`, never the agent's workspace; it is copied again here).
    `quota`: what the whole grading may write (GRADE_QUOTA when None)."""
    if spec.kind != "coral":
        raise ValueError(f"task {spec.name}: not a Coral task (graded by its command)")
    mode = resolve_mode(sandbox)
    quota = quota or GRADE_QUOTA
    t0 = time.monotonic()
    g = _Grading(Path(tempdirs.make("sftree-grade-", quota=quota)), mode, quota, t0)
    try:
        return _grade_in(
            g, spec, code_dir, commit=commit, install=install, agent_id=agent_id, title=title, tune=tune,
            run_dir=run_dir,
        )  # fmt: skip
    finally:
        g.close()


def _grade_in(
    g: _Grading,
    spec: TaskSpec,
    code_dir: str | os.PathLike[str],
    *,
    commit: str,
    install: CoralInstall | None,
    agent_id: str,
    title: str,
    tune: bool,
    run_dir: str | None,
) -> GradeResult:
    """`grade`'s steps, in order: copy the code in, lay the control folder out, start the grader with the runner
    of graded programs beside it, read its result."""
    # As root the grading's folder is a tmpfs of `quota`: the copy, everything the graded programs write (in
    # their working folder and their /tmp) and the grader's /tmp share it; ENOSPC past it, in the writer.
    kernel_quota = tempdirs.mounted(g.tmp)
    cd_host = g.tmp / "run" / ".coral"
    checkout_host = cd_host / "private" / "grader_checkouts" / commit
    venv = grader_env.ensure(spec, install) if spec.entrypoint else None
    why = _copy_in(spec, code_dir, cd_host, checkout_host, kernel_quota, g.quota)
    if why is not None:
        return g.failed(why)
    lay = _lay_out(spec, install, g, cd_host, checkout_host, kernel_quota, commit=commit, run_dir=run_dir)
    g.r_fd, g.w_fd = os.pipe()
    _write_request(lay, spec, install, venv, g.w_fd, commit=commit, agent_id=agent_id, title=title, tune=tune)
    roots = list(install.roots) if install else []
    roots += list(venv.roots) if venv is not None else []
    limit = spec.timeout + GRACE_S if spec.timeout else NO_LIMIT_S
    deadline = time.monotonic() + limit
    g_uid = UIDS.acquire() if lay.confined else None
    s_uid = UIDS.acquire() if lay.confined else None
    g.uids = [g_uid, s_uid]
    argv_for = functools.partial(_graded_argv, lay=lay, spec=spec, roots=roots, uid=s_uid)
    g.runner = _Runner(lay.sock_dir / "run.sock", argv_for, deadline)
    argv, gcwd, genv = _grader_argv(lay, venv, roots, g_uid)
    # Without the tmpfs (not root) the grading's folder is measured while it runs, as an edge's workspace is.
    check = None if kernel_quota else functools.partial(_over_quota, g.tmp, g.quota)
    # The result pipe is read while the grader runs (a result larger than the pipe would block it until
    # killed), bounded: its write end is the grader's alone (closed here once it started).
    result = Capped(RESULT_MAX)
    hand, g.w_fd = (g.w_fd,), None
    res = run_group(
        argv,
        timeout=limit,
        cwd=gcwd,
        env=genv,
        max_output=OUTPUT_CAP,
        read_also={g.r_fd: result},
        hand_fds=hand,
        check=check,
        check_every=0.5,
    )
    return _collect(g, res, result, limit)


def _copy_in(
    spec: TaskSpec,
    code_dir: str | os.PathLike[str],
    cd_host: Path,
    checkout_host: Path,
    kernel_quota: bool,
    quota: DiskQuota,
) -> str | None:
    """Copy the task's eval folder and the code to grade in; why not when the code does not fit the grading's
    quota (any other failure raises)."""
    try:
        if spec.eval_folder.is_dir():
            shutil.copytree(spec.eval_folder, cd_host / "private" / "eval", symlinks=True)
        else:
            (cd_host / "private" / "eval").mkdir(parents=True)  # a packaged grader's task may have none
        shutil.copytree(code_dir, checkout_host, symlinks=True)
    except (OSError, shutil.Error) as exc:
        if kernel_quota and ("No space left" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC):
            return (
                f"the code to grade does not fit the grading's disk quota ({quota.bytes >> 20} MiB, "
                f"{quota.inodes} files)"
            )
        raise
    return None


def _lay_out(
    spec: TaskSpec,
    install: CoralInstall | None,
    g: _Grading,
    cd_host: Path,
    checkout_host: Path,
    kernel_quota: bool,
    *,
    commit: str,
    run_dir: str | None,
) -> _Layout:
    """The rest of the run folder as Coral's daemon lays it out (config.yaml, public/), open to both sandbox uids,
    and the control folder: grade_main.py, the stand-in (without Coral), the forwarder under each name a graded
    program is started by."""
    (cd_host / "public" / "eval_logs").mkdir(parents=True)
    (cd_host / "config.yaml").write_text(_config_yaml(spec))
    _open_tree(checkout_host)
    _open_tree(cd_host / "public")
    ctl, sock_dir = g.tmp / "ctl", g.tmp / "sock"
    (ctl / "bin").mkdir(parents=True)
    sock_dir.mkdir()
    os.chmod(sock_dir, 0o755)
    shutil.copy(HERE / "grade_main.py", ctl / "grade_main.py")
    if install is None:
        shutil.copytree(HERE / "standin_pkg", ctl / "standin", ignore=shutil.ignore_patterns("__pycache__"))
    confined = g.mode == "bwrap"
    rd = (run_dir or "/workspace/results/{task}").format(task=spec.name) if confined else str(cd_host.parent)
    ctl_in, sock_in = (CTL, SOCK) if confined else (str(ctl), str(sock_dir))
    cd_in = f"{rd}/.coral"
    checkout_in = f"{cd_in}/private/grader_checkouts/{commit}"
    python = install.python if install else sys.executable
    forwarder = FORWARDER.format(python=python, sock=f"{sock_in}/run.sock")
    names = ["python", "python3", f"python3.{sys.version_info.minor}"]
    if shutil.which("uv"):
        names.append("uv")
    for name in names:
        (ctl / "bin" / name).write_text(forwarder)
        (ctl / "bin" / name).chmod(0o755)
    return _Layout(
        tmp=g.tmp, kernel_quota=kernel_quota, quota=g.quota, cd_host=cd_host, checkout_host=checkout_host,
        ctl=ctl, sock_dir=sock_dir, confined=confined, ctl_in=ctl_in, cd_in=cd_in, checkout_in=checkout_in,
        python=python,
    )  # fmt: skip


def _write_request(
    lay: _Layout,
    spec: TaskSpec,
    install: CoralInstall | None,
    venv: grader_env.GraderVenv | None,
    w_fd: int,
    *,
    commit: str,
    agent_id: str,
    title: str,
    tune: bool,
) -> None:
    """grade_main.py's request (what to grade, how, the result pipe's descriptor), then the control folder made
    readable, never writable, to the grader."""
    req = {
        "mode": "coral" if install else "stand-in",
        "result_fd": w_fd,
        "coral_dir": lay.cd_in,
        "checkout": lay.checkout_in,
        "commit": commit,
        "agent_id": agent_id,
        "title": title,
        "tune": tune,
        "task": spec.name,
        "args": spec.args,
        "timeout": spec.timeout,
        "coral_root": install.root if install else f"{lay.ctl_in}/standin",
        "forwarder": f"{lay.ctl_in}/bin/python",
        "forwarder_dir": f"{lay.ctl_in}/bin",
        "feedback_cap": FEEDBACK_CAP,
    }
    if venv is not None:
        # Coral's SubprocessGrader (or the stand-in's worker) runs the venv's Python: its sys.executable
        # becomes the forwarder too (sitecustomize on PYTHONPATH), so what it starts is graded code.
        (lay.ctl / "site").mkdir()
        (lay.ctl / "site" / "sitecustomize.py").write_text(grader_env.SITECUSTOMIZE)
        req.update(entrypoint=spec.entrypoint, grader_venv=lay.venv_in, site=f"{lay.ctl_in}/site")
        if not lay.confined:
            (lay.cd_host / "private" / "grader_venv").symlink_to(venv.path)
    (lay.ctl / "request.json").write_text(json.dumps(req))
    for p in lay.ctl.rglob("*"):
        os.chmod(p, 0o755 if p.is_dir() or os.access(p, os.X_OK) else 0o644)
    os.chmod(lay.ctl, 0o755)


def _graded_argv(
    r: CoralDoc, n: int, *, lay: _Layout, spec: TaskSpec, roots: list[str], uid: int | None
) -> tuple[list[str], str, dict[str, str], Path | None]:
    """The n-th graded program, from its forwarder's request `r`: command line, working folder, environment and
    its /tmp folder (to remove after it; None when it has none). Confined, in its own sandbox as `uid`, where
    only the code copy (at the same path) and the task files in `graded_can_read` exist."""
    argv0 = r.get("argv0") or "python"
    exe = "uv" if argv0 == "uv" else lay.python
    cmd = [exe, *[str(a) for a in r.get("argv") or []]]
    cwd = str(r.get("cwd") or lay.checkout_in)
    if not (cwd == lay.checkout_in or cwd.startswith(lay.checkout_in + "/")):
        cwd = lay.checkout_in  # the grader's folders do not exist for the graded program
    env = {**_ENV_BASE, "PATH": f"{lay.py_bin}:/usr/local/bin:/usr/bin:/bin"}
    if not lay.confined:
        real_cwd = cwd.replace(lay.checkout_in, str(lay.checkout_host), 1)
        return wrap_limits(cmd, GRADED_LIMITS), real_cwd, env, None
    reads = [(lay.cd_host / "private" / rel, f"{lay.cd_in}/private/{rel}") for rel in spec.graded_can_read]
    tmp_of = lay.sandbox_tmp(f"tmp-graded-{n}", uid)
    argv = bwrap_argv(
        cmd,
        cwd=cwd,
        binds=[(lay.checkout_host, lay.checkout_in)],
        ro_binds=reads,
        keep_visible=roots,
        uid=uid,
        **tmp_of,
    )
    return wrap_limits(argv, GRADED_LIMITS, uid), "/", env, tmp_of.get("tmp_dir")


def _grader_argv(
    lay: _Layout, venv: grader_env.GraderVenv | None, roots: list[str], uid: int | None
) -> tuple[list[str], str, dict[str, str]]:
    """The grader's command line, working folder and environment: grade_main.py, confined in its own sandbox as
    `uid` with the run folder bound where Coral's daemon has it."""
    gcmd = [lay.python, "-I", "-B", f"{lay.ctl_in}/grade_main.py", f"{lay.ctl_in}/request.json"]
    genv = {**_ENV_BASE, "PATH": f"{lay.ctl_in}/bin:{lay.py_bin}:/usr/local/bin:/usr/bin:/bin"}
    if not lay.confined:
        return wrap_limits(gcmd, GRADER_LIMITS), str(lay.checkout_host), genv
    cd_host, cd_in = lay.cd_host, lay.cd_in
    argv = bwrap_argv(
        gcmd,
        cwd=lay.checkout_in,
        binds=[(lay.checkout_host, lay.checkout_in), (cd_host / "public", f"{cd_in}/public")],
        ro_binds=[
            (cd_host / "private" / "eval", f"{cd_in}/private/eval"),
            (cd_host / "config.yaml", f"{cd_in}/config.yaml"),
            *([(venv.path, lay.venv_in)] if venv is not None else []),
            (lay.ctl, CTL),
            (lay.sock_dir, SOCK),
        ],
        keep_visible=roots,
        uid=uid,
        **lay.sandbox_tmp("tmp-grader", uid),
    )
    return wrap_limits(argv, GRADER_LIMITS, uid), "/", genv


def _collect(g: _Grading, res: GroupResult, result: Capped, limit: float) -> GradeResult:
    """The grading's outcome as the host reads it: the score from the result pipe only, else why there is none
    (the grader timed out, was stopped, wrote too much or nothing readable); a malformed score is `crashed`."""
    secs = time.monotonic() - g.t0
    stderr = res.stderr.decode("utf-8", "replace")
    if res.timed_out:
        return GradeResult(
            None,
            "timeout",
            f"grading took longer than {limit:g} s and was stopped",
            {"budget_class": "grader_error"},
            secs,
            g.mode,
            g.runs,
        )
    if res.stopped:
        return g.failed(f"the grading was stopped: {res.stopped}")
    if result.dropped:
        return g.failed(f"the grader's result is larger than {RESULT_MAX >> 20} MiB")
    try:
        out = json.loads(result.data())
        if not isinstance(out, dict):
            raise ValueError("not an object")
    except ValueError:
        tail = stderr.strip()[-FEEDBACK_CAP // 4 :]
        return g.failed(f"the grader gave no result (exit code {res.returncode}): {tail}")
    score = out.get("score")
    status = out.get("status", "crashed")
    if score is not None and (not isinstance(score, int | float) or not math.isfinite(score)):
        score, status = None, "crashed"
    if score is None and status == "scored":
        status = "crashed"
    if status not in ("scored", "crashed", "timeout"):
        status = "crashed"
    meta = out.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    if out.get("traceback"):
        log.warning("grade_main failed: %s", out["traceback"])
    return GradeResult(
        score, status, str(out.get("feedback") or "")[:FEEDBACK_CAP], meta, secs, g.mode, g.runs
    )


def _over_quota(folder: Path, quota: DiskQuota) -> str | None:
    """Why `folder` holds more than `quota` (files, bytes), or None: the polled check where no tmpfs can be
    mounted."""
    # Depth is no disk use: not limited (folderreader.walk holds descriptors for pending folders, not per level).
    q = Quota(files=quota.inodes, bytes=quota.bytes, file_bytes=quota.bytes, depth=1 << 30)
    try:
        usage(folder, q)
    except QuotaExceeded as exc:
        return f"disk quota exceeded: {exc}"
    except OSError:
        return None
    return None
