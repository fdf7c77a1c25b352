"""The agent's sandbox: no capabilities, an unprivileged uid (class 2), bounded output, processes and time
(class 7), `sandbox: auto` never silently unconfined (class 8), and nothing of the project, the snapshots or
other trees visible (class 9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.scripted import EVAL, bash

from sftree.config import REPO_ROOT
from sftree.errors import InputError
from sftree.runtime import sandbox

HERE = Path(__file__).resolve().parent


def test_agent_runs_without_capabilities_as_an_unprivileged_user(scripted, base):
    victim = base / "victim.txt"
    victim.write_text("keep")
    s = scripted(
        {1: [[bash("grep CapEff /proc/self/status; echo UID=$(id -u)"),
              bash("mount -o remount,rw / && echo REMOUNTED; umount /proc && echo UMOUNTED"),
              bash("unshare -r -m true && echo NEWNS")]]}
    )  # fmt: skip
    s.edge()
    caps, mounts, userns = s.outputs("e1")
    assert "CapEff:\t0000000000000000" in caps, caps
    assert "UID=0" not in caps and "UID=" in caps
    assert "REMOUNTED" not in mounts and "UMOUNTED" not in mounts, mounts
    assert "NEWNS" not in userns, userns


def test_output_is_capped_while_reading(base):
    """A 400 MB tool output must not be held in memory (the edge runs in a fresh process to measure it)."""
    spec = {
        "base": str(base),
        "script": {"1": [[bash("head -c 400000000 /dev/zero | tr '\\0' a; echo; echo END")]]},
        "agent": {"output_cap": 30000},
    }
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), *sys.path]))
    proc = subprocess.run(
        [sys.executable, "-m", "helpers.scripted", json.dumps(spec)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["peak_mb"] - out["before_mb"] < 150, out
    assert "truncated" in out["outputs"][0]


def test_process_limit_stops_a_fork_bomb(scripted):
    bomb = (
        'python3 -c "import os, time\nn = 0\ntry:\n    for i in range(1500):\n'
        "        if os.fork() == 0:\n            time.sleep(2); os._exit(0)\n        n += 1\n"
        "except OSError as e:\n    print('stopped', e.errno)\nprint('forked', n)\""
    )
    s = scripted({1: [[bash(bomb)]]})
    s.edge()
    out = s.outputs("e1")[0]
    n = int(out.split("forked")[1].split()[0])
    assert n < 1500 and "stopped" in out, out


def test_turn_timeout_holds_for_a_running_tool(scripted):
    s = scripted({1: [[bash("sleep 3"), bash("sleep 3"), bash("sleep 3"), bash("sleep 3")]]},
                 agent={"turn_timeout": 3})  # fmt: skip
    r = s.edge()
    assert r.turns[0].ended == "timeout", r.turns[0]
    assert r.turns[0].steps == 1 and r.wall_s < 8, r.wall_s


def test_auto_refuses_to_run_unconfined_when_bwrap_does_not_work(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text(
        "#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n"
    )
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    sandbox.bwrap_works.cache_clear()
    sandbox.bwrap_flags.cache_clear()
    try:
        with pytest.raises(InputError, match="agent.sandbox: none"):
            sandbox.resolve_mode("auto")
        assert sandbox.resolve_mode("none") == "none"  # only when asked for explicitly
    finally:
        sandbox.bwrap_works.cache_clear()
        sandbox.bwrap_flags.cache_clear()


def test_unconfined_data_is_labelled(tmp_path):
    from helpers.export import RECORD_META

    from sftree.dataset.card import dataset_card

    def record(sandbox: str) -> dict:
        meta = RECORD_META | {"sandbox": sandbox}
        return {"prompt": [{"role": "user", "content": "go"}], "completion": [{"role": "assistant", "content": ""}],
                "tools": [], "metadata": meta}  # fmt: skip

    card = dataset_card([record("none")], "sft.jsonl")
    assert "WITHOUT a sandbox" in card
    safe = dataset_card([record("bwrap")], "sft.jsonl")
    assert "WITHOUT" not in safe and "bwrap: 1 records" in safe


def test_sandbox_shows_no_project_snapshots_or_other_trees(scripted, base):
    other_tree = base / "results" / "tsp" / "trees" / "eval-1"
    other_tree.mkdir(parents=True)
    (other_tree / "tree.json").write_text("{}")
    s = scripted({})
    snaps = s.root.parent
    paths = [REPO_ROOT / "examples" / "circle_packing" / "grader.py", REPO_ROOT / ".git", REPO_ROOT / "src",
             REPO_ROOT / "pyproject.toml", snaps, s.root / "code", other_tree, s.tree_dir / "store", base / "results" / "tsp"]  # fmt: skip
    s.teacher.script[1] = [[bash(f"ls -d {p} && echo VISIBLE:{p}") for p in paths]]
    r = s.edge()
    seen = [o for o in s.outputs("e1") if "VISIBLE:" in o]
    assert not seen, seen
    # ...and the workspace itself works: python runs, files can be written, coral answers.
    s.teacher.script[("e2", 1)] = [
        [bash("python3 -c 'print(6*7)' && echo hi > made.txt && coral log")],
        [EVAL],
    ]
    s.edge("e2")
    out = s.outputs("e2")[0]
    assert "42" in out and "attempts" in out.lower(), out
    assert r.error is None
