"""One logical edge (section 1.1/1.4): fork a node, run two rollout turns in one session, measure them.

`run_edge` is what the search calls; it is blocking and safe to run from several threads at once (each edge has
its own worktree, knowledge index, coral socket and session copy). The soft-score formulas live in
`search/scoring.py`; this module reports the raw ingredients (`EdgeResult`) and the regressed rate, which needs the
turn sequence (`records.scores.regressed_rate`, the one definition):

    regressed_rate = share of the two turns whose score is worse than the score the turn started from
                     (turn 1: the parent's score; turn 2: turn 1's score), on oriented scores
                     (minimize tasks negated); a turn with no numeric score counts as regressed;
                     a numeric turn whose start score is None is not regressed.

**Choice**: `EdgeResult.score` is the raw score of the best turn by the task's direction (the max for maximize
tasks, the min for minimize tasks), i.e. the max of the oriented scores, reported unoriented like every score
in tree.json.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sftree.agents.base import AgentBackend, Teacher, TurnOutcome
from sftree.agents.turn_end import TEACHER_DOWN
from sftree.errors import InputError
from sftree.fileio import write_json_atomic, write_text_atomic
from sftree.jsontypes import JSONObject
from sftree.records.root import read_root_meta
from sftree.records.scores import best_of, regressed_rate
from sftree.records.steplog import StepRecorder, edge_steps
from sftree.records.tree import TurnEnd
from sftree.runtime import diskquota
from sftree.runtime.edgebox import EdgeBox, own_socket_dir
from sftree.runtime.folderreader import Quota
from sftree.runtime.objects import flatten
from sftree.runtime.store import TreeStore
from sftree.runtime.workspace import EdgeWorkspace, NodeState, write_world
from sftree.search.collaborators import Grader, Store, World
from sftree.search.result import EdgeResult, TurnResult
from sftree.settings import Settings, TeacherSettings
from sftree.world.coral_command import CoralRuntime, CoralServer

if TYPE_CHECKING:
    from sftree.runtime.diskquota import DiskQuota
    from sftree.world.counters import CoralCounters
    from sftree.world.root import RootContext

log = logging.getLogger(__name__)


# ---- pure functions ----------------------------------------------------------------------------------------
def tool_error_rate(calls: int, errors: int) -> float:
    return errors / calls if calls else 0.0


# ---- context -----------------------------------------------------------------------------------------------
@dataclass
class EdgeContext:
    """Everything an edge needs, built once per tree (`EdgeContext.create`)."""

    tree_dir: Path
    store: Store
    root_state: NodeState
    teacher: Teacher
    agent: AgentBackend
    task_cfg: dict[str, object]
    direction: str
    tree_name: str
    world: World  # Coral's texts, CLI and counting (the installed Coral or stand-ins)
    mode: str  # the sandbox: bwrap | none
    quota: Quota  # what one workspace may hold (config `agent.quota`)
    tmp_bytes: int  # the sandbox's /tmp (`agent.quota.tmp_mib`, `tmp_inodes`)
    tmp_inodes: int
    grade_quota: DiskQuota  # what one grading may write
    keep_workspaces: bool
    root_counters: CoralCounters | None = None  # Coral's counters at the root (from its attempt records)
    hidden: list[Path] = field(default_factory=list)
    _closers: list[Callable[[], None]] = field(default_factory=list)
    _probe_lock: threading.Lock = field(default_factory=threading.Lock)
    _probed: bool = False

    @property
    def agent_id(self) -> str:
        """The Student's agent the root snapshot belongs to: the Teacher continues its run."""
        return self.world.agent_id

    @property
    def run_dir(self) -> str:
        """Where the sandbox shows the edge's Coral run directory (agent.run_dir)."""
        return self.world.run_dir

    @classmethod
    def create(
        cls,
        tree_dir: str | os.PathLike[str],
        root_dir: str | os.PathLike[str],
        settings: Settings,
        task_cfg: dict[str, object],
        *,
        wait_ready: bool = True,
    ) -> EdgeContext:
        """Seed (or reopen) the store, open the Teacher's world, start teacher-sim (`teacher.sim`) or
        llama-server (`teacher.launch`), wait."""
        from sftree.agents import make_agent
        from sftree.runtime.sandbox import private_home_paths, resolve_mode
        from sftree.teacher.client import TeacherClient
        from sftree.world.task import load_task
        from sftree.world.world import open_world as open_coral_world

        tree_dir = Path(tree_dir).resolve()
        store, root_state = TreeStore.create(tree_dir, root_dir, task_cfg)
        spec = load_task(task_cfg, str(task_cfg.get("name", "task")))
        root = root_context(store, root_state, Path(root_dir))
        world = open_coral_world(
            settings.coral,
            spec,
            run_dir=settings.agent.run_dir,
            agent_id=root.agent_id,
            agents=root.agents,
            root_heartbeat=root.heartbeat,
        )
        closers: list[Callable[[], None]] = [world.close]
        teacher = TeacherClient.from_settings(start_teacher(settings.teacher, tree_dir, closers))
        if wait_ready:
            teacher.wait_ready()
        agent = make_agent(settings, teacher=teacher, world=world)
        quota = settings.agent.quota
        hidden = [tree_dir, *private_home_paths()]
        hidden += [Path(str(task_cfg[k])).resolve() for k in ("task_dir", "coral_task") if task_cfg.get(k)]
        if settings.results:  # relative to the job's cwd, as Snakemake runs it
            hidden.append(Path(settings.results).resolve())
        return cls(
            tree_dir=tree_dir,
            store=store,
            root_state=root_state,
            teacher=teacher,
            agent=agent,
            task_cfg=task_cfg,
            direction=spec.direction,
            tree_name=Path(root_dir).name,
            world=world,
            root_counters=root.counters(spec.direction),
            mode=resolve_mode(settings.agent.sandbox),
            quota=Quota.from_settings(quota),
            tmp_bytes=quota.tmp_mib << 20,
            tmp_inodes=quota.tmp_inodes,
            grade_quota=diskquota.grade_quota(quota),
            hidden=hidden,
            keep_workspaces=settings.search.keep_workspaces,
            _closers=closers,
        )

    def counters(self, state: NodeState) -> CoralCounters:
        """The host's Coral counters at a node (the root's, else what its edge left)."""
        from sftree.world.counters import CoralCounters

        if state.counters:
            return CoralCounters.from_dict(state.counters)
        if self.root_counters is None:  # (create() reads them from the root's attempt records)
            raise InputError("the root's Coral counters are unknown: the edge context has no root_counters")
        return self.root_counters

    def close(self) -> None:
        """Stop a teacher-sim or llama-server this context started; remove worktrees unless keep_workspaces."""
        if not self.keep_workspaces:
            self.store.close()
        self.store.pack_loose()
        self.agent.close()
        self.teacher.close()  # the client's fleet watcher (behind sglang-router)
        for stop in self._closers:
            stop()
        self._closers.clear()


