"""The `opencode` agent backend: real OpenCode sessions as the Teacher, one OpenCode server per edge.

Per edge (docs/opencode.md):

- an isolated OpenCode home (`work/<edge>/opencode/`: XDG data/config/state/cache and HOME) with an
  `opencode.json` whose only provider is `@ai-sdk/openai-compatible` pointing at this job's recording proxy
  (agents/proxy.py) in front of the Teacher; autoupdate, sharing, model-list fetches, LSP downloads, plugin installs,
  web tools and compaction are off, and the model's context limit sits above the tree's hard token limit;
- one `opencode serve` for the edge's two turns, started on the first, driven by agents/opencode_driver.py over
  OpenCode's HTTP API as `opencode run --format json` drives its own in-process server (the same session rules
  and requests: tests/test_opencode_serve.py), so OpenCode starts once per edge, not once per turn. Under
  bubblewrap (agent.sandbox) the driver and the server run in the agent's sandbox (sandbox.py: the unprivileged
  uid when sftree is root, no capabilities, AGENT_LIMITS); the workspace is mounted at the Coral-shaped path,
  OpenCode's own state (`box/`) at `/tmp/sftree/opencode` and the host's files for it (`host/`: config, the driver)
  read-only at `/tmp/sftree/host`, so every edge's OpenCode sees the same paths, and the grader, the tree store
  and $HOME are hidden;
- a rollout turn = one prompt to the edge's session. The driver relays OpenCode's events in `run`'s JSON form:
  `step_finish.part.tokens.total` (context length), `tool_use` parts (`state.status == "error"` = tool error;
  inputs -> knowledge actions), and the completed `coral eval` call, which ends the turn: the proxy stops passing
  requests on, the session is aborted and every other process of the sandbox killed, as Coral's manager
  interrupts its agents before it injects the next prompt;
- after the edge's last turn the server stops and its session store (OpenCode's SQLite database, copied by the
  driver) is kept at the node as `sessions/<edge>.opencode.db`; a child edge's server starts on a copy of it and
  continues the same session. The host never opens that database: it copies bytes.

The step records come from the proxy (exact request messages and tools), enriched with the tool results (the
next request's `role: tool` messages, or the event's output for the turn's last step) and the error/knowledge
flags from the event stream. `TurnRun.messages` is replaced by the session's real message list (last request
+ its answer + the tool results), so search/edge.py's session file and next-turn prompt work as with `native`.

Compaction: `compaction.auto/prune: false`, OPENCODE_DISABLE_AUTOCOMPACT/PRUNE, and a context limit above the
hard token limit mean it should never fire; if it still does (a request of OpenCode's summarising agent, or a
request carrying its `<conversation-checkpoint>`), the turn's records get `"compacted": true`, the outcome's
`compacted` attribute is set and a warning is logged.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import json
import logging
import os
import queue
import re
import select
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sftree.agents.base import Teacher, TurnOutcome, TurnRun
from sftree.agents.chain import Pristine, SessionChain, split
from sftree.agents.knowledge import is_knowledge_action as is_knowledge  # one decision for both backends
from sftree.agents.proxy import Channel, ProxyLimits, RecordingProxy
from sftree.agents.turn_end import TEACHER_DOWN, refine
from sftree.errors import InputError
from sftree.jsontypes import JSONObject, JSONValue, arr, count, obj
from sftree.records.steplog import StepKind, StepRecord, ToolResult
from sftree.records.tree import TurnEnd
from sftree.runtime.edgebox import CHECK_EVERY
from sftree.runtime.procs import kill_group
from sftree.runtime.sandbox import give_to, resolve_mode, wait_gone
from sftree.world.standin import DEFAULT_OPENCODE_MODEL, nudge_prompt

if TYPE_CHECKING:
    from sftree.runtime.workspace import EdgeWorkspace
    from sftree.settings import AgentSettings
    from sftree.world.world import World

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[3]
PINNED_VERSION = "1.18.33"
INSTALL_HINT = (
    "install it with `bash scripts/install_opencode.sh` (npm package opencode-ai@" + PINNED_VERSION + ")"
)
HOME_MOUNT = "/tmp/sftree/opencode"  # the edge's `box/`: OpenCode's own state, writable by the sandbox uid
HOST_MOUNT = "/tmp/sftree/host"  # the edge's `host/`: what the host writes for OpenCode, read-only inside
PROXY_MOUNT = "/tmp/sftree/proxy"
DRIVER = Path(__file__).resolve().parent / "opencode_driver.py"  # runs in the sandbox (python -I, no sftree)
# What OpenCode loads comes from the host alone (docs/opencode.md "Configuration only from the host"): the project
# (the worktree, its `.opencode/` with Coral's links into the knowledge, the folders above it) is no configuration
# at all (OPENCODE_DISABLE_PROJECT_CONFIG); the host hands OpenCode what Coral puts there as its own read-only files:
# Coral's settings (OPENCODE_CONFIG), the instructions (AGENTS.md) and the shared skills (`skills.paths`).
CORAL_SETTINGS = "coral-opencode.json"  # in the edge's host/: Coral's `.opencode/opencode.json`
# OpenCode 1.18.33 carries a second config reader (its `v2/Config`) that ignores that flag: it reads the worktree's
# `.opencode/opencode.json(c)`, a worktree-root `opencode.json(c)` and `.opencode/` folders, and its plugin loader
# imports `.opencode/{plugin,plugins}/*.{ts,js}` and a document's `plugins` from them. In the sandbox each is the
# host's read-only copy or an empty one (`.opencode/agents` is Coral's shared knowledge folder and stays: what
# that reader makes of an agent file reaches no request, tests/security/test_opencode_loads.py).
PROJECT_DIRS = ("plugin", "plugins", "tool", "tools", "agent", "command", "commands", "mode", "modes")
ROOT_CONFIGS = ("opencode.json", "opencode.jsonc")
STORE_OUT = "session.db"  # in the box: the driver's copy of OpenCode's session store when the edge ends
STORE_MAX = 256 << 20
START_TIMEOUT = 120.0
ABORT_TIMEOUT = 60.0
LINE_MAX = 1 << 20  # one event line from the sandbox
LOG_MAX = 8 << 20  # of the sandbox's stderr kept in the edge's stderr.log
# What the sandbox may send (it runs agent code: a plugin in the server can publish any event). Read ahead at
# most QUEUE_MAX events (beyond that it waits on its pipe), and per prompt at most RUN_EVENTS_MAX events of
# RUN_BYTES_MAX bytes in all; a real prompt's run sends a few hundred.
QUEUE_MAX = 256
RUN_EVENTS_MAX = 20_000
RUN_BYTES_MAX = 64 << 20
SEND_TIMEOUT = 10.0  # for the driver to take a request off its pipe; then it is killed
# OpenCode installs @opencode-ai/plugin from npm into every config folder that lacks it; these stubs make it
# see the dependency as present (no network), and its own .gitignore keeps them out of commits.
PLUGIN_DEP = {"@opencode-ai/plugin": PINNED_VERSION}
GITIGNORE = "node_modules\npackage.json\npackage-lock.json\nbun.lock\n.gitignore\n"
ENV_FLAGS = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOCOMPACT": "1",
    "OPENCODE_DISABLE_PRUNE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    # No opencode.json(c), AGENTS.md/CONTEXT.md or `.opencode/` folder (agents, modes, commands, plugins, tools,
    # skills, their npm dependencies) of the worktree or the folders above it is loaded: the agent writes them
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    "OPENCODE_DISABLE_EMBEDDED_WEB_UI": "1",
    "OPENCODE_EXPERIMENTAL_DISABLE_FILEWATCHER": "1",
    "OPENCODE_PURE": "1",
}
EVAL_RX = re.compile(r"(^|[\s;&|(])coral\s+eval\b")
# What cannot work in an edge (docs/opencode.md, "Tools"): the sandbox has no network, and a subagent or a question
# would be a session outside the edge's transcript. Set in OPENCODE_CONFIG_CONTENT, which OpenCode merges last,
# so Coral's project config (`"*": "allow"`, web tools allowed with agents.research) cannot turn them back on.
DENIED = {"task": "deny", "webfetch": "deny", "websearch": "deny", "question": "deny"}


# ---- pure helpers --------------------------------------------------------------------------------------------
def find_binary(configured: str) -> str:
    """The opencode executable: $SFTREE_OPENCODE_BIN, a configured path, .tools/bin/opencode, then PATH.

    A configured or environment path that is not executable is an error (no silent fallback to another one).
    """
    for what, cand in (
        ("$SFTREE_OPENCODE_BIN", os.environ.get("SFTREE_OPENCODE_BIN")),
        ("agent.opencode.binary", configured),
    ):
        if cand and os.sep in cand:
            if os.access(cand, os.X_OK) and Path(cand).is_file():
                return str(Path(cand).resolve())
            raise InputError(f"{what}: {cand} is not an executable file; {INSTALL_HINT}")
    local = REPO_ROOT / ".tools" / "bin" / "opencode"
    if local.exists() and os.access(local, os.X_OK):
        return str(local.resolve())
    found = shutil.which(configured)
    if found:
        return str(Path(found).resolve())
    raise InputError(
        f"agent.backend is `opencode` but the opencode binary ({configured}) was not found "
        f"on PATH or in .tools/bin; {INSTALL_HINT}"
    )


def is_eval(tool: str, inp: JSONObject) -> bool:
    return tool == "bash" and bool(EVAL_RX.search(str(inp.get("command", ""))))


def split_model(student_model: str) -> tuple[str, str]:
    """ "provider/model" (Coral's `agents.model` for OpenCode, passed on as `--model`) -> (provider, model)."""
    provider, sep, model = str(student_model).partition("/")
    if not sep or not provider or not model:
        raise InputError(
            f"agent.student_model: {student_model!r} is not `provider/model`, the form Coral's agents.model "
            "takes for its opencode runtime (e.g. openai/gpt-5)"
        )
    return provider, model


def opencode_config(
    base_url: str,
    student_model: str,
    *,
    context_limit: int,
    output_limit: int,
    temperature: float | None,
    hidden: list[str],
    worktree: str,
    autocompact: bool = False,
) -> JSONObject:
    """The edge's global opencode.json (read-only in the sandbox): the Student's provider and model id, served by
    the recording proxy, and what sftree adds to Coral's settings (`CORAL_SETTINGS`): subagents, web tools and
    questions denied, the grader and the store out of reach. The project is no configuration (ENV_FLAGS), so what
    OpenCode would find there in Coral is named here: the worktree's AGENTS.md (Coral's instructions; the host's
    read-only copy in the sandbox: "Instructions from:" names the same path) and the shared skills under
    `.opencode/skills` (the same SKILL.md files at the same paths as `.opencode`'s own `skills/` scan)."""
    provider, model = split_model(student_model)
    external: JSONObject = {"*": "deny"}
    for h in hidden:  # the grader and the store: denied even if the path is visible
        external[h.rstrip("/") + "/**"] = "deny"
    cfg: JSONObject = {
        "$schema": "https://opencode.ai/config.json",
        "model": f"{provider}/{model}",
        "small_model": f"{provider}/{model}",
        "autoupdate": False,
        "share": "disabled",
        "snapshot": False,
        "formatter": False,
        "lsp": False,
        "enabled_providers": [provider],
        "compaction": {"auto": bool(autocompact), "prune": False},
        "provider": {
            provider: {
                "npm": "@ai-sdk/openai-compatible",
                "name": provider,
                "options": {"baseURL": base_url, "apiKey": "sftree-proxy"},
                "models": {
                    model: {
                        "name": model,
                        "tool_call": True,
                        "temperature": temperature is not None,  # else OpenCode sends no temperature
                        "limit": {"context": int(context_limit), "output": int(output_limit)},
                    }
                },
            }
        },
        "permission": {"external_directory": external},
        "experimental": {"continue_loop_on_deny": True},
        "instructions": [f"{worktree}/AGENTS.md"],
        "skills": {"paths": [f"{worktree}/.opencode/skills"]},
    }
    if temperature is not None:
        cfg["agent"] = {"build": {"temperature": float(temperature)}}
    return cfg


@dataclass
class ToolEvent:
    call_id: str
    tool: str
    status: str  # completed | error
    input: JSONObject
    output: str
    knowledge: bool


@dataclass
class TurnEvents:
    """What the event stream of one `opencode run` says."""

    session_id: str | None = None
    steps: int = 0
    tokens: int = 0
    tools: list[ToolEvent] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    eval_call: str | None = None  # callID of the completed `coral eval`


def apply_event(
    ev: JSONObject, acc: TurnEvents, knowledge_dir: str | None = None, worktree: str = "."
) -> None:
    """Fold one JSON event of `opencode run --format json` into `acc` (`worktree`, `knowledge_dir`: as the agent
    sees them, for knowledge actions: agents/knowledge.py; a call that failed as a tool is none)."""
    sid = ev.get("sessionID")
    acc.session_id = acc.session_id or (sid if isinstance(sid, str) else None)
    part = obj(ev.get("part"))
    kind = ev.get("type")
    if kind == "step_finish":
        acc.steps += 1
        tok = obj(part.get("tokens"))
        total = tok.get("total")
        if total is None:
            cache = obj(tok.get("cache"))
            total = sum(count(tok.get(k)) for k in ("input", "output", "reasoning")) + count(
                cache.get("read")
            )
        acc.tokens = count(total)
    elif kind == "tool_use":
        state = obj(part.get("state"))
        inp = obj(state.get("input"))
        status = str(state.get("status"))
        out = state.get("output") if status == "completed" else state.get("error")
        if part.get("tool") == "invalid":  # OpenCode's stand-in for a call it could not parse: bad arguments
            status = "error"
        te = ToolEvent(
            call_id=str(part.get("callID") or part.get("id")),
            tool=str(part.get("tool")),
            status=status,
            input=inp,
            output="" if out is None else str(out),
            knowledge=status == "completed"
            and is_knowledge(str(part.get("tool")), inp, worktree, knowledge_dir),
        )
        acc.tools.append(te)
        if status == "completed" and is_eval(te.tool, inp) and acc.eval_call is None:
            acc.eval_call = te.call_id
    elif kind == "error":
        err = ev.get("error") or {}
        data = err.get("data") if isinstance(err, dict) else None
        msg = data.get("message") if isinstance(data, dict) else None
        acc.errors.append(str(msg or (err.get("name") if isinstance(err, dict) else err)))


def _calls(rec: StepRecord) -> list[JSONObject]:
    """The tool calls of a record's reply (none when it has no reply)."""
    return [obj(c) for c in arr(obj(rec.get("response")).get("tool_calls"))]


def enrich_records(records: list[StepRecord], events: TurnEvents, eval_call: str | None) -> list[StepRecord]:
    """Step records of one turn: cut after the step that ran `coral eval`, tool results filled in."""
    kept: list[StepRecord] = []
    for rec in records:
        kept.append(rec)
        if eval_call and any(c.get("id") == eval_call for c in _calls(rec)):
            break  # later requests slipped out while the process was being interrupted
    kept += [r for r in records[len(kept) :] if r.get("kind") not in ("agent", "nudge")]
    by_id = {t.call_id: t for t in events.tools}
    agent = [r for r in kept if r.get("kind") in ("agent", "nudge") and r.get("response")]
    for i, rec in enumerate(agent):
        sent: dict[JSONValue, JSONValue] = {}
        if i + 1 < len(agent):  # what OpenCode really sent back: the next request's tool messages
            tool_msgs = [obj(m) for m in arr(agent[i + 1]["request"]["messages"])]
            sent = {m.get("tool_call_id"): m.get("content") for m in tool_msgs if m.get("role") == "tool"}
        results: list[ToolResult] = []
        for c in _calls(rec):
            cid = c.get("id")
            te = by_id.get(cid) if isinstance(cid, str) else None
            content = sent.get(cid)
            if content is None:
                content = te.output if te else ""
            results.append(
                {
                    "tool_call_id": cid,
                    "name": obj(c.get("function")).get("name"),
                    "content": content if isinstance(content, str) else json.dumps(content),
                    "error": bool(te and te.status == "error"),
                    "knowledge": bool(te and te.knowledge),
                }
            )
        rec["tool_results"] = results
    return kept


def session_messages(records: list[StepRecord]) -> list[JSONObject] | None:
    """The session as the model will see it next: the last agent request + its answer + tool results."""
    last = next(
        (r for r in reversed(records) if r.get("kind") in ("agent", "nudge") and r.get("response")), None
    )
    if last is None:
        return None
    resp = dict(obj(last["response"]))
    if resp.get("tool_calls"):  # OpenCode resends arguments as JSON.stringify does (compact)
        resp["tool_calls"] = [_compact_call(c) for c in _calls(last)]
    msgs = [m for m in arr(last["request"]["messages"]) if isinstance(m, dict)] + [resp]
    for tr in last.get("tool_results") or []:
        msgs.append({"role": "tool", "tool_call_id": tr["tool_call_id"], "content": tr["content"]})
    return msgs


def _compact_call(call: JSONObject) -> JSONValue:
    fn = dict(obj(call.get("function")))
    arguments = fn.get("arguments") or "{}"
    try:
        if isinstance(arguments, str):
            fn["arguments"] = json.dumps(json.loads(arguments), ensure_ascii=False, separators=(",", ":"))
    except ValueError:
        pass
    return {**call, "function": fn}


def _teacher_down(rec: StepRecord) -> bool:
    """The record of a request the Teacher failed; a malformed reply is the model's step failing (as with
    `native`), not the Teacher being down."""
    return bool(rec.get("error")) and not str(rec["error"]).startswith("malformed reply")


def _stop_asked(ch: Channel, acc: TurnEvents, deadline: float, max_steps: int) -> TurnEnd | None:
    """Why the host stops a run now (its proxy channel, the step count, the clock), or None."""
    if ch.tampered:  # a request broke the session's chain (agents/chain.py): the edge ends
        return "tampered"
    if ch.teacher_failures:  # past the proxy's retry budget: OpenCode would only retry again
        return "teacher_error"
    if ch.over_limit:  # the proxy refused a request past the turn's step or byte cap
        stop: TurnEnd = "step_limit" if ch.over_limit.startswith("step_limit") else "edge_error"
        if stop == "edge_error":
            acc.errors.append(f"the recording proxy: {ch.over_limit}")
        return stop
    if acc.steps >= max_steps:
        return "step_limit"
    if ch.cut_call:  # the proxy stopped the channel at a call cut at max_tokens (turn_end.py)
        acc.errors.append("a reply was cut at max_tokens inside a tool call")
        return "cut_call"
    if time.monotonic() >= deadline:
        return "timeout"
    return None


def _run_ended(
    stop: TurnEnd | None,
    recs: list[StepRecord],
    acc: TurnEvents,
    ch: Channel,
    max_steps: int,
    nudges_left: int,
) -> tuple[TurnEnd, str | None] | None:
    """How the turn ends after a run that made the records `recs` (its `ended` and error, None: no error
    set), or None when the Teacher is reminded and the turn goes on."""
    teacher_failed = any(_teacher_down(r) for r in recs if r["kind"] in ("agent", "nudge"))
    if stop == "teacher_error":
        failed = [r for r in recs if r.get("error") and not r.get("response")]
        return "teacher_error", (failed[-1]["error"] if failed else "teacher failed")
    if stop == "edge_error":
        return stop, acc.errors[-1]
    if stop == "tampered":
        return stop, ch.tampered
    if stop is not None:
        return stop, None
    if teacher_failed and not any(r.get("response") for r in recs):
        return "teacher_error", next(r["error"] for r in recs if _teacher_down(r))
    if nudges_left <= 0 or acc.steps >= max_steps:
        return ("no_eval" if acc.steps < max_steps else "step_limit"), None
    return None


# ---- the backend ---------------------------------------------------------------------------------------------
class _End(enum.Enum):
    EOF = "eof"


EOF = _End.EOF  # the driver is gone: the last item of its event queue


class _Driver:
    """The host's end of one edge's driver process (agents/opencode_driver.py): JSON lines both ways, over two
    pipes passed as extra descriptors, not as its stdin/stdout. bwrap's own processes in the sandbox (same uid,
    dumpable) close extra descriptors but keep 0-2, so only the driver, which is not dumpable, holds these.
    What comes back is read by a thread, line by line and bounded (the sandbox writes it), at most QUEUE_MAX
    events ahead of the reader, and counted (`received`, `received_bytes`); the sandbox's stderr goes to the
    edge's stderr.log, bounded. Nothing here blocks the host for longer than a timeout."""

    def __init__(
        self,
        argv: list[str],
        name: str,
        log: Path,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        start_new_session: bool = False,
    ):
        to_driver, self._to_w = os.pipe()
        self._from_r, from_driver = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [*argv, "--fds", str(to_driver), str(from_driver)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(to_driver, from_driver),
                cwd=cwd,
                env=env,
                start_new_session=start_new_session,
            )
        finally:
            os.close(to_driver)
            os.close(from_driver)
        # tests look for the processes that hold these
        self.pipes = {os.fstat(fd).st_ino for fd in (self._to_w, self._from_r)}
        os.set_blocking(self._to_w, False)  # `send` waits at most SEND_TIMEOUT
        self._in = os.fdopen(self._from_r, "rb")
        self.lines: queue.Queue[JSONObject | _End] = queue.Queue(QUEUE_MAX)
        self.received = self.received_bytes = 0
        self._killed = threading.Event()
        self._send_lock = threading.Lock()
        threading.Thread(target=self._pump, daemon=True, name=f"oc-{name}").start()
        self._logging = threading.Thread(target=self._log, args=(log,), daemon=True, name=f"oc-{name}-err")
        self._logging.start()

    def _log(self, path: Path) -> None:
        """The sandbox's stderr into the edge's stderr.log, the first LOG_MAX bytes (the rest is counted and
        dropped, but read: a writer must never block on it). Closed here, at its end."""
        kept = dropped = 0
        err = self.proc.stderr
        if err is None:  # Popen(stderr=PIPE) made one
            return
        try:
            f = open(path, "ab")  # noqa: SIM115 - closed below
        except OSError:
            f = None
        while chunk := os.read(err.fileno(), 65536):
            if f is not None and kept + len(chunk) <= LOG_MAX:
                f.write(chunk)
                f.flush()
                kept += len(chunk)
            else:
                dropped += len(chunk)
        if f is not None:
            if dropped:
                f.write(f"\n[{dropped} more bytes of stderr dropped]\n".encode())
            f.close()
        err.close()

    def _pump(self) -> None:
        while line := self._in.readline(LINE_MAX):
            self.received_bytes += len(line)
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a line cut at LINE_MAX, or not ours
            if isinstance(ev, dict):
                self.received += 1
                self._put(ev)
        self._in.close()
        self._put(EOF)

    def _put(self, item: JSONObject | _End) -> None:
        """Wait for room (the sandbox then waits on its pipe), unless the driver was killed: nobody reads
        after that, and what is still in the pipe is read and dropped until its end."""
        while not self._killed.is_set():
            try:
                self.lines.put(item, timeout=0.5)
                return
            except queue.Full:
                pass

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, req: JSONObject) -> None:
        """One request; a driver that does not take it within SEND_TIMEOUT is killed (the next read says
        it is gone, as it does for one that has ended)."""
        data = (json.dumps(req) + "\n").encode()
        end = time.monotonic() + SEND_TIMEOUT
        with self._send_lock:
            try:
                while data and not self._killed.is_set():
                    left = end - time.monotonic()
                    if left <= 0 or not select.select([], [self._to_w], [], left)[1]:
                        break
                    try:
                        data = data[os.write(self._to_w, data) :]
                    except BlockingIOError:
                        continue
            except (OSError, ValueError):
                pass  # it is gone
        if data and not self._killed.is_set():
            log.warning("OpenCode's driver did not take a request in %.0f s: killed", SEND_TIMEOUT)
            self.kill()

    def next(self, timeout: float) -> JSONObject | _End | None:
        """The next event, EOF once the driver is gone (or killed), or None after `timeout` s."""
        if self._killed.is_set():
            return EOF
        try:
            ev = self.lines.get(timeout=timeout)
        except queue.Empty:
            return EOF if self._killed.is_set() else None
        if ev is EOF:
            with contextlib.suppress(queue.Full):
                self.lines.put_nowait(EOF)  # stays at the end (the reader has ended: there is room)
        return ev

    def wait_for(self, kind: str | tuple[str, ...], timeout: float) -> JSONObject | None:
        """Skip events until one of `kind` (a type or several); None after `timeout` s or when the driver is
        gone."""
        kinds = (kind,) if isinstance(kind, str) else kind
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ev = self.next(min(0.5, max(0.01, end - time.monotonic())))
            if ev is EOF:
                return None
            if ev is not None and ev.get("type") in kinds:
                return ev
        return None

    def kill(self) -> None:
        """SIGKILL to its process group (bwrap then ends the sandbox), then reap it. What it reads from is
        left to the threads that read it, which close it at its end (a reader blocked on it would make a close
        here wait)."""
        if self.alive():
            kill_group(self.proc)
        self.proc.wait()
        with self._send_lock:
            first = not self._killed.is_set()
            self._killed.set()
            if first:
                os.close(self._to_w)
        with contextlib.suppress(queue.Empty):
            while True:  # what it sent is nobody's now
                self.lines.get_nowait()
        self._logging.join(2)  # its last words in stderr.log before anyone reads them there


