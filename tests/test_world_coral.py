"""What the Teacher is shown equals what the real Coral shows (../shared/coral, installed by scripts/install_coral.sh):
CORAL.md, the start prompt, the manager's turn prompts over a run of evals, `coral eval`'s block and exit code from a
real `coral eval` graded by Coral's own daemon, the daemon's statuses."""

from __future__ import annotations

import json
import random
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from helpers.coral import CORAL_SRC, coral_python, coral_run, coral_settings, needs_coral

from sftree.settings import CoralSettings, section_settings
from sftree.world.counters import CoralCounters, advance, daemon_status
from sftree.world.task import load_coral_task
from sftree.world.world import World, open_world

pytestmark = [needs_coral, pytest.mark.coral]

EXAMPLES = CORAL_SRC / "examples"


@pytest.fixture(scope="module")
def install():
    from sftree.world.locate import locate

    return locate(coral_settings())


@pytest.fixture(scope="module")
def cp(install):
    spec = load_coral_task(EXAMPLES / "circle_packing", "circle_packing")
    w = World(spec, agent_id="agent-1", agents=1, install=install)
    yield w
    w.close()


MD_SCRIPT = """
import sys, json, yaml
from coral.config import CoralConfig
from coral.template.coral_md import generate_coral_md
data = yaml.safe_load(open(sys.argv[1]))
data.setdefault("agents", {})["runtime"] = "opencode"; data["agents"].pop("model", None)
data["agents"]["count"] = int(sys.argv[3])
cfg = CoralConfig.from_dict(data)
sys.stdout.write(generate_coral_md(cfg, sys.argv[2], single_agent=sys.argv[3] == "1", shared_dir=".opencode"))
"""


@pytest.mark.parametrize("task", ["circle_packing", "kernel_builder"])
@pytest.mark.parametrize("agents", [1, 3])
def test_instructions_equal_generate_coral_md(install, task, agents):
    spec = load_coral_task(EXAMPLES / task, task)
    w = World(spec, agent_id="agent-2", agents=agents, install=install)
    try:
        got = w.instructions()
    finally:
        w.close()
    want = coral_run(MD_SCRIPT, str(EXAMPLES / task / "task.yaml"), "agent-2", str(agents))
    assert got == want
    assert ("## Tips" in got) and len(got.splitlines()) > 200
    if agents == 1:  # the two variants differ
        multi = coral_run(MD_SCRIPT, str(EXAMPLES / task / "task.yaml"), "agent-2", "3")
        assert multi != got


START_SCRIPT = """
import sys, subprocess, tempfile
from pathlib import Path
import coral.agent.builtin.opencode as oc
seen = []
class P:
    def __init__(self, cmd, *a, **k): seen.append(cmd); self.pid = -1; self.returncode = 0; self.stdout = None; self.stderr = None
    def poll(self): return 0
    def wait(self, timeout=None): return 0
oc.subprocess.Popen = P
with tempfile.TemporaryDirectory() as t:
    wt = Path(t) / "w"; wt.mkdir(); (wt / ".coral_agent_id").write_text("agent-1")
    h = oc.OpenCodeRuntime().start(worktree_path=wt, coral_md_path=wt / "AGENTS.md", log_dir=Path(t) / "logs",
                                   resume_session_id=sys.argv[1] or None)
    h.process = None
sys.stdout.write(seen[0][-1])
"""


def test_start_and_resume_prompts_are_the_opencode_runtimes(cp):
    assert cp.start_prompt() == coral_run(START_SCRIPT, "")
    assert cp.start_prompt(resume=True) == coral_run(START_SCRIPT, "s1")
    assert cp.restart_prompt(CoralCounters("agent-1")) == coral_run(START_SCRIPT, "s1")  # no attempt yet


