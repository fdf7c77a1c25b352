"""The OpenCode backend's sandbox, as a hostile Teacher sees it: the real OpenCode CLI runs the scripted Teacher's
bash calls, and the assertions read what its bash tool printed (the recorded tool results).

OpenCode runs as the unprivileged sandbox uid with no capabilities, under the agent's process, data and
file-size caps, without a controlling terminal, seeing nothing of the project, the snapshots, the tree store or
$HOME; its own state lives in a private home owned by that uid, its config is read-only; sessions still continue
across `opencode run`s and `coral eval` still grades.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest
from helpers.runtime import opencode_binary
from helpers.scripted import EVAL, bash, edit_solution

from sftree.config import REPO_ROOT
from sftree.runtime.sandbox import AGENT_LIMITS, SANDBOX_UID_BASE
from sftree.settings import AgentSettings, schema_defaults

OPENCODE, WHY = opencode_binary()

pytestmark = [
    pytest.mark.opencode,
    pytest.mark.slow,
    pytest.mark.skipif(OPENCODE is None, reason=f"opencode binary missing: {WHY}"),
]
OC_AGENT = {"backend": "opencode", "max_steps_per_turn": 8, "turn_timeout": 240}
IDENTITY = (
    "echo UID=$(id -u) GID=$(id -g); grep -E '^(CapEff|CapPrm|CapBnd):' /proc/self/status; "
    "echo TTY=$(cut -d' ' -f7 /proc/self/stat)"
)
LIMITS = (
    "echo NPROC=$(ulimit -u) FSIZE=$(ulimit -f) DATA=$(ulimit -d) CORE=$(ulimit -c); "
    "(ulimit -u unlimited && echo RAISED-NPROC) 2>&1; (ulimit -d unlimited && echo RAISED-DATA) 2>&1"
)
STATE = (
    "touch $HOME/mine $XDG_DATA_HOME/mine && echo HOME-WRITABLE=$(stat -c %u $HOME $XDG_DATA_HOME | sort -u); "
    "(echo '{}' > $XDG_CONFIG_HOME/opencode/opencode.json && echo CONFIG-WRITTEN) 2>&1"
)
# Started in turn 1, looked for in turn 2: between two turns nothing of the agent runs (the driver's reap).
BACKGROUND = "nohup sleep 317 >/dev/null 2>&1 & echo STARTED-BG"
LEFT_OVER = (  # [7]: the pattern must not match the grep (and the shell) that look for it
    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q 'sleep 31[7]' && echo BG-ALIVE; "
    "done; echo BG-CHECKED"
)
# The host's pipes to the driver (its stdin and stdout; made by the host, so root's, mode 0600): the sandbox uid
# cannot open them through /proc to forge the driver's events or read the host's orders; nor can it read the
# driver's memory or environment, or ptrace it (the driver is not dumpable).
CHANNEL_PY = """import os
for p in os.listdir('/proc'):
    if not p.isdigit() or int(p) == os.getpid():
        continue
    try:
        cmd = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')
    except OSError:
        continue
    if len(cmd) > 2 and cmd[2].endswith(b'opencode_driver.py') and b'bwrap' not in cmd[0]:
        print('DRIVER', p)
        for fd, mode in (('0', 'rb'), ('1', 'wb')):
            try:
                open(f'/proc/{p}/fd/{fd}', mode).close()
                print('FD-OPENED', fd)
            except OSError as e:
                print('FD-DENIED', fd, e.errno)
        try:  # readable only while the driver is dumpable (then ptrace would work too)
            open(f'/proc/{p}/environ', 'rb').read()
            print('ENV-READ')
        except OSError as e:
            print('ENV-DENIED', e.errno)
"""
CHANNEL = f"{sys.executable} -c {shlex.quote(CHANNEL_PY)}"
BOMB = (
    f'{sys.executable} -c "import os, time\nn = 0\ntry:\n    for i in range(1500):\n'
    "        if os.fork() == 0:\n            time.sleep(2); os._exit(0)\n        n += 1\n"
    "except OSError as e:\n    print('stopped', e.errno)\nprint('forked', n)\""
)


def secrets_of_home() -> list[Path]:
    """What lies in the host's $HOME and is not on the way to the Python or OpenCode the sandbox needs."""
    home = Path.home().resolve()
    needed = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(OPENCODE).resolve()]
    return [p for p in sorted(home.iterdir()) if not any(n.is_relative_to(p) for n in needed)][:8]