def start_teacher(
    teacher: TeacherSettings, tree_dir: Path, closers: list[Callable[[], None]]
) -> TeacherSettings:
    """Start teacher-sim (`teacher.sim`) or a llama-server (`teacher.launch`) for this job, its stop added to
    `closers`; the settings with `base_url` at it (unchanged when neither is set)."""
    stop: Callable[[], None]
    if teacher.sim is not None:
        from sftree.teacher.sim.server import start_teacher_sim

        url, stop = start_teacher_sim(port=0, **dict(teacher.sim))
    elif teacher.launch is not None:  # a real llama-server for this job (docs/real_teacher.md)
        from sftree.teacher.llm_server import LaunchSpec, start_llm_server

        launch = LaunchSpec.from_config(teacher.launch)
        if launch.log_file is None:
            launch.log_file = tree_dir / "llama-server.log"
        url, stop = start_llm_server(launch)
    else:
        return teacher
    closers.append(stop)
    return dataclasses.replace(teacher, base_url=url)


def root_context(store: Store, state: NodeState, root_dir: Path) -> RootContext:
    """What the tree takes from its root for Coral's world (`sftree.world.root.root_context`): the agent id from
    the root's metadata (select-roots wrote it), the attempt records and heartbeat files from the store's root
    commit (read by the host without following links when the store was seeded)."""
    from sftree.world.root import root_context as from_files

    meta: JSONObject
    try:
        meta = read_root_meta(root_dir).to_dict()
    except InputError:  # explore's preflight reports a bad metadata.json
        meta = {}
    db = store.knowledge
    files = flatten(db, db.commit_tree(state.knowledge_commit))
    wanted = sorted(
        p
        for p, (mode, _oid) in files.items()
        if p.startswith(("attempts/", "heartbeat/")) and mode != "120000"
    )
    blobs = dict(zip(wanted, (data for _k, data in db.read_many([files[p][1] for p in wanted])), strict=True))
    return from_files(meta, blobs)


