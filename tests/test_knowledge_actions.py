"""DESIGN.md's knowledge action, decided per tool and argument shape (agents/knowledge.py), as both backends use it.

The worktree and the shared folder are where the sandbox shows them (agent.run_dir, docs/opencode.md); the tool
arguments are the shapes of OpenCode 1.18.33's tool schemas (`apply_patch{patchText}`, `read{filePath,...}`,
`glob{pattern,path}`, `grep{pattern,path,include}`, `skill{name}`, `bash{command,workdir,...}`, ...).
"""

from __future__ import annotations

import pytest

from sftree.agents import knowledge
from sftree.agents.knowledge import is_knowledge_action, patch_paths
from sftree.agents.nativetools import is_knowledge_action as native_is_knowledge_action
from sftree.agents.opencode import TurnEvents, apply_event, is_knowledge

RUN = "/workspace/results/circle_packing"
WT = f"{RUN}/agents/agent-1"
SHARED = f"{RUN}/.coral/public"


def patch(*body: str) -> dict:
    return {"patchText": "\n".join(["*** Begin Patch", *body, "*** End Patch"])}


CASES = [
    # apply_patch: by every file its headers name
    ("apply_patch", patch("*** Add File: .opencode/notes/x.md", "+a note"), True),
    ("apply_patch", patch("*** Add File: solution.py", "+x = 1"), False),
    ("apply_patch", patch("*** Update File: solution.py", "@@", "-a", "+b"), False),
    (
        "apply_patch",
        patch("*** Update File: scratch.md", "*** Move to: .opencode/notes/moved.md", "@@"),
        True,
    ),
    ("apply_patch", patch("*** Update File: .opencode/notes/a.md", "*** Move to: notes_copy.md", "@@"), True),
    ("apply_patch", patch("*** Delete File: .opencode/skills/s/SKILL.md"), True),
    ("apply_patch", patch("*** Update File: .opencode/attempts/../../solution.py", "@@"), False),
    ("apply_patch", patch("*** Add File: ./.opencode/./roles/r.md", "+x"), True),
    (
        "apply_patch",
        patch("*** Add File: solution.py", "+x", "*** Add File: .opencode/notes/n.md", "+y"),
        True,
    ),
    ("apply_patch", patch(f"*** Add File: {SHARED}/notes/abs.md", "+x"), True),
    ("apply_patch", patch("*** Add File: ../../.coral/public/notes/rel.md", "+x"), True),
    ("apply_patch", patch("*** Add File: .opencode/opencode.json", "+{}"), False),  # config, not knowledge
    # a line that only looks like a header inside the content is no header (OpenCode's parser: line start)
    ("apply_patch", patch("*** Add File: notes.md", "+*** Add File: .opencode/notes/x.md"), False),
    (
        "apply_patch",
        {"patchText": "*** Begin Patch\r\n*** Add File:  .opencode/notes/crlf.md \r\n+x\r\n"},
        True,
    ),
    (
        "apply_patch",
        {
            "patchText": "cat <<'EOF'\n*** Begin Patch\n*** Delete File: .opencode/notes/x.md\n"
            "*** End Patch\nEOF"
        },
        True,
    ),  # fmt: skip
    ("apply_patch", {"patchText": 5}, False),
    # skill: loads a shared skill
    ("skill", {"name": "fast"}, True),
    # read / write / edit: filePath
    ("read", {"filePath": ".opencode/notes/student.md"}, True),
    ("read", {"filePath": ".opencode/notes"}, True),  # a folder read lists it
    ("read", {"filePath": f"{WT}/.opencode/attempts/abc.json"}, True),
    ("read", {"filePath": f"{SHARED}/skills/s/SKILL.md"}, True),
    ("read", {"filePath": SHARED}, True),  # the shared folder itself
    ("read", {"filePath": f"{SHARED}/logs/x.log"}, False),  # not a knowledge item
    ("read", {"filePath": "src/../.opencode/notes/a.md"}, True),
    ("read", {"filePath": "/proc/self/cwd/.opencode/notes/a.md"}, True),
    ("read", {"filePath": "solution.py"}, False),
    ("read", {"filePath": "notes.md"}, False),
    ("read", {"filePath": ".opencode/notes.md"}, False),
    ("read", {"filePath": ".opencode/opencode.json"}, False),
    ("write", {"filePath": ".opencode/skills/s/SKILL.md", "content": "x"}, True),
    ("write", {"filePath": "opencode_notes.py", "content": "x"}, False),
    ("edit", {"filePath": "./.opencode/roles/r.md", "oldString": "a", "newString": "b"}, True),
    ("edit", {"filePath": "solution.py", "oldString": ".opencode/notes", "newString": "b"}, False),
    # glob: the folder searched and the pattern under it
    ("glob", {"pattern": ".opencode/notes/**"}, True),
    ("glob", {"pattern": ".opencode/*"}, True),
    ("glob", {"pattern": ".opencode/*.json"}, False),
    ("glob", {"pattern": ".opencode/{notes,skills}/*.md"}, True),
    ("glob", {"pattern": ".*/notes/*"}, True),
    ("glob", {"pattern": "*", "path": ".opencode/notes"}, True),
    ("glob", {"pattern": "**/student.md", "path": SHARED}, True),
    ("glob", {"pattern": "notes/*", "path": ".opencode"}, True),
    (
        "glob",
        {"pattern": "**/*.md"},
        False,
    ),  # ripgrep does not enter hidden folders: .opencode is not searched
    ("glob", {"pattern": "**/*.py", "path": "."}, False),
    ("glob", {"pattern": "*/notes/*"}, False),
    ("glob", {"pattern": "{src,.o*}/notes/*"}, True),
    # grep: path and include; the pattern is a regex over contents
    ("grep", {"pattern": "ROWS", "path": ".opencode/notes"}, True),
    ("grep", {"pattern": "ROWS", "path": f"{SHARED}/attempts"}, True),
    ("grep", {"pattern": "ROWS", "include": ".opencode/notes/*.md"}, True),
    ("grep", {"pattern": ".opencode/notes", "include": "*.py"}, False),
    ("grep", {"pattern": "ROWS", "path": "src", "include": "*.py"}, False),
    # list (not offered by 1.18.33, but an OpenCode tool): its path
    ("list", {"path": ".opencode/notes"}, True),
    ("list", {"path": "src"}, False),
    # bash: coral's knowledge commands, the workdir, and every path the command names
    ("bash", {"command": "coral log -n 10"}, True),
    ("bash", {"command": "cd x && coral notes"}, True),
    ("bash", {"command": "coral show abc"}, True),
    ("bash", {"command": "echo $(coral skills)"}, True),
    ("bash", {"command": "coral eval -m 'try'"}, False),
    ("bash", {"command": "coral eval -m 'as .opencode/notes/a.md says, coral log showed ROWS=6'"}, False),
    ("bash", {"command": "coral eval -m x && cat .opencode/notes/a.md"}, True),
    ("bash", {"command": "cat .opencode/notes/n.md"}, True),
    ("bash", {"command": "ls .opencode"}, True),
    ("bash", {"command": "ls -la .opencode; cat .gitignore"}, True),
    ("bash", {"command": "ls .*"}, True),  # the shell lists .opencode
    ("bash", {"command": "cat .o*/notes/a.md"}, True),
    ("bash", {"command": "cat > solution.py <<'EOF'\nx = {'a': b.c[1]}\nEOF\ncoral eval -m done"}, False),
    ("bash", {"command": "ls .opencode/logs"}, False),
    ("bash", {"command": "ls ../../.coral/public/notes"}, True),
    ("bash", {"command": f"cat {SHARED}/attempts/x.json"}, True),
    ("bash", {"command": "cat > .opencode/notes/n.md <<'EOF'\nnote\nEOF"}, True),
    ("bash", {"command": "python3 -c \"print(open('.opencode/skills/s/SKILL.md').read())\""}, True),
    ("bash", {"command": 'cat "$CORAL_WORKTREE/.opencode/notes/a.md"'}, True),
    ("bash", {"command": "cat notes/a.md", "workdir": ".opencode"}, True),
    ("bash", {"command": "cat a.md", "workdir": f"{SHARED}/notes"}, True),
    ("bash", {"command": "python3 solution.py > out.txt 2>&1"}, False),
    ("bash", {"command": "ls *.md; git status"}, False),
    ("bash", {"command": "echo 'unbalanced"}, False),
    ("bash", {"command": "echo 'unbalanced .opencode/notes"}, True),
    ("todowrite", {"todos": [{"content": ".opencode/notes", "status": "pending", "priority": "low"}]}, False),
    ("invalid", {"tool": "read", "error": ".opencode/notes"}, False),
]


