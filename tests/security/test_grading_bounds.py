"""Hostile graded code cannot exhaust the host's disk, break the cleanup or stall the grading (issue 32, items 1-3;
docs/security.md, "Bounds"). Each test grades through the real grader and sandboxes (sftree.world.grading), in the
stand-in world and with the real Coral, as root, with the task and the code outside /tmp."""

from __future__ import annotations

import json
import shutil
import textwrap
import threading
from pathlib import Path

import pytest
from helpers.coral import grading_worlds, install_for

from sftree.config import REPO_ROOT
from sftree.runtime import diskquota
from sftree.runtime.sandbox import bwrap_works
from sftree.world import grading
from sftree.world.grading import grade
from sftree.world.task import load_coral_task

pytestmark = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot isolate here")
COMMIT = "c" * 40
CIRCLES = REPO_ROOT / "examples" / "circle_packing"
MIB = 1 << 20


def _leftovers() -> set[str]:
    """Grading folders in the host's temp dir, and mounts of them."""
    names = {p.name for p in Path("/tmp").glob("sftree-grade*")}
    mounts = {
        ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines() if "sftree-grade" in ln
    }
    return names | mounts


def _circles(base: Path, extra_source: str, timeout: float | None = None):
    """The real circle_packing task, graded code = its seed with `extra_source` appended."""
    code = base / "code"
    shutil.copytree(CIRCLES / "seed", code)
    with open(code / "solution.py", "a") as fh:
        fh.write(textwrap.dedent(extra_source))
    overrides = {"grader_timeout": timeout} if timeout else {}
    return load_coral_task(CIRCLES, "circle_packing", overrides), code


# ---- 1. a kernel-enforced disk quota per grading --------------------------------------------------------------
FILL_GRADER = """
import subprocess, sys
from coral.grader import TaskGrader

class Grader(TaskGrader):
    def evaluate(self):
        r = subprocess.run([sys.executable, "fill.py"], cwd=self.codebase_path, capture_output=True, text=True,
                           timeout=120)
        return self.score(1.0, "ran", feedback="OUT " + r.stdout.strip()[-4000:] + " ERR " + r.stderr[-2000:])
"""

FILL = r"""
import errno, json, os

def name(exc):
    return errno.errorcode.get(exc.errno, str(exc.errno))

def fill(where):
    out = {}
    st = os.statvfs(where)
    out["df_mib"] = st.f_blocks * st.f_frsize >> 20
    out["df_inodes"] = st.f_files
    made = 0
    for i in range(12):  # 12 x 250 MiB, as issue 32 item 1 did
        try:
            fd = os.open(os.path.join(where, f"big{i}"), os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.posix_fallocate(fd, 0, 250 << 20)
            finally:
                os.close(fd)
            made += 250
        except OSError as exc:
            out["big_error"] = name(exc)
            break
    out["big_mib"] = made
    chunk = b"x" * (1 << 20)
    for i in range(400):  # then 1 MiB at a time, up to the last byte the quota allows
        try:
            with open(os.path.join(where, f"mib{i}"), "wb") as fh:
                fh.write(chunk)
        except OSError as exc:
            out["mib_error"] = name(exc)
            break
    out["mib_written"] = i
    for i in range(400):
        if os.path.exists(os.path.join(where, f"mib{i}")):
            os.unlink(os.path.join(where, f"mib{i}"))
    for i in range(20000):  # and empty files: the inodes are capped too
        try:
            open(os.path.join(where, f"e{i}"), "w").close()
        except OSError as exc:
            out["inode_error"] = name(exc)
            break
    out["inodes_made"] = i
    for e in os.listdir(where):  # what it made goes: the next folder starts from the same quota
        if e.startswith(("big", "mib", "e")) and e != "fill.py":
            os.unlink(os.path.join(where, e))
    return out

print(json.dumps({"cwd": fill(os.getcwd()), "tmp": fill("/tmp")}))
"""


class DiskWatch:
    """The peak growth of the host file system holding /tmp while the grading runs (sampled)."""

    def __init__(self):
        self.base = shutil.disk_usage("/tmp").used
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, shutil.disk_usage("/tmp").used)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak - self.base