# ---- the edge ----------------------------------------------------------------------------------------------
_TURNS = 2
LAST_TURN = "last_turn.json"  # edges/<edge>/: how the edge's last turn ended, by the host's records


def open_world(
    ctx: EdgeContext, parent: NodeState, edge_id: str, uid: int | None
) -> tuple[EdgeWorkspace, CoralRuntime, CoralServer, EdgeBox]:
    """The edge's world, ready for its first turn: (workspace, coral runtime, its server (started), sandbox).
    The caller stops the server and closes the workspace."""
    from sftree.runtime.sandbox import CORAL_MOUNT
    from sftree.world.world import standin_cli_source

    w = ctx.world
    sandboxed = ctx.mode == "bwrap"
    inside = w.run_dir if sandboxed else None
    ws = ctx.store.fork(parent, edge_id, agent_id=w.agent_id, inside=inside, uid=uid, quota=ctx.quota)
    runtime = CoralRuntime(
        ws, w, ctx.task_cfg, ctx.counters(parent), sandbox=ctx.mode, grade_quota=ctx.grade_quota
    )
    server = CoralServer(runtime)
    server.start()
    standin = (
        server.bin_dir / "coral_standin.py"
    )  # the project is hidden in the sandbox: a copy beside the client
    standin.write_text(standin_cli_source(), encoding="utf-8")
    own_socket_dir(server.dir, uid)
    mount = CORAL_MOUNT if sandboxed else None
    cli = w.cli_command([], f"{CORAL_MOUNT}/bin/{standin.name}" if sandboxed else str(standin))
    box = EdgeBox(
        ws, ctx.mode, coral_dir=server.dir, coral_env={**server.env(mount), "CORAL_CLI": json.dumps(cli)},
        hidden=ctx.hidden, tmp_bytes=ctx.tmp_bytes, tmp_inodes=ctx.tmp_inodes, ro_extra=[(Path(r), r) for r in w.sandbox_roots()],
    )  # fmt: skip
    # (Coral's `.opencode/opencode.json` is the OpenCode backend's to place, with its own provider config.)
    write_world(ws, {"AGENTS.md": w.instructions().encode()})
    (ws.paths.host / "config.yaml").write_text(w.config_yaml(), encoding="utf-8")
    problem = box.init_repo()
    if problem:
        log.warning("edge %s: the worktree's own git repository was not made: %s", edge_id, problem)
    return ws, runtime, server, box


PROBE = "probe"  # the edge id of the host's own fresh session at the root (`probe_agent`)


def probe_agent(ctx: EdgeContext) -> None:
    """Let a backend that asks for it (`needs_probe`) see a fresh session at the root, in a world laid out as
    every root edge's, before any Teacher acts: OpenCode's pristine system prompt and tools (agents/chain.py).
    Nothing of it is kept: no commit, no record, its folder removed. Idempotent."""

    if not ctx.agent.needs_probe:
        return
    with ctx._probe_lock:  # once per tree, before the first edge's first turn, whoever asks first
        if not ctx._probed:
            _probe(ctx)
            ctx._probed = True