# ---- the manager's turn prompts over a run ------------------------------------------------------------------
MANAGER_SCRIPT = """
import json, sys, signal, tempfile
from pathlib import Path
from types import SimpleNamespace
import yaml
from coral.config import CoralConfig
from coral.agent.manager import AgentManager
from coral.hub.heartbeat import default_global_actions, default_local_actions, write_agent_heartbeat, write_global_heartbeat
data = yaml.safe_load(open(sys.argv[1])); seq = json.load(open(sys.argv[2])); agents = int(sys.argv[3])
data.setdefault("agents", {})["runtime"] = "opencode"; data["agents"].pop("model", None); data["agents"]["count"] = agents
cfg = CoralConfig.from_dict(data); cfg.agents.timeout = 0
t = tempfile.mkdtemp(); cd = Path(t) / ".coral"; (cd / "public" / "attempts").mkdir(parents=True)
write_global_heartbeat(cd, default_global_actions(cfg))
class H:
    def __init__(self, a): self.agent_id = a; self.alive = True; self.log_path = Path(t) / f"{a}.log"; self.log_path.write_text(""); self.process = None
m = AgentManager(cfg); m.paths = SimpleNamespace(coral_dir=cd)
ids = [f"agent-{i + 1}" for i in range(agents)]
for a in ids:
    write_agent_heartbeat(cd, a, default_local_actions(cfg))
m.handles = [H(a) for a in ids]
out = {}; i = [0]
def interrupt(idx, prompt, prompt_source=None):
    out[i[0] - 1] = prompt
    return m.handles[idx]
def wait(timeout=None):  # between ticks: the daemon finalizes the next attempt
    if i[0] >= len(seq):
        return True
    rec = seq[i[0]]
    (cd / "public" / "attempts" / (rec["commit_hash"] + ".json")).write_text(json.dumps(rec))
    (cd / "public" / "eval_count").write_text(str(i[0] + 1))
    i[0] += 1
    return False
m._interrupt_and_resume = interrupt; m._write_agent_pids = lambda: None
m._stop_event = SimpleNamespace(wait=wait, set=lambda: None, is_set=lambda: False)
m._running = True
signal.signal = lambda *a, **k: None
m.monitor_loop(check_interval=0)
print(json.dumps({str(k): v for k, v in out.items()}))
"""


def _record(i, agent, score, cls=None, feedback=""):
    rec = {
        "commit_hash": f"{i:04d}" + "ab" * 18,
        "agent_id": agent,
        "title": f"try {i}",
        "score": score,
        "status": "improved" if score is not None else "crashed",
        "parent_hash": None,
        "timestamp": f"2026-05-01T10:{i // 60:02d}:{i % 60:02d}+00:00",
        "feedback": feedback,
    }
    if cls:
        rec["metadata"] = {"budget_class": cls}
    return rec


def _run(n_root, agents, seed):
    rng = random.Random(seed)
    seq = []
    for i in range(n_root + 26):
        agent = f"agent-{rng.randrange(agents) + 1}" if i < n_root else "agent-1"
        r = rng.random()
        score = None if r < 0.15 else round(rng.choice([0.5, 0.6, 0.6, 0.7, rng.random()]), 3)
        cls = "tune" if 0.15 <= r < 0.25 else ("grader_error" if r > 0.95 else None)
        if cls == "grader_error":
            score = None
        seq.append(_record(i, agent, score, cls, feedback=f"feedback {i}" if i % 3 else ""))
    return seq


@pytest.mark.parametrize("n_root, agents, seed", [(0, 1, 1), (7, 2, 2), (13, 3, 3)])
def test_turn_prompts_equal_the_managers_over_a_run(install, tmp_path, n_root, agents, seed):
    """One real AgentManager.monitor_loop sees every eval of a run as the daemon finalizes them; sftree starts
    from the first n_root of them (the root snapshot) and renders each later eval's prompt from its counters."""
    seq = _run(n_root, agents, seed)
    (tmp_path / "seq.json").write_text(json.dumps(seq))
    task_yaml = EXAMPLES / "circle_packing" / "task.yaml"
    want = json.loads(coral_run(MANAGER_SCRIPT, str(task_yaml), str(tmp_path / "seq.json"), str(agents)))
    spec = load_coral_task(EXAMPLES / "circle_packing", "circle_packing")
    w = World(spec, agent_id="agent-1", agents=agents, install=install)
    try:
        c = CoralCounters.from_root(seq[:n_root], agent_id="agent-1", eval_count=n_root, direction="maximize")
        fired_any = set()
        for i in range(n_root, len(seq)):
            tp = w.turn_prompt(c, seq[i])
            fired_any |= set(tp.fired)
            if str(i) in want:
                assert tp.text == want[str(i)], f"eval {i}"
                assert tp.fired
            else:
                assert tp.fired == (), f"eval {i}: Coral would not interrupt"
                assert tp.text.startswith("## Eval #")
            c = tp.counters
    finally:
        w.close()
    assert {"reflect", "consolidate", "lint_wiki"} <= fired_any


