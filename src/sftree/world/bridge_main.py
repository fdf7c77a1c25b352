"""The Coral side of sftree's bridge: run in the user's Coral interpreter (`python -I bridge_main.py CORAL_ROOT`),
it answers one JSON request per stdin line with one JSON line on stdout, by calling Coral's own code. It imports
only Coral and the standard library (and nothing of sftree), so the texts are those of the installed Coral, with
whatever changes its user made.

Requests: {"op": NAME, ...}; answers: {"ok": true, "value": ...} or {"ok": false, "error": "..."}.
Ops (each documented on its function below): hello, config_yaml, coral_md, start_prompt, opencode_json,
heartbeat_actions, turn_prompt, restart_prompt, eval_output, parse_eval.

It writes only into temporary folders it makes itself; it never reads a file an agent wrote.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (annotations only: the bridge imports what it runs)
    import argparse
    from collections.abc import Sequence

# The prefix of the folders the bridge makes, with its pid: a bridge killed with -9 leaves them behind, and the next
# run's sweep (sftree's runtime/tempdirs.py, whose PREFIXES name this one) removes those whose owner is gone.
TEMP_PREFIX = "sftree-bridge-"


def _temporary() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-")


# a JSON document in Coral's shape (this program runs under another Python and imports nothing of sftree)
Doc = dict[str, Any]


def _config(data: Doc, agents: int | None = None) -> Any:  # Coral's CoralConfig
    """Coral's config of a task.yaml as sftree's Teacher meets it: an OpenCode agent, `agents` agents in the run."""
    from coral.config import CoralConfig

    data = copy.deepcopy(data)
    ag = dict(data.get("agents") or {})
    if ag.get("runtime") != "opencode":
        ag["runtime"] = "opencode"
        ag.pop("model", None)  # Coral fills the runtime's default model
    if agents is not None:
        ag["count"] = int(agents)
        ag.pop("assignments", None)
    data["agents"] = ag
    return CoralConfig.from_dict(data)


def op_hello(req: Doc) -> Any:
    import coral

    return {"version": getattr(coral, "__version__", "?"), "package": os.path.dirname(coral.__file__)}


def op_config_yaml(req: Doc) -> Any:
    """`.coral/config.yaml` as `coral start` writes it (`CoralConfig.to_yaml`)."""
    cfg = _config(req["task"], req.get("agents"))
    with _temporary() as tmp:
        path = Path(tmp) / "config.yaml"
        cfg.to_yaml(path)
        return path.read_text()


def op_coral_md(req: Doc) -> Any:
    """CORAL.md for the agent: `generate_coral_md(config, agent_id, single_agent, shared_dir)`."""
    from coral.template.coral_md import generate_coral_md

    cfg = _config(req["task"], req.get("agents"))
    return generate_coral_md(
        cfg,
        req["agent_id"],
        single_agent=bool(req["single_agent"]),
        shared_dir=req.get("shared_dir", ".opencode"),
    )


class _Popen:
    """Stands in for subprocess.Popen inside a runtime's start(): records the command, starts nothing."""

    last: list[str] | None = None

    def __init__(self, cmd: Sequence[str], *a: object, **k: object) -> None:
        type(self).last = list(cmd)
        self.pid = -1  # never a process (a handle's clean-up signals the group of a live pid)
        self.returncode = 0
        self.stdout = self.stderr = None

    def poll(self) -> int:
        return 0  # "exited": nothing of a handle's clean-up signals anything

    def wait(self, timeout: float | None = None) -> int:
        return 0


def op_start_prompt(req: Doc) -> Any:
    """The prompt Coral's OpenCode runtime starts (or, with `resume`, resumes) a session with when the manager
    gives none: OpenCodeRuntime.start is called in a scratch worktree with Popen recorded, not run."""
    import coral.agent.builtin.opencode as oc

    with _temporary() as tmp:
        wt = Path(tmp) / "agents" / req["agent_id"]
        wt.mkdir(parents=True)
        (wt / ".coral_agent_id").write_text(req["agent_id"])
        saved = oc.subprocess.Popen
        oc.subprocess.Popen = _Popen
        try:
            handle = oc.OpenCodeRuntime().start(
                worktree_path=wt,
                coral_md_path=wt / "AGENTS.md",
                log_dir=Path(tmp) / ".coral" / "public" / "logs",
                resume_session_id="session" if req.get("resume") else None,
            )
        finally:
            oc.subprocess.Popen = saved
        handle.process = None
        for f in (getattr(handle, "_log_file", None), getattr(handle, "err_file", None)):
            if f is not None:
                f.close()
        if _Popen.last is None:
            raise RuntimeError("Coral's OpenCode runtime started no command")
        return _Popen.last[-1]


def op_opencode_json(req: Doc) -> Any:
    """`.opencode/opencode.json` as Coral's `setup_opencode_settings` writes it for coral_dir `req["coral_dir"]`."""
    from coral.workspace.worktree import setup_opencode_settings

    with _temporary() as tmp:
        setup_opencode_settings(Path(tmp), Path(req["coral_dir"]), research=bool(req.get("research", True)))
        return (Path(tmp) / ".opencode" / "opencode.json").read_text()


