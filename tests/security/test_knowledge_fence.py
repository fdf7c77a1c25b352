"""The knowledge fence: `<workspace>/.opencode` is its own mount in the agent's sandbox, so nothing inside can
hard-link (or rename) a file between it and the rest of the workspace (docs/security.md, "The knowledge fence").
A `.opencode` that is not a real folder gets no bind, reaches nothing of the host, and the backend says the edge
was not fenced. Real bwrap, the real native bash tool and the OpenCode backend's real sandbox command line.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from scripted import bash

from sftree.agents.tools import ToolContext, execute
from sftree.runtime.procs import run_group
from sftree.runtime.sandbox import UIDS, bwrap_argv, bwrap_works, give_to, knowledge_fence

pytestmark = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot create namespaces here")
# Without root the sandbox runs as our own uid; as root (CI) also as an unprivileged uid, as in real trees.
UID_MODES = ["own", "sandbox-uid"] if os.geteuid() == 0 else ["own"]


@pytest.fixture(params=UID_MODES)
def uid(request):
    u = UIDS.acquire() if request.param == "sandbox-uid" else None
    yield u
    UIDS.release(u)


def workspace(base: Path, uid: int | None) -> Path:
    ws = base / "work" / "e1" / "code"
    (ws / ".opencode" / "notes").mkdir(parents=True)
    (ws / ".opencode" / "notes" / "a.md").write_text("note\n")
    (ws / "solution.py").write_text("X = 1\n")
    (ws / "other.py").write_text("Y = 2\n")
    give_to(ws, uid)
    return ws.resolve()


def sh(ws: Path, command: str, uid: int | None) -> tuple[str, ToolContext]:
    c = ToolContext(
        root=ws,
        sandbox="bwrap",
        coral_env={"CORAL_BIN": "/nonexistent", "CORAL_SOCKET": "/nonexistent/s"},
        uid=uid,
    )
    return execute("bash", json.dumps({"command": command}), c).content, c


IO_URING_AND_X32 = """
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
params = ctypes.create_string_buffer(120)
r = libc.syscall(425, 8, params)  # io_uring_setup: its IORING_OP_LINKAT would pass a filter of calls
print("io_uring_setup errno", ctypes.get_errno() if r < 0 else "none: allowed")
r = libc.syscall(0x40000000 | 86, b"a", b"b")  # link(2) by the x32 numbering
print("x32 link errno", ctypes.get_errno() if r < 0 else "none: allowed")
code = bytes.fromhex("b8140000 00cd80c3".replace(" ", ""))  # mov eax, 20 (i386 getpid); int 0x80; ret
import mmap
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(code)
fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
r = fn()
print("i386 errno", -r if -4096 < r < 0 else "none: allowed")
"""


def test_no_hard_link_or_rename_crosses_the_fence(base, uid):
    ws = workspace(base, uid)
    out, c = sh(
        ws,
        "ln .opencode/notes/a.md code_link.md; ln solution.py .opencode/notes/b.py; "
        "exec 3<.opencode/notes/a.md; ln -P /proc/self/fd/3 via_fd_p; ln -L /proc/self/fd/3 via_fd_l; "
        f"{sys.executable} -c \"import os; os.link('/proc/self/fd/3', 'via_py', follow_symlinks=True)\" 2>&1"
        " | tail -1; exec 3<&-; "
        "mv other.py .opencode/notes/moved.py; "
        "ln .opencode/notes/a.md .opencode/notes/inside.md && echo INSIDE-OK; "
        "ln -s a.md .opencode/notes/sym.md && echo SYMLINK-OK; "
        f"{sys.executable} -c {shlex.quote(IO_URING_AND_X32)}; "
        "ls -l /proc/$$/fd | sed -n 's/.* -> /FD /p'",
        uid,
    )
    assert out.count("Invalid cross-device link") == 6, out
    for name in ("code_link.md", "via_fd_p", "via_fd_l", "via_py", ".opencode/notes/b.py"):
        assert not (ws / name).exists(), (name, out)
    # mv across the fence ends as a copy: one name, one link
    moved = ws / ".opencode" / "notes" / "moved.py"
    assert moved.read_text() == "Y = 2\n" and moved.stat().st_nlink == 1 and not (ws / "other.py").exists()
    assert (ws / "solution.py").stat().st_nlink == 1
    # no hard link inside .opencode either (the seccomp filter: a write through a second name would be
    # unseen by the watch), nor by io_uring or another ABI; a symbolic link is a file of its own and is allowed
    assert "INSIDE-OK" not in out and (ws / ".opencode" / "notes" / "a.md").stat().st_nlink == 1
    assert "SYMLINK-OK" in out
    assert "io_uring_setup errno 38" in out and "x32 link errno 1" in out and "i386 errno 1" in out, out
    # the shell holds no fd of the host's .opencode (one would lead out of the sandbox by `..`)
    fds = [ln.removeprefix("FD ") for ln in out.splitlines() if ln.startswith("FD ")]
    assert fds and all(t.startswith("pipe:") or t == "/dev/null" for t in fds), out
    assert c.fenced


@pytest.mark.parametrize("kind", ["link-to-host", "link-to-root", "removed", "file"])
def test_a_knowledge_dir_that_is_no_folder_gets_no_bind_and_reaches_nothing(base, uid, kind):
    ws = workspace(base, uid)
    canary = base / "canary"  # a host folder outside the workspace (and outside /tmp)
    canary.mkdir()
    (canary / "canary.txt").write_text("CANARY-SECRET\n")
    shutil.rmtree(ws / ".opencode")
    if kind == "link-to-host":
        (ws / ".opencode").symlink_to(canary)
    elif kind == "link-to-root":
        (ws / ".opencode").symlink_to("/")
    elif kind == "file":
        (ws / ".opencode").write_text("not a folder\n")
    give_to(ws, uid)
    out, c = sh(
        ws,
        f"cat .opencode/canary.txt {canary}/canary.txt; echo pwned > .opencode/new.txt; "
        "rm -f .opencode/canary.txt; ls .opencode 2>&1 | head -3; echo RAN",
        uid,
    )
    assert "RAN" in out, out  # the command still runs, without the separate bind
    assert "CANARY-SECRET" not in out, out
    assert sorted(os.listdir(canary)) == ["canary.txt"]
    assert (canary / "canary.txt").read_text() == "CANARY-SECRET\n"
    assert not c.fenced  # so the backend reports the edge as not fenced


def test_a_link_swapped_in_after_the_fd_was_opened_does_not_redirect_the_bind(base):
    """The bind's source is the fd: `.opencode` replaced by a link to a host folder between our open and
    bwrap's mount (no agent process runs then; this is belt and braces) never mounts the link's target."""
    ws = workspace(base, None)
    canary = base / "canary"
    canary.mkdir()
    (canary / "canary.txt").write_text("CANARY-SECRET\n")
    with knowledge_fence(ws, ws / ".opencode") as fence:
        assert fence.held
        (ws / ".opencode").rename(ws / "moved-away")
        (ws / ".opencode").symlink_to(canary)
        argv = bwrap_argv(
            ["/bin/sh", "-c", "cat .opencode/notes/a.md .opencode/canary.txt 2>&1; echo RAN"],
            cwd=ws,
            binds=[(ws, ws)],
            fd_binds=fence.fd_binds,
        )
        res = run_group(argv, timeout=60, merge_stderr=True, cwd=ws, pass_fds=fence.pass_fds)
    out = res.stdout.decode()
    assert "CANARY-SECRET" not in out, out
    # either the folder we opened is what the sandbox shows, or bwrap refuses to start (the link as the mount
    # point): never the canary
    assert ("note" in out and "RAN" in out) or ("bwrap:" in out and "RAN" not in out), out
    assert sorted(os.listdir(canary)) == ["canary.txt"]


def test_opencode_sandbox_binds_the_knowledge_dir_on_its_own(base, uid):
    """The OpenCode backend's real sandbox command line (`_run_cli`), with a shell where OpenCode would run."""
    from runtime_helpers import opencode_binary

    if opencode_binary()[0] is None:
        pytest.skip(opencode_binary()[1])
    from sftree.agents.opencode import WS_MOUNT, OpenCodeAgent, _Edge

    ws = workspace(base, uid)
    agent = OpenCodeAgent(SimpleNamespace(base_url="http://127.0.0.1:9/v1", model="m"), {"sandbox": "auto"})
    try:
        st = _Edge(home=base / "work" / "e1" / "opencode", uid=uid)
        run = SimpleNamespace(
            workspace=SimpleNamespace(root=ws, edge_id="e1"), env={}, task_cfg={}, extra_ro_hidden=[]
        )
        with agent._fence(run) as fence:
            argv, _ = agent._argv(run, st, ["x"], fence=fence)
        i, j = argv.index("--bind-fd"), argv.index(str(ws))
        assert argv[i + 2] == f"{WS_MOUNT}/.opencode" and argv[j - 1] == "--bind" and j < i, argv
        agent.binary = "/bin/sh"  # a shell where OpenCode would run, in the same sandbox
        give_to(st.home, uid)
        script = "ln .opencode/notes/a.md code_link.md; ln solution.py .opencode/notes/b.py; echo RAN"
        proc = agent._run_cli(run, st, ["-c", script], timeout=60)
        out = proc.stdout + proc.stderr
        assert "RAN" in out and out.count("Invalid cross-device link") == 2, out
        assert not (ws / "code_link.md").exists() and not (ws / ".opencode" / "notes" / "b.py").exists()
        assert agent.links_fenced("e1")
        agent.end_edge("e1")
        assert agent.links_fenced("e1")  # still answered after the edge ended (run_edge asks after the turn)

        shutil.rmtree(ws / ".opencode")
        (ws / ".opencode").symlink_to(base)
        proc = agent._run_cli(run, st, ["-c", "echo RAN"], timeout=60)
        assert "RAN" in proc.stdout, proc.stderr
        assert not agent.links_fenced("e1")
    finally:
        agent.close()
    # unconfined, nothing is fenced: the link is made, and the backend says so
    (ws / ".opencode").unlink()
    (ws / ".opencode").mkdir()
    (ws / ".opencode" / "n.md").write_text("n\n")
    free = OpenCodeAgent(SimpleNamespace(base_url="http://127.0.0.1:9/v1", model="m"), {"sandbox": "none"})
    try:
        free.binary = "/bin/sh"
        run.workspace.edge_id = "e2"
        proc = free._run_cli(
            run, _Edge(home=base / "work" / "e2" / "opencode"), ["-c", "ln .opencode/n.md l.md"], 60
        )
        assert proc.returncode == 0 and (ws / "l.md").stat().st_nlink == 2, proc.stderr
        assert not free.links_fenced("e2")
    finally:
        free.close()


