"""OpenCode-shaped tools: confinement, tool errors vs shell exits, knowledge actions, the bwrap sandbox."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from sftree.agents.native import NativeAgent
from sftree.agents.nativetools import TOOL_NAMES, TOOL_SCHEMAS, ToolContext, execute, is_knowledge_action
from sftree.config import REPO_ROOT
from sftree.runtime.edgebox import EdgeBox
from sftree.runtime.sandbox import UIDS, bwrap_works
from sftree.runtime.store import TreeStore
from sftree.settings import AgentSettings, section_settings

AGENT = section_settings(AgentSettings, {})

needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot create namespaces here")
INSIDE = "/workspace/results/toy"


def _box(tmp_path, mode: str, hidden=(), edge="e1") -> EdgeBox:
    snap = tmp_path / f"snap-{edge}"
    (snap / "code").mkdir(parents=True)
    (snap / "code" / "solution.py").write_text("ROWS = 4\nMARGIN = 0.1\nMARGIN2 = 0.1\n")
    (snap / "shared" / "notes").mkdir(parents=True)
    (snap / "shared" / "notes" / "n.md").write_text("note\n")
    store, state = TreeStore.create(tmp_path / f"tree-{edge}", snap, {})
    uid = UIDS.acquire() if mode == "bwrap" else None
    ws = store.fork(state, edge, agent_id="agent-1", inside=INSIDE if mode == "bwrap" else None, uid=uid)
    from sftree.runtime.workspace import write_world

    write_world(ws, {"AGENTS.md": b"x"})
    coral = tmp_path / f"coral-{edge}"
    (coral / "bin").mkdir(parents=True)
    return EdgeBox(ws, mode, coral_dir=coral, coral_env={"CORAL_BIN": "/nonexistent", "CORAL_SOCKET": "/nonexistent/s"},
                   hidden=[tmp_path / f"tree-{edge}" / "store", *hidden],
                   tmp_bytes=AGENT.quota.tmp_mib << 20, tmp_inodes=AGENT.quota.tmp_inodes)  # fmt: skip


@pytest.fixture(params=["none", pytest.param("bwrap", marks=needs_bwrap)])
def box(request, tmp_path):
    b = _box(tmp_path, request.param)
    yield b
    UIDS.release(b.uid)
    b.ws.store.close()


@pytest.fixture
def ws(box):
    return box.ws.root


def ctx(box: EdgeBox, **kw) -> ToolContext:
    limits = {"bash_timeout": AGENT.bash_timeout, "output_cap": AGENT.output_cap, **kw}
    return ToolContext(box=box, toolbox=NativeAgent.toolbox_path(box), **limits)


def call(box, name, args, **kw):
    raw = args if isinstance(args, str) else json.dumps(args)
    return execute(name, raw, ctx(box, **kw))


def test_schemas_are_opencodes():
    assert TOOL_NAMES == ["bash", "read", "write", "edit", "glob", "grep"]
    props = {t["function"]["name"]: set(t["function"]["parameters"]["properties"]) for t in TOOL_SCHEMAS}
    assert props["bash"] == {"command", "timeout", "workdir", "description"}
    assert props["read"] == {"filePath", "offset", "limit"}
    assert props["edit"] == {"filePath", "oldString", "newString", "replaceAll"}
    assert props["glob"] == {"pattern", "path"} and props["grep"] == {"pattern", "path", "include"}


def test_file_tools_refuse_paths_outside(box, ws, tmp_path):
    (tmp_path / "secret.txt").write_text("s")
    for name, args in [
        ("read", {"filePath": "../../../../../../secret.txt"}),
        ("read", {"filePath": "/etc/hostname"}),
        ("write", {"filePath": "../x.txt", "content": "x"}),
        ("edit", {"filePath": "/etc/hostname", "oldString": "a", "newString": "b"}),
        ("glob", {"pattern": "*", "path": ".."}),
        ("grep", {"pattern": "s", "path": "/etc"}),
    ]:
        out = call(box, name, args)
        assert out.error and "denied" in out.content, (name, out.content)
    assert not (ws.parent / "x.txt").exists()
    # a symlink that points outside is refused too
    (ws / "link").symlink_to("/etc/hostname")
    assert call(box, "read", {"filePath": "link"}).error
    # the shared knowledge, through the worktree's `.opencode` links or by its own path, is inside
    assert call(box, "read", {"filePath": ".opencode/notes/n.md"}).content.count("note") == 1
    assert not call(box, "read", {"filePath": f"{box.inside(box.ws.knowledge_dir)}/notes/n.md"}).error


def test_tool_errors_and_non_errors(box, ws):
    err = [
        call(box, "read", {"filePath": "missing.py"}),
        call(box, "edit", {"filePath": "solution.py", "oldString": "NOPE", "newString": "x"}),
        call(box, "edit", {"filePath": "solution.py", "oldString": "0.1", "newString": "0.2"}),  # 2 matches
        call(box, "nosuchtool", {"a": 1}),
        call(box, "bash", '{"command": "ls"'),  # malformed JSON
        call(box, "read", {"path": "solution.py"}),  # wrong field
        call(box, "bash", {"command": "sleep 5", "timeout": 200}),  # 0.2 s timeout
        call(box, "read", {"filePath": "solution.py", "offset": 1e308 * 10}),  # inf
    ]
    assert [o.error for o in err] == [True] * 8
    assert "timed out" in err[-2].content and "unknown tool" in err[3].content and "finite" in err[-1].content
    ok = call(box, "bash", {"command": "echo hi; exit 3", "description": "d"})
    assert not ok.error and "hi" in ok.content and "exit code 3" in ok.content
    ok = call(
        box, "edit", {"filePath": "solution.py", "oldString": "0.1", "newString": "0.2", "replaceAll": True}
    )
    assert not ok.error and (ws / "solution.py").read_text().count("0.2") == 2
    out = call(box, "read", {"filePath": "solution.py", "offset": 1, "limit": 1})
    assert "00002| MARGIN = 0.2" in out.content and "ROWS" not in out.content
    assert call(box, "glob", {"pattern": "**/*.py"}).content == "solution.py"
    assert call(box, "grep", {"pattern": "^ROWS", "include": "*.py"}).content == "solution.py:1: ROWS = 4"
    made = call(box, "write", {"filePath": "new/dir/f.txt", "content": "x"})
    assert not made.error and (ws / "new" / "dir" / "f.txt").stat().st_uid == (
        box.uid if box.uid else (ws / "solution.py").stat().st_uid
    )


def test_output_cap(box):
    out = call(box, "bash", {"command": "head -c 5000 /dev/zero | tr '\\0' a"}, output_cap=100)
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
def test_knowledge_action_cases(name, args, expected):
    assert is_knowledge_action(name, args, f"{INSIDE}/agents/agent-1") is expected


def test_knowledge_action_by_the_shared_folders_own_path():
    cwd = f"{INSIDE}/agents/agent-1"
    assert is_knowledge_action("read", {"filePath": f"{INSIDE}/.coral/public/notes/a.md"}, cwd)
    assert is_knowledge_action("read", {"filePath": "../../.coral/public/skills/s/SKILL.md"}, cwd)
    assert not is_knowledge_action("read", {"filePath": "../../.coral/public/logs/x"}, cwd)
    assert is_knowledge_action("bash", {"command": "ls ../../.coral/public/notes"}, cwd)


def test_failed_knowledge_read_is_no_knowledge_action(box):
    assert call(box, "read", {"filePath": ".opencode/notes/n.md"}).knowledge
    assert not call(box, "read", {"filePath": ".opencode/notes/missing.md"}).knowledge


def test_scrubbed_environment(box, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("SFTREE_TEACHER_API_KEY", "secret2")
    out = call(box, "bash", {"command": "env; pwd"})
    assert "secret" not in out.content and box.worktree in out.content


@needs_bwrap
def test_bwrap_confines_the_shell(tmp_path, request):
    other = _box(tmp_path, "none", edge="e2")
    (other.ws.root / "solution.py").write_text("OTHER = 1\n")
    grader_dir = (REPO_ROOT / "examples").resolve()  # outside /tmp: hidden by its own tmpfs
    victim = Path(tempfile.mkdtemp(dir="/var/tmp"))  # outside /tmp: not in the sandbox's allow-list
    (victim / "keep.txt").write_text("k")
    request.addfinalizer(lambda: shutil.rmtree(victim, ignore_errors=True))
    box = _box(tmp_path, "bwrap", hidden=[tmp_path / "tree-e2", grader_dir])
    c = ctx(box)
    run = lambda cmd: execute("bash", json.dumps({"command": cmd}), c)  # noqa: E731
    try:
        assert "OTHER" not in run(f"cat {other.ws.root}/solution.py").content
        assert "No such file" in run(f"ls {grader_dir}/circle_packing").content
        assert "No such file" in run(f"ls {victim}").content
        out = run(f"rm -rf {victim}; rm -f /usr/bin/env; echo done")
        assert "Read-only file system" in out.content or "Permission denied" in out.content
        assert (victim / "keep.txt").exists()
        net = "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 2)'"
        assert "exit code" in run(net).content
        # the worktree is writable, the attempt records and the run directory's own folders are not
        out = run("echo hi > made.txt && touch ../../.coral/public/attempts/x.json; touch ../../x; pwd")
        assert (box.ws.root / "made.txt").read_text() == "hi\n"
        assert out.content.count("Read-only file system") == 1 and "Permission denied" in out.content, (
            out.content
        )
        assert f"{INSIDE}/agents/agent-1" in out.content
    finally:
        UIDS.release(box.uid)


@needs_bwrap
def test_bwrap_keeps_python_and_hides_credentials(tmp_path):
    from sftree.runtime.sandbox import private_home_paths

    hidden = private_home_paths()
    box = _box(tmp_path, "bwrap", hidden=hidden)
    c = ctx(box)
    try:
        out = execute("bash", json.dumps({"command": "python3 -c 'print(6*7)'; echo HOME=$HOME"}), c)
        assert "42" in out.content and "HOME=/tmp" in out.content
        for p in hidden:
            if p.is_dir() and any(p.iterdir()):
                listing = execute(
                    "bash", json.dumps({"command": f"ls -A {p} 2>/dev/null | wc -l"}), c
                ).content
                assert listing.strip().splitlines()[0] == "0", (p, listing)
    finally:
        UIDS.release(box.uid)