def op_default_model(req: Doc) -> Any:
    """The model Coral's config fills in for `req["runtime"]` when task.yaml names none (null when Coral has none)."""
    from coral.agent.registry import default_model_for_runtime

    return default_model_for_runtime(str(req["runtime"]))


def _coral_dir(tmp: str) -> Path:
    d = Path(tmp) / ".coral"
    for sub in ("attempts", "heartbeat"):
        (d / "public" / sub).mkdir(parents=True, exist_ok=True)
    return d


def op_heartbeat_actions(req: Doc) -> Any:
    """The heartbeat actions the manager reads for the agent: the run's own files (`local`, `global`: the lists of
    `.coral/public/heartbeat/<agent>.json` and `_global.json`, null when absent), else what the manager seeds from
    the config (`default_local_actions` / `default_global_actions`), through Coral's own readers and writers."""
    from coral.hub import heartbeat as hb

    cfg = _config(req["task"], req.get("agents"))
    with _temporary() as tmp:
        cd = _coral_dir(tmp)
        aid = req["agent_id"]
        if req.get("global") is not None:
            (cd / "public" / "heartbeat" / "_global.json").write_text(json.dumps({"actions": req["global"]}))
        if req.get("local") is not None:
            (cd / "public" / "heartbeat" / f"{aid}.json").write_text(json.dumps({"actions": req["local"]}))
        if not hb.read_global_heartbeat(cd):
            hb.write_global_heartbeat(cd, hb.default_global_actions(cfg))
        if not hb.read_agent_heartbeat(cd, aid):
            hb.write_agent_heartbeat(cd, aid, hb.default_local_actions(cfg))
        return {"local": hb.read_agent_heartbeat(cd, aid), "global": hb.read_global_heartbeat(cd)}


class _Handle:
    def __init__(self, agent_id: str, log_path: Path) -> None:
        self.agent_id = agent_id
        self.alive = True
        self.log_path = log_path
        self.process = None


_TURN_MARK = "_sftree_turn"  # an always-firing action without a prompt: the header comes even when none fires


def op_turn_prompt(req: Doc) -> Any:
    """The prompt Coral's manager interrupts the agent with after one finalized attempt: `## Eval #N Results` and the
    heartbeat prompts that fire. `AgentManager.monitor_loop` itself runs one tick over a scratch `.coral` holding the
    attempt, the heartbeat files and `eval_count`, with the manager's per-agent counters set from `counters`
    (agent_evals, real_best, since_improvement); the interrupt is recorded, not made. Returns the prompt, the
    names of the actions that fired and the manager's counters after the attempt."""
    from coral.agent.manager import AgentManager

    cfg = _config(req["task"], req.get("agents"))
    cfg.agents.timeout = 0  # no stall watchdog in the one tick
    aid = req["agent_id"]
    attempt = dict(req["attempt"])
    attempt["agent_id"] = aid
    with _temporary() as tmp:
        cd = _coral_dir(tmp)
        local = list(req["actions"]["local"]) + [{"name": _TURN_MARK, "every": 1, "prompt": ""}]
        (cd / "public" / "heartbeat" / f"{aid}.json").write_text(json.dumps({"actions": local}))
        (cd / "public" / "heartbeat" / "_global.json").write_text(
            json.dumps({"actions": req["actions"]["global"]})
        )
        (cd / "public" / "eval_count").write_text(str(int(req["global_evals"])))
        log = Path(tmp) / "agent.log"
        log.write_text("")
        m = AgentManager(cfg)
        m.paths = SimpleNamespace(coral_dir=cd)
        m.handles = [_Handle(aid, log)]
        c = req["counters"]
        m._agent_eval_counts = {aid: int(c["agent_evals"])}
        m._agent_best_scores = {} if c.get("real_best") is None else {aid: c["real_best"]}
        m._agent_evals_since_improvement = {aid: int(c["since_improvement"])}
        name = (str(attempt.get("commit_hash") or "") or "unknown").replace("/", "_")
        (cd / "public" / "attempts" / f"{name}.json").write_text(json.dumps(attempt, indent=2))
        captured: list[tuple[str, str | None]] = []
        calls = [0]
        real_seen = m._get_seen_attempts

        def seen() -> set[
            str
        ]:  # the manager's startup scan finds nothing: the attempt is new at its first tick
            calls[0] += 1
            return set() if calls[0] == 1 else real_seen()

        def interrupt(idx: int, prompt: str, prompt_source: str | None = None) -> Any:  # a handle
            captured.append((prompt, prompt_source))
            m._running = False
            return m.handles[idx]

        m._get_seen_attempts = seen
        m._interrupt_and_resume = interrupt
        m._write_agent_pids = lambda: None
        m._stop_event.set()  # the loop ends at its first wait
        m._running = True
        saved_signal = signal.signal
        signal.signal = lambda *a, **k: None
        try:
            m.monitor_loop(check_interval=0)
        finally:
            signal.signal = saved_signal
        prompt, source = captured[0] if captured else (None, None)
        fired = [n.strip() for n in (source or "").removeprefix("heartbeat:").split(",") if n.strip()]
        return {
            "prompt": prompt,
            "fired": [n for n in fired if n != _TURN_MARK],
            "counters": {
                "agent_evals": m._agent_eval_counts.get(aid, 0),
                "real_best": m._agent_best_scores.get(aid),
                "since_improvement": m._agent_evals_since_improvement.get(aid, 0),
            },
        }