def test_native_edges_report_whether_every_command_was_fenced(scripted):
    s = scripted(
        {
            ("e1", 1): [[bash("rm -rf .opencode; ln -s / .opencode; echo TRIED")]],
            ("e2", 1): [[bash("ls .opencode/ | head -2; echo RAN")]],
        }
    )
    s.edge("e1")
    # inside the sandbox `.opencode` is a mount point: it cannot be removed or replaced by a link
    assert "Device or resource busy" in s.outputs("e1")[0], s.outputs("e1")
    assert s.ctx.agent.links_fenced("e1")

    real_fork = s.ctx.store.fork

    def hostile_fork(parent, edge_id, **kw):  # a workspace whose `.opencode` is a link before the edge starts
        ws = real_fork(parent, edge_id, **kw)
        shutil.rmtree(Path(ws.root) / ".opencode")
        (Path(ws.root) / ".opencode").symlink_to("/")
        return ws

    s.ctx.store.fork = hostile_fork
    s.edge("e2")
    assert "RAN" in s.outputs("e2")[0], s.outputs("e2")
    assert not s.ctx.agent.links_fenced("e2")


UNSEEN_WRITES = """
import ctypes, mmap, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
k, AT = ".opencode/notes", -100
def rw(name):
    return os.open(f"{k}/{name}", os.O_RDWR)
fd = rw("mapped.md")  # a shared mapping written after its file was closed
m = mmap.mmap(fd, 0, mmap.MAP_SHARED)
os.close(fd)
m[0:1] = b"M"
m.flush()
fd = rw("falloc.md")
os.posix_fallocate(fd, 0, 100)
os.close(fd)
src, dst = os.open("solution.py", os.O_RDONLY), rw("copied.md")
os.copy_file_range(src, dst, 3, 0, 0)
os.close(src)
os.close(dst)
os.setxattr(f"{k}/xattr.md", "user.x", b"1")
r = libc.syscall(316, AT, f"{k}/swapped.md".encode(), AT, b"solution.py", 2)  # renameat2 RENAME_EXCHANGE
print("exchange errno", ctypes.get_errno() if r < 0 else "none: swapped")
t = os.open(k, os.O_TMPFILE | os.O_RDWR, 0o644)
os.write(t, b"tmp")
r = libc.linkat(t, b"", AT, f"{k}/tmpfile.md".encode(), 0x1000)  # AT_EMPTY_PATH
print("tmpfile errno", ctypes.get_errno() if r < 0 else "none: linked")
sys.stdout.flush()
if os.fork() == 0:  # a writer that tries to outlive the command, in a session of its own
    os.setsid()
    fd = rw("late.md")
    late = mmap.mmap(fd, 0, mmap.MAP_SHARED)
    os.close(fd)
    os.close(1)
    os.close(2)
    time.sleep(3)
    late[0:1] = b"L"
    late.flush()
    time.sleep(60)
    os._exit(0)
"""


