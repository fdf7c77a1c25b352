"""OpenCode-shaped tools: confinement, tool errors vs shell exits, knowledge actions, the bwrap sandbox."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from sftree.agents.tools import TOOL_NAMES, TOOL_SCHEMAS, ToolContext, execute, is_knowledge_action
from sftree.config import REPO_ROOT
from sftree.runtime.sandbox import bwrap_works

needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot create namespaces here")


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "work" / "e1" / "code"
    (root / ".opencode" / "notes").mkdir(parents=True)
    (root / ".opencode" / "attempts").mkdir()
    (root / "solution.py").write_text("ROWS = 4\nMARGIN = 0.1\nMARGIN2 = 0.1\n")
    (root / ".opencode" / "notes" / "n.md").write_text("note\n")
    return root.resolve()


def ctx(root: Path, **kw) -> ToolContext:
    return ToolContext(
        root=root,
        sandbox=kw.pop("sandbox", "none"),
        coral_env={"CORAL_BIN": "/nonexistent", "CORAL_SOCKET": "/nonexistent/s"},
        **kw,
    )


def call(root, name, args, **kw):
    raw = args if isinstance(args, str) else json.dumps(args)
    return execute(name, raw, ctx(root, **kw))


def test_schemas_are_opencodes():
    assert TOOL_NAMES == ["bash", "read", "write", "edit", "glob", "grep"]
    props = {t["function"]["name"]: set(t["function"]["parameters"]["properties"]) for t in TOOL_SCHEMAS}
    assert props["bash"] == {"command", "timeout", "workdir", "description"}
    assert props["read"] == {"filePath", "offset", "limit"}
    assert props["edit"] == {"filePath", "oldString", "newString", "replaceAll"}
    assert props["glob"] == {"pattern", "path"} and props["grep"] == {"pattern", "path", "include"}


def test_file_tools_refuse_paths_outside(ws, tmp_path):
    (tmp_path / "secret.txt").write_text("s")
    for name, args in [
        ("read", {"filePath": "../../../secret.txt"}),
        ("read", {"filePath": str(tmp_path / "secret.txt")}),
        ("write", {"filePath": "../x.txt", "content": "x"}),
        ("edit", {"filePath": "/etc/hostname", "oldString": "a", "newString": "b"}),
        ("glob", {"pattern": "*", "path": ".."}),
        ("grep", {"pattern": "s", "path": str(tmp_path)}),
    ]:
        out = call(ws, name, args)
        assert out.error and "denied" in out.content, (name, out.content)
    assert not (ws.parent / "x.txt").exists()
    # a symlink that points outside is refused too
    (ws / "link").symlink_to(tmp_path / "secret.txt")
    assert call(ws, "read", {"filePath": "link"}).error


def test_tool_errors_and_non_errors(ws):
    err = [
        call(ws, "read", {"filePath": "missing.py"}),
        call(ws, "edit", {"filePath": "solution.py", "oldString": "NOPE", "newString": "x"}),
        call(ws, "edit", {"filePath": "solution.py", "oldString": "0.1", "newString": "0.2"}),  # 2 matches
        call(ws, "nosuchtool", {"a": 1}),
        call(ws, "bash", '{"command": "ls"'),  # malformed JSON
        call(ws, "read", {"path": "solution.py"}),  # wrong field
        call(ws, "bash", {"command": "sleep 5", "timeout": 200}),
    ]  # 0.2 s timeout
    assert [o.error for o in err] == [True] * 7
    assert "timed out" in err[-1].content and "unknown tool" in err[3].content
    ok = call(ws, "bash", {"command": "echo hi; exit 3", "description": "d"})
    assert not ok.error and "hi" in ok.content and "exit code 3" in ok.content
    ok = call(
        ws, "edit", {"filePath": "solution.py", "oldString": "0.1", "newString": "0.2", "replaceAll": True}
    )
    assert not ok.error and (ws / "solution.py").read_text().count("0.2") == 2
    out = call(ws, "read", {"filePath": "solution.py", "offset": 1, "limit": 1})
    assert "00002| MARGIN = 0.2" in out.content and "ROWS" not in out.content
    assert call(ws, "glob", {"pattern": "**/*.py"}).content == "solution.py"
    assert call(ws, "grep", {"pattern": "^ROWS", "include": "*.py"}).content == "solution.py:1: ROWS = 4"


def test_output_cap(ws):
    out = call(ws, "bash", {"command": "head -c 5000 /dev/zero | tr '\\0' a"}, output_cap=100)
    assert out.content.startswith("a" * 100) and "truncated: 4900 more" in out.content


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("bash", {"command": "coral log"}, True),
        ("bash", {"command": "cd x && coral notes"}, True),
        ("bash", {"command": "coral show abc"}, True),
        ("bash", {"command": "coral eval -m 'try'"}, False),
        ("bash", {"command": "cat .opencode/notes/n.md"}, True),
        ("bash", {"command": "ls .opencode"}, True),
        ("bash", {"command": "ls .opencode/logs"}, False),
        ("bash", {"command": "python3 solution.py"}, False),
        ("read", {"filePath": ".opencode/attempts/abc.json"}, True),
        ("write", {"filePath": ".opencode/skills/s/SKILL.md", "content": "x"}, True),
        ("read", {"filePath": "solution.py"}, False),
        ("glob", {"pattern": "*.md", "path": ".opencode/notes"}, True),
        ("glob", {"pattern": "**/*.py"}, False),
        ("grep", {"pattern": "x", "path": ".opencode/roles"}, True),
    ],
)
def test_knowledge_action_cases(ws, name, args, expected):
    assert is_knowledge_action(name, args, ws) is expected


def test_failed_knowledge_read_is_no_knowledge_action(ws):
    assert call(ws, "read", {"filePath": ".opencode/notes/n.md"}).knowledge
    assert not call(ws, "read", {"filePath": ".opencode/notes/missing.md"}).knowledge


def test_scrubbed_environment(ws, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("SFTREE_TEACHER_API_KEY", "secret2")
    out = call(ws, "bash", {"command": "env; pwd"})
    assert "secret" not in out.content and str(ws) in out.content


@needs_bwrap
def test_bwrap_confines_the_shell(ws, tmp_path, request):
    other = tmp_path / "work" / "e2" / "code"
    other.mkdir(parents=True)
    (other / "solution.py").write_text("OTHER = 1\n")
    grader_dir = (REPO_ROOT / "examples").resolve()  # outside /tmp: hidden by its own tmpfs
    victim = Path(tempfile.mkdtemp(dir="/var/tmp"))  # outside /tmp: not in the sandbox's allow-list
    (victim / "keep.txt").write_text("k")
    request.addfinalizer(lambda: shutil.rmtree(victim, ignore_errors=True))
    hidden = [tmp_path / "work", grader_dir]
    c = ctx(ws, sandbox="bwrap", hidden=hidden)
    run = lambda cmd: execute("bash", json.dumps({"command": cmd}), c)  # noqa: E731
    assert "OTHER" not in run(f"cat {other}/solution.py").content
    assert "No such file" in run(f"ls {grader_dir}/circle_packing/grader.py").content
    assert "No such file" in run(f"ls {victim}").content
    out = run(f"rm -rf {victim}; rm -f /usr/bin/env; echo done")
    assert "Read-only file system" in out.content or "Permission denied" in out.content
    assert (victim / "keep.txt").exists()
    assert (
        "exit code"
        in run("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 2)'").content
    )
    # the workspace itself is writable
    run("echo hi > made.txt && rm -f ../../e2/code/solution.py")
    assert (ws / "made.txt").read_text() == "hi\n" and (other / "solution.py").exists()


@needs_bwrap
def test_bwrap_keeps_python_and_hides_credentials(ws):
    from sftree.runtime.sandbox import private_home_paths

    hidden = private_home_paths()
    c = ctx(ws, sandbox="bwrap", hidden=hidden)
    out = execute("bash", json.dumps({"command": "python3 -c 'print(6*7)'; echo HOME=$HOME"}), c)
    assert "42" in out.content and "HOME=/tmp" in out.content
    for p in hidden:
        if p.is_dir() and any(p.iterdir()):
            listing = execute("bash", json.dumps({"command": f"ls -A {p} 2>/dev/null | wc -l"}), c).content
            assert listing.strip().splitlines()[0] == "0", (p, listing)
