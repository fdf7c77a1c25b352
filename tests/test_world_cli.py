"""The stand-in `coral` CLI (world/standin_cli.py) prints what the real Coral CLI prints for log, show, notes and skills
with their flags, on the same `.coral` folder; and the agent-text rule holds in both worlds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.coral import coral_python, needs_coral

from sftree.world import standin_cli

STANDIN = Path(standin_cli.__file__)


def _attempt(i, agent, score, cls=None, title=None, feedback=""):
    rec = {
        "commit_hash": f"{i:02d}{'c0ffee' * 6}"[:40],
        "agent_id": agent,
        "title": title or f"attempt number {i} with a title that is longer than forty characters",
        "score": score,
        "status": "improved" if score else "crashed",
        "parent_hash": None if i == 0 else f"{i - 1:02d}{'c0ffee' * 6}"[:40],
        "timestamp": f"2026-05-0{1 + i % 3}T1{i % 10}:0{i % 6}:00+00:00",
        "feedback": feedback,
    }
    if cls:
        rec["metadata"] = {"budget_class": cls}
    return rec


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("coralrun")
    cd = root / ".coral"
    pub = cd / "public"
    (pub / "attempts").mkdir(parents=True)
    recs = [
        _attempt(0, "agent-1", 1.5),
        _attempt(1, "agent-2", 2.25, feedback="Sum of radii: 2.25\neval: fine"),
        _attempt(2, "agent-1", None, feedback="crashed: boom"),
        _attempt(3, "agent-1", 2.75, cls="tune", title="sweep kernel parameters"),
        _attempt(4, "agent-2", 0.5, cls="grader_error"),
        _attempt(5, "agent-1", 2.5, title="kernel fusion"),
        _attempt(6, "agent-3", 3.0, title="short"),
    ]
    for r in recs:
        (pub / "attempts" / f"{r['commit_hash']}.json").write_text(json.dumps(r, indent=2))
    (pub / "attempts" / "broken.json").write_text("{not json")
    notes = pub / "notes"
    (notes / "research").mkdir(parents=True)
    (notes / "a-first-idea.md").write_text(
        "---\ncreator: agent-1\ncreated: 2026-05-01T10:00:00+00:00\n---\n# First idea\nUse a hexagonal grid.\n"
    )
    (notes / "research" / "kernel_notes.md").write_text("No heading here, about kernel fusion.\n")
    (notes / "_synthesis.md").write_text("# hidden\n")
    (notes / "later.md").write_text(
        "---\ncreated: 2026-05-03T09:00:00\n---\n# Later finding\nThe margin matters.\n"
    )
    os.utime(notes / "research" / "kernel_notes.md", (1_700_000_000, 1_700_000_000))
    skills = pub / "skills"
    (skills / "optimizer" / "scripts").mkdir(parents=True)
    (skills / "optimizer" / "SKILL.md").write_text(
        "---\nname: optimizer\ndescription: tune constants fast\ncreator: agent-1\n---\nSteps.\n"
    )
    (skills / "optimizer" / "scripts" / "run.sh").write_text("echo\n")
    (skills / "optim-two").mkdir()
    (skills / "optim-two" / "SKILL.md").write_text("No front matter.\n")
    (skills / "empty").mkdir()
    (cd / "config.yaml").write_text(
        "task:\n  name: t\n  description: d\ngrader:\n  timeout: 60\n  direction: maximize\n"
    )
    wt = root / "agents" / "agent-1"
    wt.mkdir(parents=True)
    (wt / ".coral_dir").write_text(str(cd))
    return wt, cd, recs


COMMANDS = [
    ["log"],
    ["log", "-n", "2"],
    ["log", "--recent"],
    ["log", "--recent", "-n", "3"],
    ["log", "--agent", "agent-2"],
    ["log", "--agent", "nobody"],
    ["log", "--search", "KERNEL"],
    ["log", "--search", "absent"],
    ["log", "--all"],
    ["log", "--class", "tune"],
    ["log", "--class", "grader_error"],
    ["show", "05"],
    ["show", "0"],
    ["show", "zz"],
    ["show", "01c0ffee", "--diff"],
    ["notes"],
    ["notes", "-n", "2"],
    ["notes", "--search", "margin"],
    ["notes", "--search", "nothing"],
    ["notes", "--read", "2"],
    ["notes", "--read", "9"],
    ["notes", "--read", "all"],
    ["skills"],
    ["skills", "--read", "optimizer"],
    ["skills", "--read", "optim"],
    ["skills", "--read", "optim-t"],
    ["skills", "--read", "missing"],
]


def _run(argv, cwd, python, script):
    proc = subprocess.run([python, *script, *argv], cwd=cwd, capture_output=True, text=True, timeout=60)
    return proc.stdout, proc.returncode


@needs_coral
@pytest.mark.coral
@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_standin_cli_prints_what_corals_cli_prints(run_dir, argv):
    wt, _cd, _ = run_dir
    coral_bin = str(Path(coral_python()).parent / "coral")
    want = subprocess.run([coral_bin, *argv], cwd=wt, capture_output=True, text=True, timeout=60)
    got = subprocess.run(
        [sys.executable, "-I", str(STANDIN), *argv], cwd=wt, capture_output=True, text=True, timeout=60
    )
    assert got.stdout == want.stdout
    assert got.returncode == want.returncode
    assert want.stdout.strip()


def test_standin_cli_needs_no_sftree(run_dir, tmp_path):
    """It runs from a copy with nothing of sftree importable (python -I, another folder)."""
    wt, _cd, _ = run_dir
    copy = tmp_path / "coral_cli.py"
    copy.write_text(STANDIN.read_text())
    out = subprocess.run(
        [sys.executable, "-I", str(copy), "log", "-n", "1"], cwd=wt, capture_output=True, text=True
    )
    assert out.returncode == 0 and "Leaderboard (top 1):" in out.stdout and "3.0000000000" in out.stdout
    st = subprocess.run([sys.executable, "-I", str(copy), "status"], cwd=wt, capture_output=True, text=True)
    assert st.returncode == 0 and "Attempts: 7" in st.stdout


@pytest.mark.parametrize("kind", ["stand-in", "coral"])
def test_cli_command_runs_the_worlds_cli(run_dir, tmp_path, kind):
    from sftree.world.task import load_coral_task
    from sftree.world.world import World, standin_cli_source

    if kind == "coral" and coral_python() is None:
        pytest.skip("the real Coral is not installed (scripts/install_coral.sh)")
    install = None
    if kind == "coral":
        from helpers.coral import coral_settings

        from sftree.world.locate import locate

        install = locate(coral_settings())
    wt, _cd, _ = run_dir
    script = tmp_path / "coral_cli.py"
    script.write_text(standin_cli_source())
    w = World(
        load_coral_task(Path(__file__).parents[1] / "examples" / "tsp", "tsp"),
        agent_id="agent-1",
        install=install,
    )
    try:
        out = subprocess.run(
            w.cli_command(["log", "-n", "2"], str(script)), cwd=wt, capture_output=True, text=True
        )
    finally:
        w.close()
    assert out.returncode == 0 and out.stdout.startswith("Leaderboard (top 2):")
    assert (w.sandbox_roots() != ()) == (kind == "coral")
