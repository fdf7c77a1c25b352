"""scripts/slurm/start.sh and stop.sh: the localhost cluster's configuration, idempotent start, stop by PID."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from helpers.slurm import REPO, require_cluster, slurm_config

START = REPO / "scripts" / "slurm" / "start.sh"
STOP = REPO / "scripts" / "slurm" / "stop.sh"


def test_scripts_parse():
    for script in (START, STOP):
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr


def _named_sleeper(tmp_path, name: str) -> subprocess.Popen:
    """A process whose /proc/<pid>/comm is `name`: a copy of `sleep` under that name."""
    exe = tmp_path / name
    shutil.copy(shutil.which("sleep"), exe)
    return subprocess.Popen([str(exe), "300"])


def test_stop_signals_recorded_pids_and_spares_a_recycled_one(tmp_path):
    slurmd = _named_sleeper(tmp_path, "slurmd")
    slurmctld = _named_sleeper(tmp_path, "slurmctld")
    stranger = subprocess.Popen(["sleep", "300"])  # stands for a PID that now belongs to another program
    try:
        (tmp_path / "pids").write_text(
            f"munged={stranger.pid}\nslurmctld={slurmctld.pid}\nslurmd={slurmd.pid}\n"
        )
        proc = subprocess.run(
            ["bash", str(STOP)],
            env={**os.environ, "SFTREE_SLURM_DIR": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert slurmd.wait(timeout=5) == -15  # SIGTERM
        assert slurmctld.wait(timeout=5) == -15
        time.sleep(0.2)
        assert stranger.poll() is None, "stop.sh signalled a PID whose process is not munged"
        assert "munged: pid" in proc.stderr and "left alone" in proc.stderr
        assert not (tmp_path / "pids").exists()
    finally:
        for p in (slurmd, slurmctld, stranger):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_stop_without_state_is_a_no_op(tmp_path):
    proc = subprocess.run(
        ["bash", str(STOP)],
        env={**os.environ, "SFTREE_SLURM_DIR": str(tmp_path / "none")},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0
    assert "nothing to stop" in proc.stderr


@pytest.mark.slurm
def test_cluster_configuration():
    require_cluster()
    conf = slurm_config()
    assert "localhost" in conf["SlurmctldHost[0]"]  # shown as "<hostname>(localhost)"
    assert conf["ProctrackType"] == "proctrack/linuxproc"
    assert conf["TaskPlugin"] == "task/none"
    assert conf["AccountingStorageType"] in ("(null)", "accounting_storage/none", "")
    assert conf["JobCompType"] == "jobcomp/filetxt"
    assert os.path.exists(conf["JobCompLoc"])
    node = subprocess.run(
        ["scontrol", "show", "node", "localhost"], capture_output=True, text=True, check=True
    ).stdout
    assert "CPUTot=2 " in node
    measured = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    real_mem = measured.split("RealMemory=")[1].split()[0]
    assert f"RealMemory={real_mem} " in node


@pytest.mark.slurm
def test_start_is_idempotent_when_running():
    require_cluster()
    state = os.environ.get("SFTREE_SLURM_DIR", "/tmp/sftree-slurm")
    pids_file = os.path.join(state, "pids")
    if os.geteuid() != 0 or not os.path.exists(pids_file):
        pytest.skip(f"cluster not started by start.sh as this user (no {pids_file})")
    before = open(pids_file).read()
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(START)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "already running" in proc.stderr
    assert proc.stdout == before  # same daemons, nothing restarted
    assert time.monotonic() - t0 < 15
