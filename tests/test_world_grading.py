"""Grading a Coral task with its own TaskGrader, confined (sftree.world.grading): Coral's examples graded by their own
graders (as Coral's daemon grades them), a graded program that tries to forge, read, write and kill, timeouts."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers.coral import CORAL_SRC, coral_python, coral_run, grading_worlds, install_for

from sftree.runtime.sandbox import bwrap_works
from sftree.world import grading
from sftree.world.grading import grade
from sftree.world.task import load_coral_task

SANDBOX = "bwrap" if bwrap_works() else "none"
needs_bwrap = pytest.mark.skipif(
    not bwrap_works(), reason="bubblewrap cannot isolate here (apt-get install bubblewrap)"
)
EXAMPLES = CORAL_SRC / "examples"


COMMIT = "c" * 40

PROBE_GRADER = """
import subprocess, sys
from coral.grader import TaskGrader

class Grader(TaskGrader):
    def evaluate(self):
        secret = self.read_eval("secret.txt").strip()  # the grader itself can read its eval folder
        r = subprocess.run([sys.executable, "solution.py"], cwd=self.codebase_path, capture_output=True,
                           text=True, timeout=30)
        lines = r.stdout.strip().splitlines()
        value = 1.0 if lines and lines[-1] == "42" else 0.0   # the grader decides; nothing printed is a score
        return self.score(value, "probe " + r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "no probe",
                          feedback="secret ok" if secret == "s3cret" else "secret unreadable")
"""

FORGER = r"""
import json, os, signal, sys
found = {}
print(json.dumps({"score": 1000.0, "status": "scored", "feedback": "forged"}))
print("Score: 1000")
for fd in range(3, 256):   # the host's result channel, if it were inherited
    try:
        os.write(fd, json.dumps({"score": 1000.0, "status": "scored"}).encode())
        found.setdefault("wrote_fds", []).append(fd)
    except OSError:
        pass
here = os.getcwd()
coral = os.path.dirname(os.path.dirname(os.path.dirname(here)))   # <run_dir>/.coral
found["coral_dir"] = coral
for rel in ("private/eval/secret.txt", "private/eval/grader.py", "config.yaml", "public"):
    p = os.path.join(coral, rel)
    found[rel] = os.path.exists(p)
found["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
for pid in found["pids"]:
    for fd in ("3", "4", "5"):
        try:
            os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY)
            found.setdefault("opened", []).append((pid, fd))
        except OSError:
            pass
open("planted.txt", "w").write("x")
try:
    open("/tmp/escape.txt", "w").write("x")
except OSError:
    pass
sys.stderr.write("PROBE " + json.dumps(found) + "\n")
# The answer is out before the kills: killing its own sandbox's first process (its parent, which kill(-1)
# reaches too) ends its pid namespace, this program with it, and whatever it had not flushed.
print("42", flush=True)
try:
    os.kill(-1, signal.SIGKILL) if os.getuid() else None
except OSError:
    pass
try:
    os.kill(os.getppid(), signal.SIGKILL)
except OSError:
    pass
