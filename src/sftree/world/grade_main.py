"""The grader's side of sftree's confined grading (sftree/world/grading.py): run in the grader's sandbox with the
grader's interpreter as `python -I -B grade_main.py REQUEST.json`. Standard library (and Coral, or sftree's stand-in
package) only.

With Coral (`mode: coral`) it grades exactly as Coral's grader daemon does, by calling the daemon's own
`_grade_one` on a pending attempt: the task's eval/grader.py loaded by Coral's loader, its `grade()` in the daemon's
timed worker, the bundle's feedback built by the daemon, its exceptions and timeouts turned into Coral's statuses and
texts. Only what needs a git repository or writes the run's records is replaced: the checkout is already in place,
the finalized attempt is captured instead of written, the status baseline is left to the host (which keeps the
agent's history). Without Coral (`mode: stand-in`) the same steps with sftree's stand-in TaskGrader.

Before any grader code runs: `sys.executable` (and `python`, `python3` on PATH) become sftree's forwarder, so the
programs a grader starts with Coral's helpers run as graded code in a sandbox of their own; the result goes back
on an inherited fd that nothing the grader starts inherits; the process is made non-dumpable (no same-uid process
can open its fds through /proc or trace it).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

# a JSON document in Coral's shape (this program runs under another Python and imports nothing of sftree)
Doc = dict[str, Any]


def _protect() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    except (OSError, AttributeError):
        pass


def _coral(req: Doc) -> Doc:
    import coral.grader.daemon as d
    from coral.config import CoralConfig
    from coral.types import Attempt

    coral_dir = Path(req["coral_dir"])
    captured = []
    d._add_isolated_worktree = lambda repo, commit, dest: None  # sftree placed the checkout
    d._remove_worktree = lambda repo, dest: None
    d._repo_dir = lambda cd: Path(cd).parent
    d.write_attempt = lambda cd, attempt: captured.append(attempt)
    d.increment_eval_count = lambda cd: 0
    d.get_agent_attempts = lambda cd, agent: []  # the host decides improved/baseline/regressed
    if all(hasattr(d, n) for n in ("_run_grader_with_timeout", "_grader_worker", "_TIMEOUT_GRACE_SECONDS")):
        d._run_grader_with_timeout = _read_while_it_runs(d, d._run_grader_with_timeout)
    config_path = coral_dir / "config.yaml"
    config = CoralConfig.from_yaml(config_path)
    attempt = Attempt(
        commit_hash=req["commit"],
        agent_id=req["agent_id"],
        title=req.get("title", ""),
        score=None,
        status="pending",
        parent_hash=None,
        timestamp=datetime.now(UTC).isoformat(),
        metadata={"budget_class": "tune"} if req.get("tune") else {},
    )
    fin = d._grade_one(attempt, config_path, coral_dir, config)
    status = fin.status if fin.status in ("crashed", "timeout") else "scored"
    if fin.score is None and status == "scored":
        status = "crashed"
    return {"score": fin.score, "status": status, "feedback": fin.feedback, "metadata": fin.metadata}


# Coral's grader runner (`_run_grader_with_timeout`): Coral ships no type information, so its values are Any
GraderRun = Callable[[Path, Path, str, list[Any], float], Any]


def _read_while_it_runs(d: ModuleType, coral_run: GraderRun) -> GraderRun:
    """Coral's `_run_grader_with_timeout` (the daemon's timed worker) with its result queue read while the
    worker runs. Coral joins the worker before reading it: a result larger than the queue's pipe (64 KiB; a long
    exception text of the graded program in the feedback is enough) holds the worker until Coral's hard kill,
    and the eval reads as a timeout (docs/security.md, "Bounds"). All else is Coral's: its worker, its
    deadline, its texts."""
    import multiprocessing
    import queue

    from coral.config import CoralConfig

    def run(config_path: Path, coral_dir: Path, codebase_path: str, tasks: list[Any], timeout: float) -> Any:
        config = CoralConfig.from_yaml(config_path)
        if config.grader.entrypoint or timeout <= 0:
            return coral_run(config_path, coral_dir, codebase_path, tasks, timeout)
        deadline = time.monotonic() + timeout + d._TIMEOUT_GRACE_SECONDS
        result_queue: multiprocessing.Queue[tuple[Any, ...]] = multiprocessing.Queue()
        proc = multiprocessing.Process(
            target=d._grader_worker, args=(config_path, coral_dir, codebase_path, tasks, result_queue)
        )
        item = None
        try:
            proc.start()
            while item is None and time.monotonic() < deadline:
                try:
                    item = result_queue.get(timeout=max(0.01, min(0.2, deadline - time.monotonic())))
                except queue.Empty:
                    if not proc.is_alive():  # it exited: what it put is in the pipe by now
                        try:
                            item = result_queue.get(timeout=0.2)
                        except queue.Empty:
                            pass
                        break
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
                raise TimeoutError(
                    f"Grader exceeded {timeout}s + {d._TIMEOUT_GRACE_SECONDS}s grace and was killed"
                )
            if item is None:
                raise RuntimeError("Grader process exited without returning a result")
            status, *payload = item
            if status == "ok":
                return payload[0]
            exc, tb_str = payload
            raise RuntimeError(f"Grader failed: {exc}\n{tb_str}")
        finally:
            result_queue.close()
            result_queue.join_thread()
            proc.close()

    return run


def _standin(req: Doc) -> Doc:
    import importlib.util

    from coral.grader import TaskGrader
    from coral.types import ScoreBundle, Task

    coral_dir = Path(req["coral_dir"])
    cls = "tune" if req.get("tune") else "real"
    task = Task(
        id=req["task"],
        name=req["task"],
        description="",
        metadata={"budget_class": cls, "agent_id": req["agent_id"], "commit_hash": req["commit"]},
    )
    timeout = req.get("timeout") or None
    if req.get("entrypoint") and not req.get("in_worker"):
        return _standin_packaged(req, cls)
    try:
        if req.get("entrypoint"):  # the packaged form, in the grader venv's worker
            mod_path, _, name = req["entrypoint"].rpartition(":")
            gcls = getattr(importlib.import_module(mod_path), name, None)
            if not isinstance(gcls, type) or not issubclass(gcls, TaskGrader):
                raise TypeError(f"{req['entrypoint']} must resolve to a TaskGrader subclass, got {gcls!r}")
        else:
            path = coral_dir / "private" / "eval" / "grader.py"
            spec = importlib.util.spec_from_file_location("task_grader", str(path))
            if spec is None or spec.loader is None:
                raise TypeError(f"{path} cannot be loaded as a module")
            mod = importlib.util.module_from_spec(spec)
            sys.modules["task_grader"] = mod
            spec.loader.exec_module(mod)
            gcls = getattr(mod, "Grader", None)
            if gcls is None or not issubclass(gcls, TaskGrader):
                raise TypeError("eval/grader.py must define `Grader`, a TaskGrader subclass")
        grader = gcls(config=SimpleNamespace(args=req.get("args") or {}, timeout=timeout))
        grader.private_dir = str(coral_dir / "private")
        grader.codebase_path = req["checkout"]
        grader.tasks = [task]
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["v"] = grader.evaluate()
            except BaseException as exc:  # noqa: BLE001 - reported as the grader's failure
                box["e"] = exc

        t = threading.Thread(target=work, daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            return {
                "score": None,
                "status": "timeout",
                "feedback": f"grading took longer than {timeout} s",
                "metadata": {"budget_class": "grader_error"},
            }
        if "e" in box:
            raise box["e"]
        result = box["v"]
        if not isinstance(result, ScoreBundle):
            result = ScoreBundle(scores={}, aggregated=float(result))
    except Exception as exc:  # noqa: BLE001
        return {
            "score": None,
            "status": "crashed",
            "feedback": f"the grader failed: {exc}",
            "metadata": {"budget_class": "grader_error"},
        }
    parts = [result.feedback] if result.feedback else []
    parts += [f"{n}: {s.explanation}" for n, s in (result.scores or {}).items() if s.explanation]
    score = result.aggregated
    meta = dict(result.metadata or {})
    meta["budget_class"] = cls
    return {
        "score": score,
        "status": "scored" if score is not None else "crashed",
        "feedback": "\n".join(parts),
        "metadata": meta,
    }


def _standin_packaged(req: Doc, cls: str) -> Doc:
    """The stand-in's SubprocessGrader: the same grading in a worker on the grader venv's Python (where the task's
    package and the stand-in `coral` are installed), JSON in on stdin, out on stdout; its timeout is the grader's."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    script = (
        f"import sys, json; sys.path.append({here!r}); import grade_main as g; "
        "r = json.loads(sys.stdin.read()); r['in_worker'] = True; "
        "sys.stdout.write('\\n' + json.dumps(g._standin(r), default=str))"
    )
    timeout = req.get("timeout") or None
    try:
        proc = subprocess.run(
            [f"{req['grader_venv']}/bin/python", "-c", script],
            input=json.dumps(req),
            capture_output=True,
            text=True,
            timeout=timeout + 5 if timeout else None,
        )
    except subprocess.TimeoutExpired:
        return {
            "score": None,
            "status": "timeout",
            "feedback": f"grading took longer than {timeout} s",
            "metadata": {"budget_class": "grader_error"},
        }
    try:
        result: Doc = json.loads(proc.stdout.strip().splitlines()[-1])
        return result
    except (ValueError, IndexError):
        return {
            "score": None,
            "status": "crashed",
            "feedback": f"the grader worker failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}",
            "metadata": {"budget_class": "grader_error"},
        }


