"""Host-side git never runs with the agent's config or hooks (class 3) and never takes agent text as an option
(class 5)."""

from __future__ import annotations

import json

from helpers.scripted import EVAL, bash, edit_solution


def test_agent_git_config_and_hooks_never_run_on_the_host(scripted, base):
    marker = base / "fsmonitor-ran"
    hook = base / "hook-ran"
    setup = (
        "rm -rf .git && git init -q . && "
        f"git config core.fsmonitor 'touch {marker}; false' && "
        f"printf '#!/bin/sh\\ntouch {hook}\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit && "
        f"git config core.hooksPath .git/hooks && echo SETUP-OK"
    )
    s = scripted({1: [[bash(setup)], [edit_solution()], [EVAL]]})
    r = s.edge()
    assert "SETUP-OK" in s.outputs("e1")[0]
    assert not marker.exists() and not hook.exists()
    t1 = r.turns[0]
    assert t1.score is not None and t1.commit, t1  # the eval still committed into the host's store
    assert s.ctx.store.diff("code", s.ctx.root_state.code_commit, t1.commit).count("GROW_PASSES") == 2


def test_coral_show_never_takes_an_option_from_an_attempt_record(scripted, base):
    """The attempt records are the host's: read-only to the agent, and `coral show` answers from the host's own
    records, so a record naming an option as its commit reaches no command."""
    victim = base / "victim.txt"
    victim.write_text("precious\n")
    record = {"commit_hash": f"--output={victim}", "timestamp": "9999", "title": "x", "score": 1}
    write = ("write", {"filePath": ".opencode/attempts/zz.json", "content": json.dumps(record)})
    s = scripted({1: [[write], [bash("coral show -- --output")]]})
    s.edge()
    assert victim.read_text() == "precious\n"
    outs = s.outputs("e1")
    assert "Read-only file system" in outs[0], outs
    assert "--output" not in outs[1] or "No attempt" in outs[1] or "not found" in outs[1].lower(), outs