def _probe(ctx: EdgeContext) -> None:
    from sftree.agents.base import TurnRun
    from sftree.runtime.sandbox import UIDS

    uid = UIDS.acquire() if ctx.mode == "bwrap" else None
    ws: EdgeWorkspace | None = None
    server: CoralServer | None = None
    try:
        ws, runtime, server, box = open_world(ctx, ctx.root_state, PROBE, uid)
        recorder = StepRecorder(ws.paths.edge / "probe.jsonl", PROBE)
        run = TurnRun(
            workspace=ws, box=box, coral=runtime, messages=[], prompt=ctx.world.start_prompt(), turn=1,
            headers={"X-Sftree-Tree": ctx.tree_name, "X-Sftree-Edge": PROBE}, recorder=recorder,
            instructions=ctx.world.instructions(),
        )  # fmt: skip
        try:
            ctx.agent.prepare(run)
        finally:
            recorder.close()
    finally:
        if server is not None:
            server.stop()
        ctx.agent.end_edge(PROBE)
        if ws is not None:
            ws.close()
        UIDS.release(uid)


def first_prompt(
    ctx: EdgeContext, messages: Sequence[object], last: Mapping[str, object] | None, counters: CoralCounters
) -> str:
    """The prompt that opens a turn: a fresh session's start prompt; after a turn whose first eval was graded,
    Coral's manager's header and heartbeats (from the counters as they were before that eval); after a turn
    without one, Coral's restart prompt. Built from the host's records alone (`last_turn`), never the session."""
    from sftree.world.counters import CoralCounters

    w = ctx.world
    if not messages:
        return w.start_prompt()
    ev = (last or {}).get("eval")
    record, before = (ev.get("record"), ev.get("counters_before")) if isinstance(ev, dict) else (None, None)
    if record and before:
        return w.turn_prompt(CoralCounters.from_dict(before), record).text
    return w.restart_prompt(counters)


@dataclass
class _Session:
    """What one edge's session came to: its turns, and why it stopped early (if it did)."""

    turns: list[TurnResult] = field(default_factory=list)
    last: JSONObject | None = None  # the host's record of the last turn (the next turn's prompt's source)
    child: NodeState | None = None
    error: str | None = None
    overflow: str | None = None  # why the session could not go on (context_overflow), if it could not
    tampered: str | None = None
    messages: list[JSONObject] = field(default_factory=list)  # the session as the agent left it

    def unrun_ending(self) -> TurnEnd:
        """How a turn that never ran is recorded: after a Teacher outage it is one; after a broken workspace it
        is not (the search treats only the first as a reason to stop)."""
        if self.tampered:
            return "tampered"
        if any(t.ended in TEACHER_DOWN for t in self.turns):
            return "teacher_error"
        return "context_overflow" if self.overflow else ("edge_error" if self.error else "no_eval")