def main() -> None:
    req = json.loads(Path(sys.argv[1]).read_text())
    fd = int(req["result_fd"])
    os.set_inheritable(fd, False)
    out = os.fdopen(fd, "w")
    _protect()
    sys.path.insert(0, req["coral_root"])
    real = sys.executable
    import multiprocessing

    multiprocessing.set_executable(real)  # a spawned grader worker is the grader, not graded code
    sys.executable = req["forwarder"]
    os.environ["PATH"] = req["forwarder_dir"] + ":" + os.environ.get("PATH", "/usr/bin:/bin")
    if req.get(
        "site"
    ):  # a packaged grader's worker (another process) gets the forwarder as sys.executable too
        os.environ["PYTHONPATH"] = req["site"]
        os.environ["SFTREE_FORWARDER"] = req["forwarder"]
    t0 = time.monotonic()
    try:
        result = _coral(req) if req["mode"] == "coral" else _standin(req)
    except BaseException as exc:  # noqa: BLE001 - the host records it as a crash of the grading
        result = {
            "score": None,
            "status": "crashed",
            "feedback": f"grading failed: {exc}",
            "metadata": {},
            "traceback": traceback.format_exc()[-4000:],
        }
    result["grader_s"] = time.monotonic() - t0
    cap = int(req.get("feedback_cap") or 0)
    if cap and isinstance(result.get("feedback"), str):  # graded code's text: the host keeps no more anyway
        result["feedback"] = result["feedback"][:cap]
    score = result.get("score")
    if score is not None:
        try:
            result["score"] = float(score)
        except (TypeError, ValueError):
            result.update(
                score=None, status="crashed", feedback=f"the grader's score {score!r} is not a number"
            )
    out.write(json.dumps(result, default=str))
    out.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