def op_restart_prompt(req: Doc) -> Any:
    """The prompt the manager restarts a stopped agent with: `_build_score_prompt(latest attempt, eval_count)`; null
    when the agent has no attempt (the runtime's own resume prompt is used then: start_prompt with resume)."""
    from coral.agent.manager import AgentManager

    if not req.get("attempt"):
        return None
    m = SimpleNamespace(config=_config(req["task"], req.get("agents")))
    return AgentManager._build_score_prompt(m, dict(req["attempt"]), int(req["global_evals"]))


_NOTHING: list[str] = []


def _nothing_to_commit() -> str:
    """Coral's own refusal of an eval with no change, from `_git_add_and_commit` on a scratch repository."""
    if not _NOTHING:
        from coral.hooks.post_commit import _git_add_and_commit

        with _temporary() as tmp:
            env = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
            subprocess.run(["git", "init", "-q", tmp], check=True, env={**os.environ, **env})
            saved = os.environ.copy()
            os.environ.update(env)
            try:
                _git_add_and_commit("x", tmp)
                _NOTHING.append("")
            except RuntimeError as exc:
                _NOTHING.append(str(exc))
            finally:
                os.environ.clear()
                os.environ.update(saved)
    return _NOTHING[0]


def _run_cli(argv: list[str], patch: Doc) -> Doc:
    """Run `coral.cli.main()` on argv with some command functions replaced; its stdout, stderr and exit code."""
    import coral.cli.eval as ev

    out, err = io.StringIO(), io.StringIO()
    saved = {k: getattr(ev, k) for k in patch}
    saved_argv = sys.argv
    rc = 0
    try:
        for k, v in patch.items():
            setattr(ev, k, v)
        sys.argv = ["coral", *argv]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                from coral.cli import main

                main()
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved_argv
        for k, v in saved.items():
            setattr(ev, k, v)
    return {"stdout": out.getvalue(), "stderr": err.getvalue(), "rc": rc}


def op_parse_eval(req: Doc) -> Any:
    """Coral's own parsing of `coral eval ...` (its argparse, errors and exit codes): the arguments it would act on,
    or what it printed when it refused them."""
    got: Doc = {}

    def capture(args: argparse.Namespace) -> None:
        got.update(
            {
                k: v
                for k, v in vars(args).items()
                if k in ("message", "agent", "workdir", "wait", "timeout", "tune")
            }
        )

    res = _run_cli(["eval", *req["argv"]], {"cmd_eval": capture})
    res["args"] = got or None
    return res


def op_eval_output(req: Doc) -> Any:
    """What `coral eval` prints and its exit code, from Coral's own `cmd_eval` and `_print_attempt_result`, for
    the host's finalized attempt (`attempt`, with `eval_count` = the `#N`), or for an eval refused with `error`:
    "nothing_to_commit" (Coral's own message) or any other text (`Error: ...`, exit 1). `header` "CORAL Wait"
    gives `coral wait`'s block."""
    from coral.types import Attempt

    def submit(**kw: object) -> Any:  # Coral's Attempt
        if req.get("error"):
            msg = _nothing_to_commit() if req["error"] == "nothing_to_commit" else req["error"]
            raise RuntimeError(msg)
        a = Attempt.from_dict(req["attempt"])
        if req.get("eval_count") is not None:
            a._eval_count = int(req["eval_count"])
        return a

    if req.get("header") == "CORAL Wait":
        from coral.cli.eval import _print_attempt_result
        from coral.types import Attempt as _A

        out = io.StringIO()
        a = _A.from_dict(req["attempt"])
        if req.get("eval_count") is not None:
            a._eval_count = int(req["eval_count"])
        with contextlib.redirect_stdout(out):
            _print_attempt_result(a, header="CORAL Wait")
        return {"stdout": out.getvalue(), "stderr": "", "rc": 0}
    import coral.hooks.post_commit as pc

    saved = pc.submit_eval
    pc.submit_eval = lambda **kw: submit(**kw)
    try:
        argv = ["eval", "--message=" + (req.get("message") or "x"), "--agent", "sftree"]
        return _run_cli(argv, {})
    finally:
        pc.submit_eval = saved


OPS = {name[3:]: fn for name, fn in globals().items() if name.startswith("op_")}
_LOCK = threading.Lock()


def main() -> None:
    if len(sys.argv) > 1:
        sys.path.insert(0, sys.argv[1])
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing Coral prints on its own may break the protocol
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            with _LOCK:
                value = OPS[req["op"]](req)
            answer = {"ok": True, "value": value}
        except Exception as exc:  # noqa: BLE001 - reported to the host, which raises it with the op's name
            answer = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
