"""What a killed run leaves is recognised and cleared by the next start, and nothing of a live run is touched:
Snakemake's lock (runtime/runowner.py), the run's temporary folders (runtime/tempdirs.py, the proxy's too), and
its processes, which end when a process of the run they belong to is gone (runtime/runwatch.py) or when the
process above them is told to stop (runtime/procs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sftree.runtime import procs, runowner, runwatch, tempdirs


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def locked(meta: Path, owner: str | None) -> Path:
    (meta / "locks").mkdir(parents=True)
    (meta / "locks" / "0.input.lock").write_text("results/x\n")
    if owner:
        (meta / runowner.OWNERS).mkdir()
        (meta / runowner.OWNERS / owner).touch()
    return meta / "locks" / "0.input.lock"


def test_a_dead_runs_lock_is_removed_and_said(tmp_path):
    pid = dead_pid()
    lock = locked(tmp_path, f"{pid}-12345")
    said = runowner.clear_stale_lock(tmp_path)
    assert said and f"pid {pid}" in said and not lock.exists()
    assert [p.name for p in (tmp_path / runowner.OWNERS).iterdir()] == [
        f"{os.getpid()}-{runowner.start_time(os.getpid())}"
    ]  # the dead owner forgotten, this run recorded


@pytest.mark.parametrize("owner", ["live", "reused pid", "none recorded"])
def test_a_lock_is_kept_unless_every_recorded_owner_is_dead(tmp_path, owner):
    """A live owner's lock stays, and so does a lock no run of this workflow recorded; an owner whose pid now
    names another process (started at another time) is dead: its lock goes."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        record = {
            "live": f"{live.pid}-{runowner.start_time(live.pid)}",
            "reused pid": f"{live.pid}-1",  # the pid lives, but started at another time: not the owner
            "none recorded": None,
        }[owner]
        lock = locked(tmp_path, record)
        said = runowner.clear_stale_lock(tmp_path, pid=os.getpid())
        if owner == "reused pid":
            assert said and not lock.exists()
        else:
            assert said is None and lock.exists()
    finally:
        live.kill()
        live.wait()


def test_the_proxys_folder_is_named_for_its_owner_and_swept_when_it_is_dead():
    """The recording proxy's socket folder carries its owner's pid, so the sweep tells a dead run's from a live one's."""
    from sftree.agents.proxy import RecordingProxy

    proxy = RecordingProxy("http://127.0.0.1:9/v1", retries=0).start(unix=True)
    left = Path(tempfile.mkdtemp(prefix=f"sftree-proxy-{dead_pid()}-"))
    try:
        assert proxy.unix_dir is not None and proxy.unix_dir.name.startswith(f"sftree-proxy-{os.getpid()}-")
        gone = tempdirs.sweep(tempdirs.PREFIXES)
        assert left.name in gone and not left.exists() and proxy.unix_dir.exists()
    finally:
        proxy.stop()


def test_start_of_run_says_how_many_folders_it_removed(tmp_path):
    left = [Path(tempfile.mkdtemp(prefix=f"{p}{dead_pid()}-")) for p in tempdirs.PREFIXES]
    lines: list[str] = []
    runowner.start_of_run(tmp_path, lines.append)
    assert not any(p.exists() for p in left)
    said = [line for line in lines if "temporary folder(s) of dead runs" in line]
    assert len(said) == 1 and all(p.name in said[0] for p in left), lines
    n = int(said[0].split()[2])
    assert n >= len(left)  # (other runs' dead folders in the temp dir may go with them)


WATCHER = """
import sys, time
from sftree.runtime import runwatch
runwatch.watch_from_env(poll=0.1)
print("watching", flush=True)
time.sleep(60)
"""


def test_a_process_of_the_run_ends_when_the_one_it_watches_is_gone():
    """`kill -9` of the watched process (Snakemake, or the explore job above a teacher-sim): the watcher ends."""
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    env = {**os.environ}
    runwatch.add_self(env, watched.pid)
    child = subprocess.Popen([sys.executable, "-c", WATCHER], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "watching"
        time.sleep(0.3)
        assert child.poll() is None  # watched alive: goes on
        watched.kill()
        watched.wait()
        assert child.wait(timeout=10) == -15  # SIGTERM to itself
    finally:
        for p in (watched, child):
            p.kill()
            p.wait()


def test_outside_a_workflow_run_nothing_is_watched(monkeypatch):
    monkeypatch.delenv(runwatch.ENV, raising=False)
    assert runwatch.watch_from_env() is None
    monkeypatch.setenv(
        runwatch.ENV, f"another-host:{os.getpid()}:1"
    )  # a cluster job's copy of the login node's
    assert runwatch.watch_from_env() is None


def test_signal_descendants_reaches_children_in_sessions_of_their_own():
    code = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        "print(c.pid, flush=True); time.sleep(60)"
    )
    top = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild = int(top.stdout.readline())
    try:
        assert grandchild in procs.descendants(os.getpid())
        assert procs.signal_descendants(top.pid) == 1
        deadline = time.monotonic() + 10
        while runowner.start_time(grandchild) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runowner.start_time(grandchild) is None
    finally:
        top.kill()
        top.wait()


def test_the_bridges_folders_are_named_for_their_owner_and_the_sweep_knows_the_prefix():
    """The Coral bridge runs in the user's Coral without sftree: its own folders carry its pid and a prefix the
    sweep knows, so a bridge killed with -9 leaves nothing the next run keeps."""
    from sftree.world import bridge_main

    with bridge_main._temporary() as tmp:
        assert Path(tmp).name.startswith(f"{bridge_main.TEMP_PREFIX}{os.getpid()}-")
    assert bridge_main.TEMP_PREFIX in tempdirs.PREFIXES
    left = Path(tempfile.mkdtemp(prefix=f"{bridge_main.TEMP_PREFIX}{dead_pid()}-"))
    assert left.name in tempdirs.sweep(tempdirs.PREFIXES) and not left.exists()