def test_opencode_runs_unprivileged_capped_and_sees_nothing_of_the_host(scripted, base):
    s = scripted({}, agent=OC_AGENT)
    host_side = s.tree_dir / "work" / "e1" / "opencode"
    paths = [REPO_ROOT / ".git", REPO_ROOT / "src", REPO_ROOT / "examples" / "circle_packing" / "grader.py",
             s.root.parent, s.tree_dir / "store", s.tree_dir / "sessions", host_side / "host",
             *secrets_of_home()]  # fmt: skip
    look = "; ".join(f"ls -d {p} >/dev/null 2>&1 && echo VISIBLE:{p}" for p in paths) + "; echo LOOKED"
    s.teacher.script[1] = [
        [bash(IDENTITY), bash(LIMITS), bash(look), bash(STATE)],
        [bash(BACKGROUND), bash(BOMB)],
    ]
    s.teacher.script[2] = [[bash(LEFT_OVER), bash(CHANNEL), edit_solution()], [EVAL]]
    between: dict = {}
    run_turn = s.ctx.agent.run_turn

    def and_look_between(run):  # what of the sandbox is left, and how, once turn 1 has ended
        out = run_turn(run)
        if run.turn == 1:
            between["procs"] = _procs_of(run.box.uid, details=True)
            between["holders"] = _holders(s.ctx.agent._edges[run.workspace.edge_id].driver.pipes)
        return out

    s.ctx.agent.run_turn = and_look_between
    r = s.edge("e1")
    out = "\n".join(s.outputs("e1"))
    print(out)

    uid = int(re.search(r"UID=(\d+)", out).group(1))
    if os.geteuid() == 0:  # the kernel enforces RLIMIT_NPROC only for a non-root uid
        assert uid >= SANDBOX_UID_BASE and f"GID={uid}" in out, out
    for cap in ("CapEff", "CapPrm", "CapBnd"):
        assert re.search(rf"{cap}:\s+0000000000000000", out), out
    assert "TTY=0" in out, out  # a session of its own without a terminal (no TIOCSTI into ours)

    fsize_kib = (
        schema_defaults(AgentSettings).quota.file_mib << 10
    )  # no file larger than the workspace quota allows
    assert f"NPROC={AGENT_LIMITS.nproc} " in out and f"FSIZE={fsize_kib} " in out, out
    assert f"DATA={AGENT_LIMITS.data_mb * 1024} CORE=0" in out, out
    assert "RAISED" not in out, out
    forked = int(out.split("forked")[1].split()[0])
    assert forked < 1500 and "stopped" in out, out

    assert "LOOKED" in out and "VISIBLE:" not in out, out
    # Its private home and data folder belong to that uid; the config it runs with cannot be changed.
    assert f"HOME-WRITABLE={uid}" in out and "CONFIG-WRITTEN" not in out, out
    # What turn 1 left running was gone before turn 2; the host's pipes to the driver cannot be opened.
    assert "STARTED-BG" in out and "BG-CHECKED" in out and "BG-ALIVE" not in out, out
    assert "DRIVER" in out and out.count("FD-DENIED") == 2 and "FD-OPENED" not in out, out
    assert "ENV-DENIED" in out and "ENV-READ" not in out, out
    # Between the turns only bwrap, the driver and the stopped server are left: no command the agent started,
    # and no code of the agent's inside the server (a plugin, say) runs while the host commits.
    procs = between["procs"]
    server = [p for p in procs if " serve " in p["cmd"] and "opencode_driver" not in p["cmd"]]
    assert len(server) == 1 and server[0]["state"] == "T", procs
    rest = [
        p for p in procs if p not in server and "opencode_driver" not in p["cmd"] and "bwrap" not in p["cmd"]
    ]
    assert not rest, procs
    # The host's two pipes to the driver: held by the host and the driver alone, not by bwrap's processes in the
    # sandbox (the agent's uid, dumpable: ptrace or pidfd_getfd could take them from there).
    driver = [p["pid"] for p in procs if (p["cmd"].split(" ") + [""] * 3)[2].endswith("opencode_driver.py")]
    assert len(driver) == 1 and between["holders"] == {os.getpid(), driver[0]}, (between["holders"], procs)

    # The session went on in turn 2 (same OpenCode session, same sandbox uid) and `coral eval` graded.
    t1, t2 = r.turns
    assert t1.ended == "no_eval" and t2.ended == "eval" and t2.score is not None and t2.commit, r.to_dict()
    assert (s.tree_dir / "sessions" / "e1.opencode.json").is_file()
    sessions = {st["session_id"] for st in s.steps("e1") if st.get("session_id")}
    assert len(sessions) == 1, sessions


