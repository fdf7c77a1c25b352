"""The edge's long-lived OpenCode server (agents/opencode_driver.py driving `opencode serve`) makes exactly the
model requests that `opencode run --format json` makes: same system prompt, tools, messages and options, request
for request, in the same folder with the same configuration, teacher-sim behind the recording proxy.

Skipped when the opencode binary is missing (`bash scripts/install_opencode.sh`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.runtime import opencode_binary

from sftree.agents.opencode import DENIED, DRIVER, ENV_FLAGS, OpenCodeAgent, _Driver, opencode_config
from sftree.agents.proxy import RecordingProxy
from sftree.teacher.sim.server import start_teacher_sim

OPENCODE, WHY = opencode_binary()
pytestmark = [
    pytest.mark.opencode,
    pytest.mark.skipif(OPENCODE is None, reason=f"opencode binary missing: {WHY}"),
]
STUDENT = "sglang/Qwen3-Coder-30B-A3B-Instruct"
PROMPT = 'Improve the score of solution.py, then run `coral eval -m "what changed"`.'
REQUESTS = 3  # compared one by one: the first, and two that carry tool results


def _env(home: Path, proxy: RecordingProxy, channel: str, work: Path) -> dict[str, str]:
    cdir = home / "config" / "opencode"
    for sub in ("data", "state", "cache", "home"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    OpenCodeAgent._plugin_stub(cdir)
    cfg = opencode_config(
        proxy.base_url(channel),
        STUDENT,
        context_limit=262144,
        output_limit=4096,
        temperature=None,
        hidden=[],
        worktree=str(work),
    )
    (cdir / "opencode.json").write_text(json.dumps(cfg))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "HOME": str(home / "home"),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "npm_config_offline": "true",
        **ENV_FLAGS,
        "OPENCODE_CONFIG_CONTENT": json.dumps({"permission": DENIED}),
    }
    return env


def _until(proxy: RecordingProxy, channel: str, n: int, timeout: float = 120) -> list[dict]:
    ch = proxy.channels[channel]
    got: list[dict] = []
    end = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < end:
        got += ch.take()
        time.sleep(0.05)
    return got


def _requests_of_run(work: Path, home: Path, proxy: RecordingProxy) -> list[dict]:
    """The old way: one `opencode run` per turn, the prompt on stdin."""
    proxy.channel("run")
    argv = [OPENCODE, "run", "--format", "json", "--thinking", "--model", STUDENT, "--title", "e1"]
    proc = subprocess.Popen(
        argv,
        cwd=work,
        env=_env(home, proxy, "run", work),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        proc.stdin.write(PROMPT.encode())
        proc.stdin.close()  # the prompt ends at end of input
        return _until(proxy, "run", REQUESTS)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _requests_of_server(work: Path, home: Path, proxy: RecordingProxy) -> list[dict]:
    """The edge's server through the driver, as the backend drives it (its host end; without the sandbox)."""
    proxy.channel("serve")
    store = home / "data" / "opencode" / "opencode.db"
    argv = [sys.executable, "-I", str(DRIVER), OPENCODE, str(work), str(store), str(home / "session.db")]
    env = _env(home, proxy, "serve", work)
    d = _Driver(argv, "serve", home / "stderr.log", cwd=work, env=env, start_new_session=True)
    try:
        assert d.wait_for("ready", 120) is not None
        d.send({"op": "turn", "session": None, "title": "e1", "model": STUDENT, "text": PROMPT})
        return _until(proxy, "serve", REQUESTS)
    finally:
        d.kill()


def test_the_server_sends_what_opencode_run_sends(tmp_path):
    url, stop_sim = start_teacher_sim(port=0, seed=4)
    proxy = RecordingProxy(url, retries=1, backoff_max=0.05).start()
    work = tmp_path / "agent-1"  # one folder for both: its path is in OpenCode's system prompt
    work.mkdir()
    (work / "AGENTS.md").write_text("# Task: circle packing\nMaximise the sum of radii in solution.py.\n")
    (work / "solution.py").write_text("MARGIN = 0.14\nGROW_PASSES = 0\n")
    try:
        # The server goes first: the files `opencode run`'s session then sees are the ones the server's saw
        # (teacher-sim answers the same request the same way, so both sessions make the same edits).
        snapshot = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()}
        served = _requests_of_server(work, tmp_path / "serve", proxy)
        for name, data in snapshot.items():
            (work / name).write_bytes(data)
        ran = _requests_of_run(work, tmp_path / "run", proxy)
    finally:
        proxy.stop()
        stop_sim()
    assert len(served) >= REQUESTS and len(ran) >= REQUESTS, (len(served), len(ran))
    for i, (a, b) in enumerate(zip(ran[:REQUESTS], served[:REQUESTS], strict=True)):
        assert a["kind"] == b["kind"] == "agent", i
        assert [m["role"] for m in a["request"]["messages"]] == [m["role"] for m in b["request"]["messages"]]
        assert a["request"] == b["request"], f"request {i + 1} differs"
    first = served[0]["request"]
    assert f"The exact model ID is {STUDENT}" in first["messages"][0]["content"]
    assert f"Working directory: {work}" in first["messages"][0]["content"]
    assert any(m["role"] == "tool" for m in served[REQUESTS - 1]["request"]["messages"])
