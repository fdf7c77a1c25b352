"""profiles/slurm/teacher.sbatch, the cluster recipe of docs/serving.md, run as a plain script on localhost (the
batch script of a one-node job): two teacher-sim processes stand in for `sglang.launch_server` (its
SFTREE_TEACHER_WORKER_CMD, serving the name the overlay gives) and the real router is the router: smg (the
script's default, `smg launch --routing-key-override`) and sglang-router. It writes the config overlay the workflow
takes, the Teacher answers through it, and SIGTERM (scancel) removes the overlay and stops every process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sftree.teacher.client import TeacherClient
from sftree.teacher.fleet import ROUTER_BIN, SMG_BIN, router_missing
from sftree.teacher.llm_server import free_port

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "profiles" / "slurm" / "teacher.sbatch"
pytestmark = [pytest.mark.router]
ROUTER_CMDS = {"smg": f"{SMG_BIN} launch --routing-key-override", "sglang-router": f"{ROUTER_BIN} launch"}
ROUTER_PARAMS = [
    pytest.param(r, marks=pytest.mark.skipif(router_missing(r) is not None, reason=str(router_missing(r))))
    for r in ROUTER_CMDS
]


def test_sbatch_script_syntax():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    kids = {int(x) for x in out.split()}
    return kids | {g for k in kids for g in _children(k)}


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("router", ROUTER_PARAMS)
def test_teacher_sbatch_serves_two_workers_behind_the_router_and_stops_on_sigterm(tmp_path, router):
    url_file = tmp_path / "teacher_url.yaml"
    wport, rport = free_port(), free_port()
    while rport in (wport, wport + 1):
        rport = free_port()
    env = {
        **os.environ,
        "SFTREE_TEACHER_WORKER_CMD": f"{sys.executable} -m sftree.cli teacher-sim --port {{port}} --model teacher",
        "SFTREE_TEACHER_ROUTER": ROUTER_CMDS[router],
        "SFTREE_TEACHER_ROUTER_ARGS": f"--prometheus-port {free_port()} --log-level warn",
        "SFTREE_TEACHER_HOSTS": "127.0.0.1",
        "SFTREE_TEACHER_WORKERS_PER_NODE": "2",
        "SFTREE_TEACHER_WORKER_PORT": str(wport),
        "SFTREE_TEACHER_ROUTER_PORT": str(rport),
        "SFTREE_TEACHER_URL_FILE": str(url_file),
        "SFTREE_TEACHER_STARTUP": "60",
    }
    env.pop("SLURM_JOB_ID", None)
    env.pop("SLURM_JOB_NODELIST", None)
    log = open(tmp_path / "teacher.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not url_file.exists():
            assert proc.poll() is None, (tmp_path / "teacher.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "teacher.log").read_text()
            time.sleep(0.3)
        overlay = yaml.safe_load(url_file.read_text())
        assert overlay == {"teacher": {"base_url": f"http://127.0.0.1:{rport}/v1", "model": "teacher"}}
        c = TeacherClient.from_config({**overlay["teacher"], "health_timeout": 30})
        c.wait_ready()
        try:
            assert c.fleet is not None and sorted(c.fleet.view) == [
                f"http://127.0.0.1:{wport}",
                f"http://127.0.0.1:{wport + 1}",
            ]
            assert c.chat([{"role": "user", "content": "hello"}]).message["role"] == "assistant"
        finally:
            c.close()
        # the workflow takes the overlay over its config, key by key (what every explore job then reads)
        subprocess.run(["snakemake", "-n", "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
                        "--configfile", str(REPO / "examples" / "demo.yaml"), str(url_file)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
        merged = yaml.safe_load((tmp_path / "results" / ".sftree" / "config.yaml").read_text())["teacher"]
        assert merged["base_url"] == overlay["teacher"]["base_url"] and merged["model"] == "teacher"
        assert merged["health_timeout"] == 30 and merged["sim"] == {"seed": 0}  # the demo's keys kept
        procs = _children(proc.pid)
        assert len(procs) >= 3  # two workers and the router
        os.kill(proc.pid, signal.SIGTERM)  # scancel signals the batch shell
        proc.wait(timeout=30)
        assert not url_file.exists()
        deadline = time.monotonic() + 15
        while any(_running(p) for p in procs) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not [p for p in procs if _running(p)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    text = (tmp_path / "teacher.log").read_text()
    assert "ready: 2 workers behind" in text and "stopping the router and 3" in text