def test_every_write_behind_the_fence_is_reported_by_the_watch(base, uid):
    """The trusted move believes that disk differs from the fork's commit only at the paths the watch reported
    (runtime/kcheckout.py). A hostile command tries the writes inotify might miss: a shared mapping written after
    close, fallocate, copy_file_range, an xattr, RENAME_EXCHANGE with a code file, an O_TMPFILE linked in, and
    a writer meant to outlive the command. Each is refused or reported, and nothing outlives the command."""
    from sftree.runtime.kwatch import KnowledgeWatch

    ws = workspace(base, uid)
    notes = ws / ".opencode" / "notes"
    for name in ("mapped", "falloc", "copied", "xattr", "swapped", "late", "kept"):
        (notes / f"{name}.md").write_text("note text\n")
    give_to(ws, uid)
    watch = KnowledgeWatch(ws)
    if not watch.exact():
        pytest.skip("inotify is not available here")
    out, c = sh(ws, f"{sys.executable} -c {shlex.quote(UNSEEN_WRITES)} 2>&1", uid)
    assert c.fenced
    assert "exchange errno 18" in out and "tmpfile errno 18" in out, out
    assert (notes / "mapped.md").read_bytes().startswith(b"M"), out  # the writes did happen
    # bwrap returns as soon as the command's shell exits; the rest of its processes are killed just after, and
    # the last close of a mapped file is reported then: wait for the teardown (it is done before any fork).
    want = {f"notes/{n}.md" for n in ("mapped", "falloc", "copied", "xattr", "late")}
    touched: set[str] = set()
    for _ in range(50):
        got = watch.committed()
        assert got is not None
        touched |= got
        if want <= touched:
            break
        time.sleep(0.1)
    assert want <= touched, (touched, out)
    assert "notes/kept.md" not in touched and "notes/swapped.md" not in touched
    time.sleep(4)  # past the moment the writer meant to write
    assert (notes / "late.md").read_text() == "note text\n"
    assert watch.committed() == set()
    watch.close()