@pytest.mark.parametrize(
    ("tool", "args", "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_knowledge_action_per_tool_and_argument_shape(tool, args, expected):
    assert is_knowledge_action(tool, args, WT, SHARED) is expected
    assert is_knowledge_action(tool, args, WT) is expected  # the shared folder by Coral's layout


@pytest.mark.parametrize(
    ("tool", "args", "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_both_backends_decide_by_the_one_function(tool, args, expected):
    """opencode.py's name and nativetools.py's name are the same function (one decision, not a copy per backend)."""
    assert is_knowledge is knowledge.is_knowledge_action is native_is_knowledge_action
    acc = TurnEvents()
    ev = {"type": "tool_use", "part": {"callID": "c1", "tool": tool,
                                       "state": {"status": "completed", "input": args, "output": ""}}}  # fmt: skip
    apply_event(ev, acc, SHARED, WT)
    assert acc.tools[0].knowledge is expected


def test_a_call_that_failed_as_a_tool_is_no_knowledge_action():
    """It read or wrote nothing (the native backend's rule, now OpenCode's too): e.g. a skill that is not there."""
    acc = TurnEvents()
    for status in ("error", "completed"):
        ev = {"type": "tool_use", "part": {"callID": status, "tool": "skill",
                                           "state": {"status": status, "input": {"name": "x"}, "error": "no"}}}  # fmt: skip
        apply_event(ev, acc, SHARED, WT)
    assert [t.knowledge for t in acc.tools] == [False, True]


def test_a_relative_worktree_still_judges_relative_paths():
    assert is_knowledge_action("read", {"filePath": ".opencode/notes/a.md"})
    assert is_knowledge_action("read", {"filePath": "../../.coral/public/notes/a.md"})
    assert not is_knowledge_action("read", {"filePath": "solution.py"})


def test_patch_paths_reads_every_header():
    text = (
        "*** Begin Patch\n*** Add File: a.py\n+x\n*** Update File: b.py\n*** Move to: c/d.py\n@@\n-x\n+y\n"
        "*** Delete File: e.py\n+*** Add File: not_a_header.py\n*** End Patch"
    )
    assert patch_paths(text) == ["a.py", "b.py", "c/d.py", "e.py"]


def test_many_braces_do_not_blow_up():
    pat = "{a,b}" * 30 + "/.opencode/{notes,x}/*"
    assert is_knowledge_action("glob", {"pattern": pat}, WT)
    assert not is_knowledge_action("glob", {"pattern": "{a,b}" * 30 + "/*.py"}, WT)