def _no_link_on_the_way(root: Path, rel: str) -> None:
    """Raise when a component of `root/rel` (host side, not followed) is a link: a mount there would land where
    the agent points it."""
    here = root
    for part in rel.split("/"):
        here = here / part
        if here.is_symlink():
            raise RuntimeError(
                f"the worktree's {rel} leads through a link the agent made; OpenCode is not started"
            )


def _tail(path: Path, n: int = 800) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - n))
            return f.read(n).decode("utf-8", "replace").strip() or "no message"
    except OSError:
        return "no message"


def _tree_dir(ws: EdgeWorkspace) -> Path:
    """The folder of the edge's tree (its sessions/ keep the OpenCode session stores)."""
    return ws.store.tree_dir


@dataclass
class _Edge:
    """`home` (work/<edge>/opencode/, the host's) holds `box/` (OpenCode's HOME and XDG data/state/cache,
    handed to the sandbox uid; a fork's copy of its parent's session store), `host/` (opencode.json and the
    driver: written by the host, read-only inside) and the host's own stderr.log, which OpenCode never sees. So the
    host never writes where OpenCode (and so the Teacher's commands) can write or plant a link."""

    home: Path
    session_id: str | None = None
    parent_chain: JSONObject | None = (
        None  # the parent session's chain state (agents/chain.py), from its node
    )
    uid: int | None = None  # the edge's sandbox user (its box's), or None
    driver: _Driver | None = None  # the edge's OpenCode server, while it runs

    @property
    def box(self) -> Path:
        return self.home / "box"

    @property
    def host(self) -> Path:
        return self.home / "host"