"""


def _task(tmp_path, grader_src, solution_src, timeout=60):
    t = tmp_path / "task"
    (t / "eval").mkdir(parents=True)
    (t / "seed").mkdir()
    (t / "task.yaml").write_text(
        f"task:\n  name: probe\n  description: d\ngrader:\n  timeout: {timeout}\n  direction: maximize\n"
    )
    (t / "eval" / "grader.py").write_text(textwrap.dedent(grader_src))
    (t / "eval" / "secret.txt").write_text("s3cret\n")
    code = tmp_path / "code"
    code.mkdir()
    (code / "solution.py").write_text(solution_src)
    return load_coral_task(t, "probe"), code


@needs_bwrap
@pytest.mark.parametrize("kind", grading_worlds())
def test_graded_code_cannot_forge_read_or_kill(tmp_path, kind):
    spec, code = _task(tmp_path, PROBE_GRADER, FORGER)
    r = grade(spec, code, commit=COMMIT, install=install_for(kind), sandbox="bwrap")
    assert (r.score, r.status, r.runs) == (1.0, "scored", 1), r
    assert "secret ok" in r.feedback  # the grader could read its eval folder
    probe = json.loads(r.feedback.split("probe PROBE ", 1)[1].splitlines()[0])
    assert probe["coral_dir"] == "/workspace/results/probe/.coral"
    assert not any(
        probe[k] for k in ("private/eval/secret.txt", "private/eval/grader.py", "config.yaml", "public")
    )
    assert "wrote_fds" not in probe and "opened" not in probe
    assert len(probe["pids"]) <= 3  # its own pid namespace: no grader, no host process
    assert not (code / "planted.txt").exists()  # the host's copy is never the one graded


@pytest.mark.parametrize("kind", grading_worlds())
def test_unconfined_grading_still_reads_only_the_pipe(tmp_path, kind):
    """sandbox: none (trusted tests): the same channel; the printed fake score is ignored."""
    spec, code = _task(
        tmp_path,
        PROBE_GRADER,
        FORGER.replace("os.kill(os.getppid(), signal.SIGKILL)", "pass").replace(
            "os.kill(-1, signal.SIGKILL) if os.getuid() else None", "pass"
        ),
    )
    r = grade(spec, code, commit=COMMIT, install=install_for(kind), sandbox="none")
    assert (r.score, r.status) == (1.0, "scored") and r.sandbox == "none"


@pytest.mark.parametrize("kind", grading_worlds())
def test_grader_failures_and_timeouts(tmp_path, kind, monkeypatch):
    hang = "import time\nfrom coral.grader import TaskGrader\nclass Grader(TaskGrader):\n    def evaluate(self):\n        time.sleep(60)\n"
    spec, code = _task(tmp_path, hang, "print(1)\n", timeout=2)
    monkeypatch.setattr(grading, "GRACE_S", 20)
    r = grade(spec, code, commit=COMMIT, install=install_for(kind), sandbox=SANDBOX)
    # Coral's TaskGrader times out at 2 s but its worker thread sleeps on, so Coral's daemon would kill it at
    # timeout + 30 s: a timeout; the host stops it first here (GRACE_S lowered for the test), with the same status.
    assert (r.score, r.status, r.budget_class) == (None, "timeout", "grader_error") and r.seconds < 25
    boom = "from coral.grader import TaskGrader\nclass Grader(TaskGrader):\n    def evaluate(self):\n        raise ValueError('grader bug')\n"
    spec2, code2 = _task(tmp_path / "b", boom, "print(1)\n")
    r2 = grade(spec2, code2, commit=COMMIT, install=install_for(kind), sandbox=SANDBOX)
    assert (r2.score, r2.status, r2.budget_class) == (
        None,
        "crashed",
        "grader_error",
    ) and "grader bug" in r2.feedback


def _coral_daemon_grade(task_dir: Path, code_dir: Path, tmp: Path, tune: bool) -> dict:
    """Coral's own daemon grading the same code in a real run layout (unconfined, as Coral runs it)."""
    script = r"""
import json, shutil, subprocess, sys
from pathlib import Path
from datetime import UTC, datetime
from coral.config import CoralConfig
from coral.hub.attempts import write_attempt
from coral.types import Attempt
from coral.grader.daemon import process_pending_once
task, code, run, tune = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "1"
repo = run / "repo"; shutil.copytree(code, repo)
env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b", "PATH": "/usr/bin:/bin"}
for c in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "s"]):
    subprocess.run(["git", *c], cwd=repo, check=True, env=env)
sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
cd = run / ".coral"; shutil.copytree(task / "eval", cd / "private" / "eval")
CoralConfig.from_yaml(task / "task.yaml").to_yaml(cd / "config.yaml")
write_attempt(cd, Attempt(sha, "agent-1", "t", None, "pending", None, datetime.now(UTC).isoformat(), metadata={"budget_class": "tune"} if tune else {}))
a = process_pending_once(cd)[0]
print(json.dumps({"score": a.score, "feedback": a.feedback, "status": a.status}))
"""
    return json.loads(
        coral_run(script, str(task_dir), str(code_dir), str(tmp / "run"), "1" if tune else "0", timeout=300)
    )


@pytest.mark.skipif(
    coral_python() is None, reason="the real Coral is not installed (scripts/install_coral.sh)"
)
@pytest.mark.coral
@pytest.mark.parametrize(
    "task, tune, extra",
    [
        ("circle_packing", False, {}),
        ("kernel_builder", True, {"graded_can_read": ["eval/frozen_problem.py"]}),
        ("kernel_builder", False, {"graded_can_read": ["eval/frozen_problem.py"]}),
    ],
)
def test_corals_examples_graded_by_their_own_graders_as_corals_daemon_does(tmp_path, task, tune, extra):
    spec = load_coral_task(EXAMPLES / task, task, extra)
    r = grade(
        spec,
        EXAMPLES / task / "seed",
        commit=COMMIT,
        install=install_for("coral"),
        sandbox=SANDBOX,
        tune=tune,
    )
    want = _coral_daemon_grade(EXAMPLES / task, EXAMPLES / task / "seed", tmp_path, tune)
    assert r.status == "scored" and r.score == want["score"] and r.score is not None
    norm = lambda s: s.replace("Time: 0.1s", "Time: 0.0s")  # noqa: E731 - the program's own run time
    assert norm(r.feedback) == norm(want["feedback"])
    assert r.seconds < 120


@pytest.mark.skipif(
    coral_python() is None, reason="the real Coral is not installed (scripts/install_coral.sh)"
)
@pytest.mark.coral
def test_kernel_builder_without_its_simulator_visible_fails_clearly(tmp_path):
    spec = load_coral_task(EXAMPLES / "kernel_builder", "kernel_builder")
    r = grade(
        spec,
        EXAMPLES / "kernel_builder" / "seed",
        commit=COMMIT,
        install=install_for("coral"),
        sandbox=SANDBOX,
        tune=True,
    )
    if SANDBOX == "bwrap":
        assert r.score is None and "frozen_problem" in r.feedback


@needs_bwrap
@pytest.mark.skipif(
    coral_python() is None, reason="the real Coral is not installed (scripts/install_coral.sh)"
)
@pytest.mark.coral
def test_circle_packings_grader_trusts_the_programs_stdout(tmp_path):
    """docs/security.md: Coral's circle_packing grader reads its score from what the graded program prints, so a
    program can print one; sftree's channel carries what the grader decided, nothing more."""
    spec = load_coral_task(EXAMPLES / "circle_packing", "circle_packing")
    code = tmp_path / "code"
    code.mkdir()
    (code / "initial_program.py").write_text(
        'import json, os\nprint(json.dumps({"score": 7.0, "sum_radii": 18.45, "eval_time": 0}), flush=True)\nos._exit(0)\n'
    )
    r = grade(spec, code, commit=COMMIT, install=install_for("coral"), sandbox="bwrap")
    assert r.score == 7.0  # forged through the grader's own trust, not through sftree's channel