def test_restart_prompt_is_the_managers_score_prompt(cp):
    rec = _record(3, "agent-1", 0.61, feedback="ok")
    c = advance(CoralCounters("agent-1", global_evals=40), rec, "maximize")
    script = """
import sys, json, yaml
from types import SimpleNamespace
from coral.config import CoralConfig
from coral.agent.manager import AgentManager
data = yaml.safe_load(open(sys.argv[1])); data.setdefault("agents", {})["runtime"] = "opencode"; data["agents"].pop("model", None)
data["agents"]["count"] = 1
print(AgentManager._build_score_prompt(SimpleNamespace(config=CoralConfig.from_dict(data)), json.loads(sys.argv[2]), 41), end="")
"""
    want = coral_run(script, str(EXAMPLES / "circle_packing" / "task.yaml"), json.dumps(rec))
    assert cp.restart_prompt(c) == want and want.startswith("Eval #41: score=0.6100000000")


# ---- `coral eval` from a real Coral run ---------------------------------------------------------------------
GRADER = """
from pathlib import Path
from coral.grader import TaskGrader
class Grader(TaskGrader):
    def evaluate(self):
        v = (Path(self.codebase_path) / "v.txt").read_text().strip()
        if v == "boom":
            raise RuntimeError("grader blew up")
        if v == "none":
            return self.fail("no score: the value is none", feedback="try again")
        return self.score(float(v), f"value {v}", feedback="bundle feedback")
"""


@pytest.fixture
def coral_run_dir(tmp_path):
    run = tmp_path / "run"
    repo = run / "repo"
    repo.mkdir(parents=True)
    cd = run / ".coral"
    (cd / "private" / "eval").mkdir(parents=True)
    (cd / "private" / "eval" / "grader.py").write_text(GRADER)
    (cd / "public" / "attempts").mkdir(parents=True)
    (cd / "config.yaml").write_text(
        yaml.safe_dump(
            {"task": {"name": "t", "description": "d"}, "grader": {"timeout": 60, "direction": "maximize"}}
        )
    )
    env = {
        "GIT_AUTHOR_NAME": "a",
        "GIT_AUTHOR_EMAIL": "a@b",
        "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@b",
    }
    (repo / ".gitignore").write_text(".coral_dir\n.coral_agent_id\n")
    (repo / ".coral_dir").write_text(str(cd))
    (repo / ".coral_agent_id").write_text("agent-1")
    (repo / "v.txt").write_text("0\n")
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "seed"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True, env={**env, "PATH": "/usr/bin:/bin"})
    return repo, cd, env


def _coral_eval(repo, cd, env, value, message):
    """A real `coral eval -m` (the CLI waits for the grade) with Coral's daemon finalizing it meanwhile."""
    if value is not None:
        (repo / "v.txt").write_text(value + "\n")
    cli = subprocess.Popen(
        [str(Path(coral_python()).parent / "coral"), "eval", "-m", message],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "PATH": "/usr/bin:/bin"},
    )
    daemon = "import sys, time\nfrom coral.grader.daemon import process_pending_once\n" + (
        "for _ in range(600):\n    if process_pending_once(sys.argv[1]): break\n    time.sleep(0.05)\n"
    )
    if value is not None:
        coral_run(daemon, str(cd))
    out, err = cli.communicate(timeout=120)
    return out, err, cli.returncode