class OpenCodeAgent:
    name = "opencode"

    needs_probe = True  # `prepare`: OpenCode's pristine session, before any edge

    def __init__(
        self,
        teacher: Teacher,
        settings: AgentSettings,
        *,
        hard_token_limit: int,  # search.hard_token_limit
        world: World | None = None,
    ):
        self.teacher = teacher
        self.settings = settings
        self.oc = settings.opencode
        self.binary = find_binary(self.oc.binary)
        # The Student's model id: OpenCode builds its system prompt and tool set for it (docs/opencode.md).
        configured = settings.student_model
        chosen = world.student_model(configured) if world is not None else configured
        self.student_model: str = chosen or DEFAULT_OPENCODE_MODEL
        split_model(self.student_model)
        self.sandbox = resolve_mode(settings.sandbox)
        # Above the hard token limit (compaction must not fire before the tree stops the path) and roomy.
        limit = self.oc.context_limit
        self.context_limit = limit if limit else max(4 * hard_token_limit, 262144)
        self._edges: dict[str, _Edge] = {}
        # agents/chain.py: OpenCode's own system prompt and tools, from `prepare`
        self.pristine: Pristine | None = None
        self._lock = threading.Lock()
        self.proxy = RecordingProxy(
            teacher.base_url,
            api_key=teacher.api_key,
            params=teacher.params,  # every field but the messages and tools: the host's (teacher/params.py)
            student_model=split_model(self.student_model)[1],
            limits=ProxyLimits.from_settings(settings),
            policy=teacher.policy,  # the native client's (teacher/transport.py): one retry policy
        ).start(unix=self.sandbox == "bwrap")
        atexit.register(self.proxy.stop)  # also when a tree is killed before EdgeContext.close runs

    def close(self) -> None:
        with self._lock:
            edges, self._edges = list(self._edges.values()), {}
        for st in edges:
            self._kill(st)
        self.proxy.stop()

    # -- homes, sessions, forks --
    def _edge(self, run: TurnRun) -> _Edge:
        ws = run.workspace
        with self._lock:
            st = self._edges.get(ws.edge_id)
            if st is not None and st.home.exists():
                return st
            old = st
            st = _Edge(home=Path(ws.paths.edge) / "opencode", uid=run.box.uid)  # new, or its home is gone
            self._edges[ws.edge_id] = st
            run.box.watched.append(st.box)  # OpenCode's own state counts toward the edge's disk quota
        if old is not None:
            self._kill(old)  # its home was removed under it: that server is of no use any more
        for sub in ("box/data", "box/state", "box/cache", "box/home", "host/config/opencode"):
            (st.home / sub).mkdir(parents=True, exist_ok=True)
        self._plugin_stub(st.host / "config" / "opencode")  # read-only inside: OpenCode must find it complete
        self._coral_settings(run)
        parent = self.store_paths(_tree_dir(ws), ws.parent.session)
        if parent is not None and parent[0].is_file() and parent[1].is_file():
            # The fork's server starts on a copy of the parent's session store: the same session, continued.
            dst = st.box / "data" / "opencode"
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(parent[0], dst / "opencode.db")
            kept = json.loads(parent[1].read_text(encoding="utf-8"))  # the host's own file
            st.session_id, st.parent_chain = kept["session_id"], kept.get("chain")
        elif ws.parent.session:
            log.warning(
                "edge %s: parent session %s has no OpenCode session store (%s); starting a fresh OpenCode session",
                ws.edge_id,
                ws.parent.session,
                parent[0] if parent else None,
            )
        return st

    @staticmethod
    def store_paths(tree_dir: Path, session: str | None) -> tuple[Path, Path] | None:
        """sessions/<node edge>.json (search/edge.py's message list) -> the node's OpenCode session store
        (sessions/<node edge>.opencode.db) and the record naming its session (.opencode.json)."""
        if not session:
            return None
        p = Path(tree_dir) / session
        stem = p.name.removesuffix(".json")
        return p.with_name(stem + ".opencode.db"), p.with_name(stem + ".opencode.json")

    @staticmethod
    def _hand_over(run: TurnRun, st: _Edge) -> None:
        """The unprivileged sandbox user owns what it may change: its box (the workspace is its since the fork)."""
        if st.uid is not None:
            give_to(st.box, st.uid)

    def _write_config(self, run: TurnRun, st: _Edge) -> None:
        base = self.proxy.base_url(run.workspace.edge_id)
        hidden = [str(p) for p in run.box.hidden]
        cfg = opencode_config(
            base,
            self.student_model,
            context_limit=self.context_limit,
            output_limit=self.teacher.max_tokens,
            temperature=self.teacher.temperature,
            hidden=hidden,
            worktree=run.box.worktree,
            autocompact=not self.oc.disable_autocompact,
        )
        cdir = st.host / "config" / "opencode"
        (cdir / "opencode.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        self._plugin_stub(cdir)
        self._hand_over(run, st)

    @staticmethod
    def _coral_settings(run: TurnRun) -> None:
        """The worktree's `.opencode/opencode.json` as Coral writes it when it sets up an agent's worktree (its
        permissions; rendered by the user's Coral, else the stand-in), once per edge as Coral does once per
        worktree: the agent may change it there as it may in Coral."""
        from sftree.runtime import safefs

        text = run.coral.world.opencode_json()
        safefs.write_bytes_atomic(Path(run.workspace.root), ".opencode/opencode.json", text.encode())

    @staticmethod
    def _plugin_stub(d: Path) -> None:
        d.mkdir(parents=True, exist_ok=True)
        (d / "node_modules").mkdir(exist_ok=True)
        (d / "package.json").write_text(json.dumps({"dependencies": PLUGIN_DEP}) + "\n")
        (d / "package-lock.json").write_text(
            json.dumps({"packages": {"": {"dependencies": PLUGIN_DEP}}}) + "\n"
        )
        if not (d / ".gitignore").exists():  # as OpenCode does: only when there is none
            (d / ".gitignore").write_text(GITIGNORE)

    # -- the edge's OpenCode server (agents/opencode_driver.py) --
    def _seen_at(self, st: _Edge) -> tuple[str, str]:
        """Where the edge's box and host folders are for OpenCode: their mounts in the sandbox, else the folders."""
        return (HOME_MOUNT, HOST_MOUNT) if self.sandbox == "bwrap" else (str(st.box), str(st.host))

    def _env(self, run: TurnRun, st: _Edge) -> dict[str, str]:
        home, host = self._seen_at(st)
        ws = run.box.worktree
        coral_bin = run.box.coral_env.get("CORAL_BIN", "")
        coral_sock = run.box.coral_env.get("CORAL_SOCKET", "")
        path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        env = {
            "PATH": f"{coral_bin}:{Path(self.binary).parent}:{path}" if coral_bin else path,
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "TERM": "dumb",
            "HOME": f"{home}/home",
            "XDG_DATA_HOME": f"{home}/data",
            "XDG_CONFIG_HOME": f"{host}/config",  # read-only: the Teacher cannot change OpenCode's config
            "XDG_STATE_HOME": f"{home}/state",
            "XDG_CACHE_HOME": f"{home}/cache",
            "PWD": ws,
            "SHELL": f"{host}/bin/bash" if self.sandbox == "bwrap" else os.environ.get("SHELL", "/bin/bash"),
            "CORAL_SOCKET": coral_sock,
            "CORAL_WORKTREE": ws,
            "CORAL_CLI": run.box.coral_env.get("CORAL_CLI", ""),
            "PYTHONDONTWRITEBYTECODE": "1",
            "npm_config_offline": "true",  # belt and braces: no npm registry from inside OpenCode
        }
        env.update(ENV_FLAGS)
        env["OPENCODE_CONFIG"] = f"{host}/{CORAL_SETTINGS}"
        env["OPENCODE_CONFIG_CONTENT"] = json.dumps({"permission": DENIED})
        if not self.oc.disable_autocompact:
            env.pop("OPENCODE_DISABLE_AUTOCOMPACT")
        if self.sandbox == "bwrap":
            env["TMPDIR"] = "/tmp"
        return env

    def _argv(self, run: TurnRun, st: _Edge) -> tuple[list[str], str]:
        """The driver's command line in the edge's sandbox (runtime/edgebox.py) with OpenCode's own state bound
        too; under bwrap (no network) the driver bridges the proxy's port to its socket and reaps between turns."""
        box = run.box
        st.box.mkdir(parents=True, exist_ok=True)
        st.host.mkdir(parents=True, exist_ok=True)
        (st.host / DRIVER.name).write_bytes(DRIVER.read_bytes())
        # Coral's settings as Coral gives them to OpenCode (OPENCODE_CONFIG: merged after the global config, where
        # the project's would have been), from the host's copy: the worktree's is the agent's to change
        (st.host / CORAL_SETTINGS).write_text(run.coral.world.opencode_json(), encoding="utf-8")
        binary = str(Path(self.binary).resolve())  # a symlink to it may lie in a hidden folder
        home, host = self._seen_at(st)
        args = [sys.executable, "-I", f"{host}/{DRIVER.name}", binary, box.worktree]
        args += [f"{home}/data/opencode/opencode.db", f"{home}/{STORE_OUT}"]
        if self.sandbox != "bwrap":
            return args, str(run.workspace.root)
        args += ["--bridge", f"{PROXY_MOUNT}/proxy.sock", str(self.proxy.port), "--reap"]
        if self.proxy.unix_dir is None:  # started with its socket under bwrap (__init__)
            raise RuntimeError("the recording proxy has no Unix socket for the sandbox")
        # Popen(start_new_session=True) already makes a session without a terminal.
        argv = box.argv(
            args,
            binds=[(st.box, HOME_MOUNT)],
            ro_binds=[(st.host, HOST_MOUNT), (self.proxy.unix_dir, PROXY_MOUNT), *self._host_config(run, st)],
            keep_visible=[Path(self.binary).resolve()],
            new_session=False,
        )
        return argv, "/"

    def _host_config(self, run: TurnRun, st: _Edge) -> list[tuple[Path, str]]:
        """Read-only mounts over the places of the agent's that OpenCode still reads with the project switched off
        (ENV_FLAGS): its home's `.opencode` (an empty config folder), the worktree's AGENTS.md (the instructions the
        host's config names: the host's copy), and for OpenCode's second config reader (`PROJECT_DIRS`) the
        worktree's `.opencode/{plugin,tool,agent,...}` (empty), `.opencode/opencode.json` (Coral's settings, the
        host's copy), `.opencode/opencode.jsonc` and a worktree-root `opencode.json(c)` the agent made (`{}`: what it
        committed is code, not configuration). Also the agent's shell (agents/agent_shell.py: no command of the
        agent reaches OpenCode's server). Made afresh at every start."""
        from sftree.agents.agent_shell import script
        from sftree.runtime import safefs

        host, wt_host, wt = st.host, Path(run.workspace.root), run.box.worktree
        empty, blank, home_cfg = host / "empty", host / "empty.json", host / "home-opencode"
        empty.mkdir(exist_ok=True)
        self._plugin_stub(home_cfg)  # a config folder OpenCode finds complete (it would install into it)
        blank.write_text("{}\n", encoding="utf-8")
        (host / "bin").mkdir(exist_ok=True)
        shell = host / "bin" / "bash"
        shell.write_text(script(sys.executable, shutil.which("bash") or "/bin/bash"), encoding="utf-8")
        shell.chmod(0o755)
        # AGENTS.md as the host wrote it (search/edge.py)
        (host / "AGENTS.md").write_text(run.instructions, encoding="utf-8")
        home_oc = st.box / "home" / ".opencode"  # the box is the sandbox user's: whatever it left there goes
        if not (st.box / "home").is_dir() or (st.box / "home").is_symlink():
            safefs.remove_entry(st.box, "home")
            (st.box / "home").mkdir(parents=True)
            if st.uid is not None:
                os.chown(st.box / "home", st.uid, st.uid)
        safefs.remove_entry(st.box / "home", ".opencode")
        home_oc.mkdir()
        mounts = [(home_cfg, f"{HOME_MOUNT}/home/.opencode"), (host / "AGENTS.md", f"{wt}/AGENTS.md"),
                  (host / CORAL_SETTINGS, f"{wt}/.opencode/opencode.json"),
                  (blank, f"{wt}/.opencode/opencode.jsonc")]  # fmt: skip
        mounts += [(empty, f"{wt}/.opencode/{d}") for d in PROJECT_DIRS]
        mounts += [(blank, f"{wt}/{name}") for name in ROOT_CONFIGS if os.path.lexists(wt_host / name)]
        for _src, dst in mounts:  # bwrap would follow a link the agent left on the way to a mount point
            if dst.startswith(wt + "/"):
                _no_link_on_the_way(wt_host, dst[len(wt) + 1 :])
        return mounts

    def _start(self, run: TurnRun, st: _Edge) -> _Driver:
        """The edge's server, started on its first turn (or again after it died), once it is ready."""
        if st.driver is not None:
            if st.driver.alive():
                return st.driver
            self._kill(st)  # the ended one's pipe, and whatever its sandbox left
        argv, cwd = self._argv(run, st)
        st.driver = _Driver(
            argv,
            run.workspace.edge_id,
            st.home / "stderr.log",
            cwd=cwd,
            env=self._env(run, st),
            start_new_session=True,  # no controlling terminal, as for `opencode run`
        )
        ev = st.driver.wait_for("ready", START_TIMEOUT)
        if ev is None:
            self._kill(st)
            raise RuntimeError(f"OpenCode's server did not start:\n{_tail(st.home / 'stderr.log')}")
        return st.driver

    def _kill(self, st: _Edge) -> None:
        """Stop the driver and everything in its sandbox, and wait until it is all gone."""
        d, st.driver = st.driver, None
        if d is not None:
            d.kill()
        if self.sandbox == "bwrap":
            wait_gone(st.uid)

    def _save(self, run: TurnRun, st: _Edge) -> None:
        """End the edge's server and keep its session store at the node: sessions/<edge>.opencode.db (+ .json
        naming the session), from which a fork's server starts."""
        if not st.session_id:
            self._kill(st)
            return
        # A driver killed at the end of the turn (it did not answer the abort) left the store on disk: a new
        # one copies it as well.
        d = st.driver if st.driver is not None and st.driver.alive() else self._start(run, st)
        d.send({"op": "save"})
        saved = d.wait_for(("saved", "save_failed"), 60)
        self._kill(st)  # the copy is whole once `saved` is said (written, then renamed)
        if saved and saved.get("type") != "saved":
            raise RuntimeError(f"OpenCode's session store was not saved: {str(saved.get('message'))[:300]}")
        if saved is None:
            raise RuntimeError(f"OpenCode did not save its session store: {_tail(st.home / 'stderr.log')}")
        from sftree.fileio import write_bytes_atomic, write_json_atomic
        from sftree.runtime import safefs

        data = safefs.read_bytes(st.box, STORE_OUT, limit=STORE_MAX + 1)  # no link followed, bounded
        if len(data) > STORE_MAX:
            raise RuntimeError(f"OpenCode's session store is over {STORE_MAX >> 20} MiB")
        tree = _tree_dir(run.workspace)
        name = run.workspace.edge_id
        write_bytes_atomic(Path(tree) / "sessions" / f"{name}.opencode.db", data)
        ch = self.proxy.channels.get(name)
        chain = ch.chain.state() if ch is not None and ch.chain is not None else None
        write_json_atomic(
            Path(tree) / "sessions" / f"{name}.opencode.json",
            {
                "session_id": st.session_id,
                "store": f"{name}.opencode.db",
                "opencode": PINNED_VERSION,
                "chain": chain,
            },
        )

    def _one_run(
        self,
        run: TurnRun,
        st: _Edge,
        prompt: str,
        acc: TurnEvents,
        deadline: float,
        max_steps: int,
        evals_before: int,
    ) -> TurnEnd | None:
        """One prompt to the edge's server; returns why it was stopped (eval | step_limit | timeout | ...) or
        None if the session went idle by itself. Either way the session is aborted and the sandbox reaped after."""
        ch = self.proxy.channels[run.workspace.edge_id]
        d = self._start(run, st)
        if ch.chain is not None:
            ch.chain.expect_prompt(prompt)  # the one user message the session's next request may add
        ch.stopped = False  # the Teacher is reached during a run only: between two, requests get 503
        ch.cut_call = False
        d.send(
            {"op": "turn", "session": st.session_id, "title": run.workspace.edge_id,
             "model": self.student_model, "text": prompt}
        )  # fmt: skip
        kdir = run.box.inside(run.workspace.knowledge_dir)
        got = (d.received, d.received_bytes)
        stop: TurnEnd | None = None
        idle = False  # the session ended by itself (its last reply whole), not stopped by the host
        try:
            stop, idle = self._watch(run, st, d, ch, acc, kdir, got, deadline, max_steps, evals_before)
        finally:
            self._end_run(st, d, ch, idle)
        if stop is None and len(run.coral.evals) > evals_before:
            stop = "eval"
        return stop

    def _watch(
        self,
        run: TurnRun,
        st: _Edge,
        d: _Driver,
        ch: Channel,
        acc: TurnEvents,
        kdir: str | None,
        got: tuple[int, int],
        deadline: float,
        max_steps: int,
        evals_before: int,
    ) -> tuple[TurnEnd | None, bool]:
        """Follow the run's events until it stops: why the host stopped it (None: it did not), and whether the
        session went idle by itself."""
        eval_seen_at: float | None = None
        next_check = time.monotonic() + CHECK_EVERY
        while True:
            if len(run.coral.evals) > evals_before and not ch.stopped:
                ch.stopped = True  # the eval is in: nothing more may reach the Teacher this turn
                eval_seen_at = time.monotonic()
            if acc.eval_call or (eval_seen_at and time.monotonic() - eval_seen_at > 10):
                return "eval", False
            stop = _stop_asked(ch, acc, deadline, max_steps)
            if stop is not None:
                return stop, False
            if time.monotonic() >= next_check:  # the disk quota, as for every command (runtime/edgebox.py)
                next_check = time.monotonic() + CHECK_EVERY
                over = run.box.over_quota()
                if over:
                    acc.errors.append(over)
                    return "edge_error", False
            if d.received - got[0] > RUN_EVENTS_MAX or d.received_bytes - got[1] > RUN_BYTES_MAX:
                acc.errors.append(
                    f"OpenCode's sandbox sent over {RUN_EVENTS_MAX} events or {RUN_BYTES_MAX >> 20} MiB"
                )
                self._kill(st)  # not asked to abort: it would go on sending meanwhile
                return "edge_error", False
            ev = d.next(0.1)
            if ev is None:
                continue
            if ev is EOF:
                acc.errors.append(f"OpenCode's server exited: {_tail(st.home / 'stderr.log')}")
                return None, False
            kind = ev.get("type")
            if kind == "idle":
                return None, True
            apply_event(ev, acc, kdir, run.box.worktree)
            if acc.session_id and not st.session_id:
                st.session_id = acc.session_id

    def _end_run(self, st: _Edge, d: _Driver, ch: Channel, idle: bool) -> None:
        """Close the channel to the Teacher and end the run, whatever stopped it."""
        ch.stopped = True
        if ch.chain is not None and not idle:
            with ch.lock:
                ch.chain.interrupted()  # the abort may cut or drop the reply that is coming
        # End the turn: abort the session (as Coral's manager interrupts its agent), reap what it left
        # running; a driver that does not answer is killed with its sandbox (the next turn starts it again).
        if d.alive():
            d.send({"op": "abort"})
        # What it reports after the stop is not the turn's (previously cut by the interrupt): not counted.
        ended = d.wait_for(("aborted", "abort_failed"), ABORT_TIMEOUT) if d.alive() else None
        if ended is None or ended.get("type") != "aborted":
            self._kill(st)

    def run_turn(self, run: TurnRun) -> TurnOutcome:
        st = self._edge(run)
        self._write_config(run, st)
        ch = self._open_channel(run, st)
        max_steps = self.settings.max_steps_per_turn
        deadline = time.monotonic() + self.settings.turn_timeout
        nudges_left = self.settings.nudges
        evals_before = len(run.coral.evals)
        acc = TurnEvents()
        out = TurnOutcome(ended="no_eval")
        records = self._runs(run, st, ch, acc, out, deadline, max_steps, nudges_left, evals_before)
        if out.ended == "eval" and len(run.coral.evals) > evals_before:
            out.eval = run.coral.evals[evals_before]
        elif out.ended == "eval":
            out.ended = "no_eval"
        out.ended = refine(out.ended, records, out.error)  # why a turn without an eval ended (turn_end.py)
        records = enrich_records(records, acc, acc.eval_call)
        self._write_records(run, out, records)
        self._count(out, records, acc)
        msgs = session_messages(records)
        if msgs is not None:
            run.messages[:] = msgs
        else:
            run.messages.append({"role": "user", "content": run.prompt})
        if out.ended == "tampered":  # nothing of this session is kept for a child
            self.end_edge(run.workspace.edge_id)
            return out
        if run.final or out.ended in TEACHER_DOWN:  # the edge's last turn: its node keeps the session
            self._save(run, st)
        if run.final:
            self.end_edge(run.workspace.edge_id)
        return out

    def _open_channel(self, run: TurnRun, st: _Edge) -> Channel:
        """The edge's proxy channel for this turn, its session chain resumed or begun, emptied of records."""
        headers = {k: v for k, v in run.headers.items() if k.lower() != "x-sftree-turn"}
        ch = self.proxy.channel(run.workspace.edge_id, headers)
        ch.turn = run.turn
        ch.teacher_failures = 0
        if ch.chain is None and st.parent_chain is not None:  # the parent's session as its chain last saw it
            ch.chain = SessionChain.resume(self.pristine, st.parent_chain, run.box.worktree)
        elif ch.chain is None:  # a fresh session, or a node made before chains were kept: its session file
            ch.chain = SessionChain(
                self.pristine, base=split({"messages": run.messages})[1], workdir=run.box.worktree
            )
        ch.take()
        return ch

    def _runs(
        self,
        run: TurnRun,
        st: _Edge,
        ch: Channel,
        acc: TurnEvents,
        out: TurnOutcome,
        deadline: float,
        max_steps: int,
        nudges_left: int,
        evals_before: int,
    ) -> list[StepRecord]:
        """The turn's prompt, then a reminder after each run that ended without an eval while any are left;
        sets `out.ended` (and `out.error`) and returns the records the proxy took."""
        prompt = run.prompt
        kind: StepKind = "agent"
        records: list[StepRecord] = []
        while True:
            n_before = len(records)
            stop = self._one_run(run, st, prompt, acc, deadline, max_steps, evals_before)
            new = ch.take()
            for r in new:
                if (
                    r["kind"] == "agent"
                    and kind == "nudge"
                    and not any(x["kind"] == "nudge" for x in new[: new.index(r)])
                ):
                    r["kind"] = "nudge"  # the first model call after a reminder
            records += new
            ended = _run_ended(stop, records[n_before:], acc, ch, max_steps, nudges_left)
            if ended is not None:
                out.ended, out.error = ended  # no error set before: the turn ends here
                return records
            nudges_left -= 1
            prompt, kind = nudge_prompt(), "nudge"

    @staticmethod
    def _write_records(run: TurnRun, out: TurnOutcome, records: list[StepRecord]) -> None:
        """The turn's records, numbered, to the edge's step log (all marked when OpenCode compacted the session)."""
        compaction = any(r["kind"] == "compaction" or r.get("compacted") for r in records)
        out.compacted = compaction
        if compaction:
            log.warning("edge %s turn %d: OpenCode compacted the session", run.workspace.edge_id, run.turn)
        step = 0
        for r in records:
            step += 1
            r["step"] = step
            r["turn"] = run.turn
            if compaction:
                r["compacted"] = True
            run.recorder.write(r)

    def _count(self, out: TurnOutcome, records: list[StepRecord], acc: TurnEvents) -> None:
        """The turn's steps, tool calls, context length and errors, into `out`."""
        model_calls = [r for r in records if r["kind"] in ("agent", "nudge") and r.get("response")]
        out.steps = len(model_calls)
        counted = self._counted_tools(acc)
        out.tool_calls = len(counted)
        out.tool_errors = sum(t.status == "error" for t in counted)
        out.knowledge = any(t.knowledge for t in counted)
        last_usage = next((r["usage"] for r in reversed(model_calls) if r.get("usage")), None)
        # Context length after the turn = the last step's prompt + completion tokens (the proxy saw that step;
        # OpenCode's step_finish for the eval step may not arrive before the interrupt).
        out.tokens = (
            last_usage["prompt_tokens"] + last_usage["completion_tokens"] if last_usage else acc.tokens
        )
        if acc.errors and out.error is None and out.ended != "eval":
            out.error = "; ".join(acc.errors)[-500:]

    def prepare(self, run: TurnRun) -> None:
        """The pristine system prompt and tools (agents/chain.py): the first request of a fresh session the host
        starts at the root, in a world laid out as every root edge's; the proxy records it and answers it
        itself (it reaches no Teacher), and every request of every edge is compared with it."""
        st = self._edge(run)
        self._write_config(run, st)
        ch = self.proxy.channel(run.workspace.edge_id, run.headers)
        ch.probe, ch.chain = True, None
        ch.take()
        self._one_run(
            run, st, run.prompt, TurnEvents(), time.monotonic() + START_TIMEOUT, 1, len(run.coral.evals)
        )
        sent = [r for r in ch.take() if r["kind"] == "agent"]
        if not sent:
            raise RuntimeError(
                f"OpenCode's fresh session sent no model request: {_tail(st.home / 'stderr.log')}"
            )
        request = sent[0]["request"]
        self.pristine = Pristine.of(
            {"messages": request["messages"], "tools": request["tools"]}, run.box.worktree
        )
        log.info("OpenCode's pristine session: %d system message(s), %d tools", len(self.pristine.system),
                 len(arr(request["tools"])))  # fmt: skip

    def end_edge(self, edge_id: str) -> None:
        # Idempotent: the last turn ends the edge here, and run_edge calls it again for an edge that stopped
        # early (a Teacher outage or a full context after turn 1, a broken workspace).
        with self._lock:
            st = self._edges.pop(edge_id, None)
        if st is not None:
            self._kill(st)
        self.proxy.drop(edge_id)

    @staticmethod
    def _counted_tools(acc: TurnEvents) -> list[ToolEvent]:
        """Tool calls up to and including the turn's `coral eval` (later ones were cut by the interrupt)."""
        out = []
        for t in acc.tools:
            out.append(t)
            if acc.eval_call and t.call_id == acc.eval_call:
                break
        return out
