"""The agent's `coral` inside a real edge sandbox with the real Coral: `eval` answered by the host, everything else by
Coral's own CLI over the edge's Coral-shaped run directory and the worktree's own git (docs/runtime.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from helpers.coral import coral_config, coral_python, needs_coral
from helpers.scripted import EVAL, Scripted, bash, edit_solution, make_base

from sftree.runtime.sandbox import bwrap_works

pytestmark = [
    needs_coral,
    pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot create namespaces here"),
]
ORIGINAL = "GROW_PASSES = 0"


@pytest.fixture
def edge():
    base = make_base()
    grow = (
        "edit",
        {"filePath": "solution.py", "oldString": "GROW_PASSES = 1", "newString": "GROW_PASSES = 2"},
    )
    script = {
        1: [[edit_solution()], [EVAL]],
        2: [
            [bash("printf '# Bigger circles first\\nhelps.\\n' > .opencode/notes/order.md; coral notes")],
            [bash("coral log")],
            [bash("coral log --recent -n 5")],
            [bash("coral notes --read order")],
            [grow],
            [bash("coral diff")],
            [bash("git log --format=%s | head -3")],
            [
                bash(
                    "coral checkout $(git rev-list --max-parents=0 HEAD) && grep -c 'GROW_PASSES = 0' solution.py"
                )
            ],
        ],
    }
    s = Scripted(base, script, agent={"max_steps_per_turn": 12}, extra={"coral": coral_config()})
    yield s
    s.close()
    shutil.rmtree(base, ignore_errors=True)


def test_corals_own_cli_answers_in_the_sandbox(edge):
    s = edge
    assert s.ctx.world.kind == "coral"
    r = s.edge()
    outs = s.outputs("e1")
    graded = r.turns[0].commit
    assert r.turns[0].score is not None and graded
    notes, log, recent, read, _edit, diff, gitlog, checkout = outs[2:10]
    assert "Bigger circles first" in notes and "helps." in read, (notes, read)
    assert graded[:7] in log and "scripted" in log, log
    assert graded[:7] in recent, recent
    assert "-GROW_PASSES = 1" in diff and "+GROW_PASSES = 2" in diff, diff  # the worktree's own git, inside
    assert checkout.strip().endswith("1"), checkout  # reset to the root commit: the original line is back
    assert gitlog.splitlines()[0] == "scripted", gitlog  # the host's commit, in the agent's repository

    # Byte for byte what Coral's CLI prints on the same run directory outside any sandbox (paths as inside).
    run = s.tree_dir / "work" / "probe"
    ws = s.ctx.store.fork(r.child_state, "probe", agent_id=s.ctx.agent_id, inside=None)
    try:
        coral_dir = ws.paths.run / ".coral"  # (without a sandbox the attempt records lie in public/attempts)
        (coral_dir / "config.yaml").write_text(s.ctx.world.config_yaml())
        (ws.root / ".coral_dir").write_text(str(coral_dir))
        (ws.root / ".coral_agent_id").write_text(s.ctx.agent_id)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORAL")}
        direct = subprocess.run(
            [coral_python(), "-c", "from coral.cli import main; main()", "log"], cwd=ws.root, env=env,
            capture_output=True, text=True,
        )  # fmt: skip
        strip = lambda t: re.sub(r"\d{2}:\d{2}(:\d{2})?|\d{4}-\d{2}-\d{2}", "T", t)  # noqa: E731
        assert strip(direct.stdout) == strip(log), (direct.stdout, log)
    finally:
        ws.close()
        assert not run.exists()
