"""No host-side read, write or copy follows a link out of the workspace; a bad link fails only its edge (class 4)."""

from __future__ import annotations

import pytest
from helpers.scripted import EVAL, GRADER, TASK_DIR, bash, edit_solution

from sftree.runtime.objects import git


def test_grep_and_coral_notes_do_not_follow_links_to_the_grader(scripted):
    s = scripted(
        {1: [[bash(f"ln -s {GRADER} leak.py")],
             [("grep", {"pattern": "TIME_LIMIT"})],
             [("read", {"filePath": "leak.py"})],
             [bash(f"rm -rf ../../.coral/public/notes && ln -s {TASK_DIR} ../../.coral/public/notes && "
                   "coral notes grader.py; coral notes")]]}
    )  # fmt: skip
    s.edge()
    outs = s.outputs("e1")
    assert all("TIME_LIMIT" not in o and "def check" not in o for o in outs[1:]), outs


def test_linked_attempts_folder_is_never_written_through(scripted, base):
    victim = base / "elsewhere"
    victim.mkdir()
    s = scripted({1: [[bash(f"rm -rf .opencode/attempts && ln -s {victim} .opencode/attempts")],
                      [edit_solution()], [EVAL]]})  # fmt: skip
    r = s.edge()
    assert list(victim.iterdir()) == []
    assert r.turns[0].score is not None  # the host's own record of the eval stands


def test_linked_agents_md_is_not_committed_nor_written_through(scripted, base):
    victim = base / "victim.txt"
    victim.write_text("precious\n")
    s = scripted({1: [[bash(f"printf '!AGENTS.md\\n!.opencode\\n' > .gitignore && rm AGENTS.md && ln -s {victim} AGENTS.md")],
                      [edit_solution()], [EVAL]]})  # fmt: skip
    r1 = s.edge("e1")
    commit = r1.turns[0].commit
    files = git(s.ctx.store.code_git, ["ls-tree", "-r", "--name-only", commit]).split()
    assert "AGENTS.md" not in files and not any(f.startswith(".opencode") for f in files), files
    s.edge("e2", parent=r1.child_state)  # a fork of that node writes AGENTS.md afresh
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_linked_knowledge_folder_fails_only_its_edge(scripted, sandbox):
    """The knowledge folder swapped for a link to the task folder: in the sandbox its parent is the host's and the
    swap is refused; unconfined it happens, and the host, which never follows it, cannot take the edge's state:
    that edge fails, the node's future and the task folder are intact."""
    s = scripted(
        {1: [[bash(f"mv ../../.coral/public ../../.coral/p2 && ln -s {TASK_DIR} ../../.coral/public; echo done")],
             [edit_solution()], [EVAL]]},
        agent={"sandbox": sandbox},
    )  # fmt: skip
    r = s.edge("e1")
    if sandbox == "auto":
        assert "Permission denied" in s.outputs("e1")[0], s.outputs("e1")
        assert r.error is None and r.child_state is not None, r.error
    else:
        assert r.child_state is None and r.error and "symlink" in r.error, r.error
    k = s.ctx.store.knowledge_git
    all_files = git(k, ["log", "--all", "--name-only", "--format="])
    assert "grader.py" not in all_files
    s.teacher.script[("e2", 1)] = [[edit_solution()], [EVAL]]
    assert s.edge("e2").error is None  # the node's future is intact


def test_dangling_link_in_knowledge_does_not_break_later_forks(scripted):
    s = scripted({1: [[bash("rm -rf .opencode/notes && ln -s /nonexistent/notes .opencode/notes")],
                      [edit_solution()], [EVAL]]})  # fmt: skip
    r1 = s.edge("e1")
    assert r1.child_state is not None, r1.error
    r2 = s.edge("e2", parent=r1.child_state)
    assert r2.error is None, r2.error