def _holders(inodes: set[int]) -> set[int]:
    """Every process with a descriptor on one of these pipes."""
    names = {f"pipe:[{i}]" for i in inodes}
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in names for fd in os.listdir(f"/proc/{pid}/fd")):
                out.add(int(pid))
        except OSError:
            continue
    return out


def _procs_of(uid: int, details: bool = False) -> list:
    """The processes of `uid` (/proc/PID is theirs even when not dumpable), with details their state and
    command line."""
    out = []
    for pid in os.listdir("/proc"):
        try:
            if not pid.isdigit() or os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        if not details:
            out.append(int(pid))
            continue
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append({"pid": int(pid), "state": state, "cmd": cmd})
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox uid exists only when sftree runs as root")
def test_opencode_sandbox_dies_with_its_parent(base):
    """sftree killed with -9 leaves no OpenCode behind: the sandbox's processes (found by its uid) go with it."""
    import subprocess
    import time
    from types import SimpleNamespace

    from helpers.runtime import make_root

    from sftree.agents.opencode import OpenCodeAgent, _Edge
    from sftree.runtime.edgebox import EdgeBox
    from sftree.runtime.sandbox import UIDS
    from sftree.runtime.store import TreeStore
    from sftree.settings import AgentSettings, SearchSettings, section_settings
    from sftree.teacher.client import TeacherClient

    agent = OpenCodeAgent(
        TeacherClient.from_config({"base_url": "http://127.0.0.1:9/v1", "model": "m"}),
        section_settings(AgentSettings, {"sandbox": "auto"}),
        hard_token_limit=section_settings(SearchSettings, {}).hard_token_limit,
    )
    st = _Edge(home=base / "opencode", uid=UIDS.acquire())
    store, root = TreeStore.create(base / "tree", make_root(base), {})
    try:
        if agent.sandbox != "bwrap":
            pytest.skip("bubblewrap is not usable here")
        ws = store.fork(root, "e1", agent_id="agent-1", inside="/workspace/results/t", uid=st.uid)
        coral = SimpleNamespace(world=SimpleNamespace(opencode_json=lambda: "{}\n"))  # what _argv reads of it
        q = agent.settings.quota
        run = SimpleNamespace(
            workspace=ws,
            box=EdgeBox(ws, "bwrap", q.tmp_mib << 20, q.tmp_inodes),
            coral=coral,
            instructions="",
        )
        # A long-lived stand-in where `opencode serve` would run: the driver waits for it to listen.
        fake = base / "fake-opencode"
        fake.write_text(f"#!{sys.executable} -I\nimport time\ntime.sleep(120)\n")
        fake.chmod(0o755)
        agent.binary = str(fake)
        argv, cwd = agent._argv(run, st)
        parent = subprocess.Popen(  # plays sftree: starts the sandbox, then is killed with -9
            [sys.executable, "-c", "import os, subprocess, sys, time; r, w = os.pipe(); "
             "subprocess.Popen(sys.argv[1:] + ['--fds', str(r), str(w)], pass_fds=(r, w)); time.sleep(120)",
             *argv], cwd=cwd, env=agent._env(run, st),
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not _procs_of(st.uid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _procs_of(st.uid), "the sandboxed process did not start"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 15
        while _procs_of(st.uid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _procs_of(st.uid)
    finally:
        for pid in _procs_of(st.uid):  # a failed run must not leave them behind
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        UIDS.release(st.uid)
        agent.close()
        store.close()