def test_eval_block_and_exit_code_equal_coral_eval(install, coral_run_dir):
    repo, cd, env = coral_run_dir
    spec = load_coral_task(EXAMPLES / "circle_packing", "circle_packing")
    w = World(spec, agent_id="agent-1", install=install)
    try:
        for n, (value, msg) in enumerate(
            [
                ("0.5", "first"),
                ("0.25", "worse"),
                ("0.5", "tie"),
                ("none", "null"),
                ("boom", "crash"),
                ("0.75", "better"),
            ],
            1,
        ):
            out, err, rc = _coral_eval(repo, cd, env, value, msg)
            files = sorted(
                cd.glob("public/attempts/*.json"), key=lambda p: json.loads(p.read_text())["timestamp"]
            )
            assert files, (out, err, rc)
            rec = json.loads(files[-1].read_text())
            got = w.eval_output(rec, eval_count=n)
            assert got.stdout.splitlines() == out.splitlines(), value
            assert (got.stdout, got.stderr, got.rc) == (out, err, rc), (value, out, err)
        statuses = [
            json.loads(p.read_text())["status"]
            for p in sorted(
                cd.glob("public/attempts/*.json"), key=lambda p: json.loads(p.read_text())["timestamp"]
            )
        ]
        assert statuses == ["improved", "regressed", "baseline", "crashed", "crashed", "improved"]
        out, err, rc = _coral_eval(repo, cd, env, None, "nothing changed")  # nothing to commit
        got = w.eval_output(None, error="nothing_to_commit")
        assert (got.stdout, got.stderr, got.rc) == (out, err, rc) and rc == 1 and "Error:" in err
    finally:
        w.close()


def test_parse_eval_is_corals(cp):
    a = cp.parse_eval(["-m", "tuned", "--tune", "--timeout", "30"])
    assert (a.message, a.tune, a.timeout, a.wait) == ("tuned", True, 30.0, True)
    assert cp.parse_eval(["--no-wait", "-m", "x"]).wait is False
    bad = cp.parse_eval(["--bogus"])
    assert (
        bad.rc == 2
        and "the following arguments are required: -m/--message" in bad.stderr
        or "unrecognized" in bad.stderr
    )


# ---- statuses: sftree's rule against Coral's daemon ---------------------------------------------------------
STATUS_SCRIPT = """
import json, sys, tempfile
from pathlib import Path
from coral.grader.daemon import _compute_status
seq = json.load(open(sys.argv[1])); minimize = sys.argv[2] == "minimize"
cd = Path(tempfile.mkdtemp()) / ".coral"; (cd / "public" / "attempts").mkdir(parents=True)
out = []
for rec in seq:
    out.append(_compute_status(rec["score"], rec["agent_id"], rec["commit_hash"], cd, minimize))
    (cd / "public" / "attempts" / (rec["commit_hash"] + ".json")).write_text(json.dumps(rec))
print(json.dumps(out))
"""


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_statuses_equal_the_daemons(tmp_path, direction):
    rng = random.Random(direction)
    seq = []
    for i in range(80):
        score = None if rng.random() < 0.15 else rng.choice([1.0, 2.0, 2.0, 3.0, round(rng.uniform(0, 4), 2)])
        seq.append(
            _record(i, rng.choice(["agent-1", "agent-2"]), score, "tune" if rng.random() < 0.1 else None)
        )
    (tmp_path / "seq.json").write_text(json.dumps(seq))
    want = json.loads(coral_run(STATUS_SCRIPT, str(tmp_path / "seq.json"), direction))
    counters = {a: CoralCounters(a) for a in ("agent-1", "agent-2")}
    got = []
    for rec in seq:
        c = counters[rec["agent_id"]]
        got.append(c.status_for(rec["score"], direction))
        counters[rec["agent_id"]] = advance(c, rec, direction)
    assert got == want
    assert {"improved", "baseline", "regressed", "crashed"} <= set(want)
    assert daemon_status(None, 1.0, direction) == "crashed"


def test_open_world_from_config(install):
    spec = load_coral_task(EXAMPLES / "kernel_builder", "kernel_builder")
    w = open_world(coral_settings(), spec, run_dir=None, agent_id="agent-1")
    try:
        assert w.kind == "coral" and w.describe()["coral"]["version"]
        cfg = yaml.safe_load(w.config_yaml())
        assert cfg["grader"]["direction"] == "minimize" and cfg["agents"]["runtime"] == "opencode"
        oc = json.loads(w.opencode_json())
        assert "/workspace/results/kernel_builder/.coral/private/**" in json.dumps(oc)
    finally:
        w.close()


def test_a_broken_configured_coral_is_named(tmp_path):
    from sftree.errors import InputError
    from sftree.world.locate import locate

    with pytest.raises(InputError, match="coral.python: .*cannot import coral"):
        locate(section_settings(CoralSettings, {"python": "/bin/false"}))
    assert textwrap.dedent("x") == "x"
    assert isinstance(Path(coral_python()), Path)