@pytest.mark.parametrize("kind", grading_worlds())
def test_graded_code_filling_the_disk_gets_enospc_inside_and_the_host_grows_by_at_most_the_quota(
    base, kind, monkeypatch
):
    quota = diskquota.DiskQuota(bytes=64 * MIB, inodes=2000)
    monkeypatch.setattr(grading, "GRADE_QUOTA", quota, raising=False)
    t = base / "task"
    (t / "eval").mkdir(parents=True)
    (t / "task.yaml").write_text("task:\n  name: fill\n  description: d\ngrader:\n  timeout: 120\n")
    (t / "eval" / "grader.py").write_text(textwrap.dedent(FILL_GRADER))
    code = base / "code"
    code.mkdir()
    (code / "fill.py").write_text(FILL)
    spec = load_coral_task(t, "fill")
    before = _leftovers()
    watch = DiskWatch()
    r = grade(spec, code, commit=COMMIT, install=install_for(kind), sandbox="bwrap")
    grown = watch.stop()
    assert r.status == "scored", r
    seen = json.loads(r.feedback.split("OUT ", 1)[1].split(" ERR ", 1)[0])
    for where in ("cwd", "tmp"):  # the working folder and /tmp share the grading's one quota
        got = seen[where]
        assert got["df_mib"] == 64 and got["df_inodes"] == 2000, seen  # `df` inside shows the quota
        assert got["big_error"] == "ENOSPC" and got["big_mib"] == 0, seen
        assert got["mib_error"] == "ENOSPC" and got["mib_written"] <= 64, seen
        assert got["inode_error"] == "ENOSPC" and got["inodes_made"] < 2000, seen
    assert seen["cwd"]["mib_written"] >= 32, seen  # the quota is the graded code's, not eaten by the copy
    # (other processes write to that disk too: a margin; the unconfined grading grew it by 3000 MiB)
    assert grown < quota.bytes + (512 << 20), f"the host's /tmp grew by {grown >> 20} MiB"
    assert _leftovers() == before


# ---- 2. one remover: deep nests, mode-000 folders and FIFOs go, and the eval is kept --------------------------
NEST = """

import os as _os


def _nest():
    top = _os.getcwd()
    _os.mkfifo("a-fifo")
    for _ in range(1200):
        _os.mkdir("d")
        _os.chdir("d")
    _os.mkfifo("deep-fifo")
    _os.chdir(top)
    for depth in range(1200, 0, -150):  # from the bottom up: mode 000 closes what lies below
        _os.chmod("/".join(["d"] * depth), 0)


_pack = pack


def pack():
    _nest()
    return _pack()
"""


@pytest.mark.parametrize("storage", ["tmpfs", "host-disk"])
@pytest.mark.parametrize("kind", grading_worlds())
def test_graded_code_nesting_1200_folders_mode_000_and_fifos_is_scored_and_leaves_nothing(
    base, kind, storage, monkeypatch
):
    if storage == "host-disk":  # no quota mount (sftree not root, or mounts refused): the remover does it all
        monkeypatch.setattr(diskquota, "can_mount", lambda: False)
    spec, code = _circles(base, NEST)
    seed_spec, seed = _circles(base / "seed", "")
    before = _leftovers()
    want = grade(seed_spec, seed, commit=COMMIT, install=install_for(kind), sandbox="bwrap")
    r = grade(spec, code, commit=COMMIT, install=install_for(kind), sandbox="bwrap")
    assert (r.status, r.score) == ("scored", want.score) and r.score is not None, r
    assert _leftovers() == before


# ---- 3. the result pipe is read while the grader runs, bounded ------------------------------------------------
@pytest.mark.parametrize("kind", grading_worlds())
def test_a_200kb_exception_is_crashed_at_once_with_a_truncated_message(base, kind, monkeypatch):
    monkeypatch.setattr(grading, "GRACE_S", 10)
    spec, code = _circles(
        base, "\n\ndef pack():\n    raise ValueError('boom ' + 'x' * 200_000)\n", timeout=20
    )
    before = _leftovers()
    r = grade(spec, code, commit=COMMIT, install=install_for(kind), sandbox="bwrap")
    assert r.status == "crashed", r.status
    assert r.seconds < 15, r.seconds
    assert "ValueError: boom xxx" in r.feedback and len(r.feedback) <= grading.FEEDBACK_CAP
    assert _leftovers() == before


@pytest.mark.skipif(not diskquota.can_mount(), reason="the grading's tmpfs needs root")
def test_a_grading_tmpfs_left_by_a_killed_run_is_detached_and_removed_by_the_next_sweep():
    import subprocess
    import tempfile

    from sftree.runtime import tempdirs

    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid with no process: the run that made the folder was killed with -9
    folder = Path(tempfile.mkdtemp(prefix=f"sftree-grade-{dead.pid}-"))
    assert diskquota.mount(folder, diskquota.DiskQuota(1 << 20, 64))
    (folder / "left.txt").write_text("x")
    assert folder.name in tempdirs.sweep(("sftree-grade-",))
    assert not folder.exists() and not diskquota.is_quota_mount(folder)
