"""Run graded code safely from a grader: the solution's function runs in its own sandboxed process and only its
return value comes back, over a pipe the grader owns.

    from sftree.runtime.gradebox import run_solution
    res = run_solution(code_dir, "pack", calls=[()], timeout=60)      # pack() once
    if not res.ok: ...res.error...                                     # raised, exited, timed out, bad output
    circles = res.values[0]                                            # the return value (JSON types)

Why (docs/security.md): graded code is hostile. Imported into the grader it could print the grader's score
line itself, read the grader or the task folder, or reach the network. Here it runs in a child process: under
bubblewrap (`SFTREE_SANDBOX`, set by `coral eval` to the run's `agent.sandbox`; `auto` when unset) it sees only
its own copy of the code (in its /tmp, a tmpfs of GRADED_TMP bytes and, as root, TMP_INODES files) and the toolchain, has no network, runs as an unprivileged uid without capabilities, under
a timeout and memory and process limits. Its prints go to stderr (kept for feedback); the grader computes the
score itself from the returned value, so nothing the code prints or returns can set the score directly.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sftree.runtime import tempdirs
from sftree.runtime.procs import run_group
from sftree.runtime.sandbox import Limits, bwrap_argv, resolve_mode, sandbox_uid, wrap_limits

GRADED_LIMITS = Limits(nproc=64, data_mb=4096, fsize_mb=256)
GRADED_TMP = 512 << 20  # the sandbox's /tmp (a tmpfs), which holds the copy of the code: its disk quota
TMP_INODES = 65536  # its files, as root (the grader's own: it runs with no config, so not agent.quota's)
REQUEST_MOUNT = "/tmp/.sftree-request.json"
SOURCE_MOUNT = "/tmp/.sftree-source"
COPY = "/tmp/code"
MAX_RESULT = 64 * 1024 * 1024

# Runs in the child (python -I: no PYTHONPATH, no user site, nothing of sftree). The result goes to a private
# copy of fd 1; the solution's own prints (print, or os.write(1, ...)) land on stderr.
RUNNER = r"""
import json, os, sys, traceback
res = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
def enc(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not a plain value (numbers, lists, dicts)")
try:
    with open(sys.argv[1]) as fh:
        req = json.load(fh)
    if req.get("copy_from"):  # in the sandbox: a private copy, in its size-capped /tmp
        import shutil
        shutil.copytree(req["copy_from"], req["code_dir"], symlinks=True)
        os.chdir(req["code_dir"])
    sys.path.insert(0, req["code_dir"])
    import importlib
    mod = importlib.import_module(req["module"])
    fn = getattr(mod, req["func"])
    out = {"ok": True, "values": [fn(*args) for args in req["calls"]]}
    text = json.dumps(out, default=enc)
except BaseException:
    text = json.dumps({"ok": False, "error": "".join(traceback.format_exc().splitlines(True)[-8:])})
res.write(text)
res.flush()
os._exit(0)
"""


@dataclass
class SolutionRun:
    ok: bool
    values: list[Any] = field(default_factory=list)
    error: str = ""  # why there are no values: the traceback, the exit, the timeout
    stderr: str = ""  # what the solution printed (tail)
    timed_out: bool = False
    sandbox: str = "none"


def run_solution(
    code_dir: str | os.PathLike[str],
    func: str,
    calls: Sequence[Sequence[object]] = ((),),
    *,
    module: str = "solution",
    timeout: float = 60.0,
    limits: Limits = GRADED_LIMITS,
    sandbox: str | None = None,
) -> SolutionRun:
    """Call `module.func(*args)` for each args in `calls` in one sandboxed child; never raises for what the
    graded code does (an InputError when `auto`/`bwrap` is asked for and bubblewrap cannot isolate)."""
    mode = resolve_mode(sandbox or os.environ.get("SFTREE_SANDBOX") or "auto")
    code_dir = Path(code_dir).resolve()
    sandboxed = mode == "bwrap"
    req = {"code_dir": str(code_dir), "module": module, "func": func, "calls": list(calls)}
    if sandboxed:
        # The child copies the code into its own /tmp, a tmpfs of GRADED_TMP bytes (the kernel's disk quota),
        # and works there: it changes nothing the grader reads afterwards, and leaves nothing on the host.
        req.update(code_dir=COPY, copy_from=SOURCE_MOUNT)
    with tempdirs.temporary(
        "sftree-gradebox-"
    ) as tmp:  # removed by the one remover (unsandboxed, it is the cwd)
        request = Path(tmp) / "request.json"
        request.write_text(json.dumps(req))
        request.chmod(0o644)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp"}
        argv = [sys.executable, "-I", "-B", "-c", RUNNER]  # -B: no __pycache__ left in the graded folder
        if sandboxed:
            uid = sandbox_uid(os.getpid() % 997)
            argv = bwrap_argv(
                [*argv, REQUEST_MOUNT],
                cwd="/tmp",
                ro_binds=[(code_dir, SOURCE_MOUNT), (request, REQUEST_MOUNT)],
                uid=uid,
                tmp_bytes=GRADED_TMP,
                tmp_inodes=TMP_INODES,
            )
            argv = wrap_limits(argv, limits, uid)
        else:
            argv = wrap_limits([*argv, str(request)], limits)
        res = run_group(argv, timeout=timeout, cwd=tmp, env=env, max_output=MAX_RESULT)
    stderr = res.stderr.decode("utf-8", "replace")[-4000:]
    if res.timed_out:
        return SolutionRun(
            False,
            error=f"solution took longer than {timeout:g} s",
            stderr=stderr,
            timed_out=True,
            sandbox=mode,
        )
    try:
        out = json.loads(res.stdout.decode("utf-8"))
        if not isinstance(out, dict) or not isinstance(out.get("ok"), bool):
            raise ValueError("not a result object")
    except ValueError:
        why = f"exited with code {res.returncode}" if res.returncode else "exited"
        return SolutionRun(
            False,
            error=f"solution {why} without returning a value\n{stderr[-2000:]}",
            stderr=stderr,
            sandbox=mode,
        )
    if not out["ok"]:
        return SolutionRun(False, error=str(out.get("error", "")), stderr=stderr, sandbox=mode)
    values = out.get("values")
    if not isinstance(values, list) or len(values) != len(list(calls)):
        return SolutionRun(False, error="solution returned a malformed result", stderr=stderr, sandbox=mode)
    return SolutionRun(True, values=values, stderr=stderr, sandbox=mode)