def run_edge(
    ctx: EdgeContext,
    parent: NodeState,
    edge_id: str,
    parent_score: float | None,
    *,
    depth: int,
    attempt: int,
    eval_count: int | None = None,
) -> EdgeResult:
    """Fork `parent`, run two rollout turns in one session, save the session, return the measurements.

    Never raises for Teacher or workspace trouble: the edge is returned with `error` set and failed turns.
    Coral's counts (the eval number, the agent's best, the plateau) come from the node's counters
    (`NodeState.counters`; the root's from its attempt records); `eval_count` is kept for callers that pass it.
    """
    from sftree.runtime.sandbox import UIDS

    t0 = time.monotonic()
    edge_dir = ctx.tree_dir / "edges" / edge_id
    edge_dir.mkdir(parents=True, exist_ok=True)
    transcript = ctx.tree_dir / edge_steps(edge_id)
    session = _Session()
    ws: EdgeWorkspace | None = None
    server: CoralServer | None = None
    runtime: CoralRuntime | None = None
    uid = UIDS.acquire() if ctx.mode == "bwrap" else None
    recorder = StepRecorder(transcript, edge_id)
    try:
        probe_agent(ctx)  # OpenCode's pristine session, once per tree (explore asks for it before any edge)
        ws, runtime, server, box = open_world(ctx, parent, edge_id, uid)  # fork
        headers = {
            "X-Sftree-Tree": ctx.tree_name,
            "X-Sftree-Edge": edge_id,
            "X-Sftree-Depth": str(depth),
            "X-Sftree-Attempt": str(attempt),
            "X-Sftree-Session": parent.session or "fresh",
        }
        _run_turns(ctx, session, ws, box, runtime, recorder, headers, edge_id)
        _persist_session(ctx, session, ws, runtime, edge_dir, edge_id)
    except Exception as exc:  # noqa: BLE001 - an edge never takes the search down; the error is recorded
        log.exception("edge %s failed", edge_id)
        session.error = f"{type(exc).__name__}: {exc}"
    finally:
        recorder.close()
        if server is not None:
            server.stop()
        try:
            ctx.agent.end_edge(edge_id)
        except Exception:  # noqa: BLE001 - releasing must not turn a finished edge into a failed one
            log.exception("edge %s: releasing the agent's per-edge holdings failed", edge_id)
    while len(session.turns) < _TURNS:
        session.turns.append(_unrun_turn(len(session.turns) + 1, session))
    try:
        _write_diffs(ctx, parent, session.child, edge_dir)
    finally:
        if ws is not None and not ctx.keep_workspaces:
            ws.close()
        UIDS.release(uid)
    result = _measure(ctx, session, edge_id, parent_score, transcript, edge_dir, recorder, runtime, t0)
    log.info(
        "edge %s: score=%s valid=%s steps=%d tool_errors=%d/%d tokens=%d %.1fs%s",
        edge_id,
        result.score,
        result.valid,
        result.steps,
        result.tool_errors,
        result.tool_calls,
        result.tokens,
        result.wall_s,
        f" error={session.error}" if session.error else "",
    )
    return result


def _run_turns(
    ctx: EdgeContext,
    session: _Session,
    ws: EdgeWorkspace,
    box: EdgeBox,
    runtime: Grader,
    recorder: StepRecorder,
    headers: dict[str, str],
    edge_id: str,
) -> None:
    """The edge's turns in one session, each ending in the host's grading; stops early when the session cannot
    go on (forged, the Teacher down, the context full)."""
    from sftree.agents.base import TurnRun
    from sftree.agents.prompts import turn_record

    instructions = ctx.world.instructions()
    messages = session.messages = list(ws.session)  # the agent adds to it as the session goes on
    session.last = ws.last_turn  # the host's record of the parent's last turn (never text from the session)
    for turn in range(1, _TURNS + 1):
        run = TurnRun(
            workspace=ws,
            box=box,
            coral=runtime,
            messages=messages,
            prompt=first_prompt(ctx, messages, session.last, runtime.counters),
            turn=turn,
            headers={**headers, "X-Sftree-Turn": str(turn)},
            recorder=recorder,
            instructions=instructions,
            context_used=session.turns[-1].tokens if session.turns else 0,
            final=turn == _TURNS,
        )
        runtime.open_turn()
        outcome = ctx.agent.run_turn(run)
        ev = outcome.eval
        if ev is not None and ev.commit and outcome.ended != "tampered":
            # The turn's end state is what its eval graded, whatever ran after it (DESIGN.md).
            state_hash = (ev.record or {}).get("shared_state_hash")
            restored = ws.restore(ev.commit, state_hash if isinstance(state_hash, str) else None)
            if restored:
                log.warning("edge %s turn %d: %s changed after the eval, put back", edge_id, turn,
                            " and ".join(restored))  # fmt: skip
        session.turns.append(_turn_result(turn, outcome))
        if outcome.ended == "tampered":
            session.tampered = outcome.error or "tampered"
            return  # the session is not the one the Teacher and the host made: nothing of it goes on
        session.last = turn_record(ev, outcome.ended)
        ws.commit_knowledge(f"sftree: {edge_id} turn {turn}")
        if outcome.ended in TEACHER_DOWN:  # teacher_error, teacher_stalled (agents/turn_end.py)
            session.error = outcome.error
            return  # the Teacher is down past the retry budget: a third request would fail too
        if outcome.ended == "context_overflow":
            session.overflow = outcome.error
            return  # the session is full: the next turn could not send a single request