MAPPED_THEN_KILLED = """
import mmap, os, sys, time
fd = os.open(".opencode/notes/mapped.md", os.O_RDWR)
m = mmap.mmap(fd, 0, mmap.MAP_SHARED)
os.close(fd)
m[0:1] = b"M"  # written now; the last close of the file comes when the mapping goes
sys.stdout.flush()
if os.fork() == 0:  # keeps the mapping until the sandbox's teardown kills it
    os.setsid()
    os.close(1)
    os.close(2)
    time.sleep(60)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox runs as its own uid only when sftree is root")
def test_a_command_returns_once_its_sandbox_is_gone(base):
    """bwrap exits when the command's shell does and its other processes are killed just after: the tool waits
    for them, so a write through a shared mapping is reported (its last close) before the commit that follows
    the command looks, and is committed with the turn."""
    from sftree.runtime.kwatch import KnowledgeWatch

    uid = UIDS.acquire()
    try:
        ws = workspace(base, uid)
        (ws / ".opencode" / "notes" / "mapped.md").write_text("note text\n")
        give_to(ws, uid)
        watch = KnowledgeWatch(ws)
        if not watch.exact():
            pytest.skip("inotify is not available here")
        for _ in range(3):  # a race when it fails: give it a few chances to show
            out, c = sh(ws, f"{sys.executable} -c {shlex.quote(MAPPED_THEN_KILLED)} 2>&1", uid)
            assert c.fenced, out
            assert "notes/mapped.md" in (watch.committed() or set()), out
        watch.close()
    finally:
        UIDS.release(uid)