def _turn_result(turn: int, outcome: TurnOutcome) -> TurnResult:
    ev = outcome.eval
    return TurnResult(
        turn=turn,
        score=ev.score if ev else None,
        eval_status=ev.status if ev else None,
        commit=ev.commit if ev else None,
        steps=outcome.steps,
        tool_calls=outcome.tool_calls,
        tool_errors=outcome.tool_errors,
        knowledge=outcome.knowledge,
        tokens=outcome.tokens,
        ended=outcome.ended,
        feedback=ev.feedback if ev else (outcome.error or ""),
        eval_number=ev.number if ev else None,
        error=outcome.error,
        compacted=bool(outcome.compacted),
    )


def _unrun_turn(turn: int, session: _Session) -> TurnResult:
    return TurnResult(
        turn=turn,
        score=None,
        eval_status=None,
        commit=None,
        steps=0,
        tool_calls=0,
        tool_errors=0,
        knowledge=False,
        tokens=0,
        ended=session.unrun_ending(),
        error=session.error or session.overflow,
    )


def _persist_session(
    ctx: EdgeContext, session: _Session, ws: EdgeWorkspace, runtime: Grader, edge_dir: Path, edge_id: str
) -> None:
    """Save the session and its last turn's record, and make the child's state; a forged session makes none."""
    if session.tampered is not None:
        session.error = f"tampered: {session.tampered}"
        return
    session_rel = f"sessions/{edge_id}.json"
    write_json_atomic(edge_dir / LAST_TURN, session.last)  # before the session: a fork needs both
    write_json_atomic(ctx.tree_dir / session_rel, session.messages, indent=None)
    session.child = ws.state(session_rel, counters=runtime.counters.to_dict())


def _write_diffs(ctx: EdgeContext, parent: NodeState, child: NodeState | None, edge_dir: Path) -> None:
    """The edge's code and knowledge diffs against its parent (empty for an edge that made no child)."""
    for kind in ("code", "knowledge"):
        if child is None:
            text = ""
        elif kind == "code":
            text = ctx.store.diff(kind, parent.code_commit, child.code_commit)
        else:
            text = ctx.store.diff(kind, parent.knowledge_commit, child.knowledge_commit)
        write_text_atomic(edge_dir / f"{kind}.diff", text)


def _measure(
    ctx: EdgeContext,
    session: _Session,
    edge_id: str,
    parent_score: float | None,
    transcript: Path,
    edge_dir: Path,
    recorder: StepRecorder,
    runtime: Grader | None,
    t0: float,
) -> EdgeResult:
    """The edge's measurements (section 1.4's raw ingredients) from its turns."""
    turns = session.turns
    scores = [t.score for t in turns]
    calls = sum(t.tool_calls for t in turns)
    errors = sum(t.tool_errors for t in turns)
    wall = time.monotonic() - t0
    teacher_s = recorder.latency_s
    grader_s = runtime.grader_s if runtime is not None else 0.0
    return EdgeResult(
        edge_id=edge_id,
        turns=turns,
        score=best_of(scores, ctx.direction),
        valid=all(s is not None for s in scores),
        steps=sum(t.steps for t in turns),
        tool_calls=calls,
        tool_errors=errors,
        tool_error_rate=tool_error_rate(calls, errors),
        tokens=next((t.tokens for t in reversed(turns) if t.steps), 0),
        knowledge=all(t.knowledge for t in turns),
        regressed_rate=regressed_rate(parent_score, scores, ctx.direction),
        child_state=session.child,
        transcript=str(transcript.relative_to(ctx.tree_dir)),
        code_diff=str((edge_dir / "code.diff").relative_to(ctx.tree_dir)),
        knowledge_diff=str((edge_dir / "knowledge.diff").relative_to(ctx.tree_dir)),
        error=session.error,
        wall_s=wall,
        evals=sum(1 for t in turns if t.eval_number is not None),
        framework_s=max(0.0, wall - teacher_s - grader_s),
        teacher_s=teacher_s,
        grader_s=grader_s,
        tampered=session.tampered,
    )
