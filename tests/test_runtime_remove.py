"""The one remover of what an agent or graded code wrote (runtime/remove.py): deep nests, mode-000 folders, FIFOs,
sockets and links; never a link followed, never another file system entered."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from sftree.runtime import diskquota, remove
from sftree.runtime.sandbox import sandbox_uid

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (another uid, a mount)")

HOSTILE = r"""
import os, socket, sys
top = sys.argv[1]
os.makedirs(top)
os.chdir(top)
os.mkfifo("fifo")
s = socket.socket(socket.AF_UNIX); s.bind("sock")
os.symlink(sys.argv[2], "to-outside-dir")
os.symlink(os.path.join(sys.argv[2], "keep.txt"), "to-outside-file")
for i in range(20):                 # wide: 20 folders of 50 files
    os.mkdir(f"w{i}")
    for j in range(50):
        open(f"w{i}/f{j}", "w").close()
for _ in range(1500):               # deep: past Python's recursion and past MAX_OPEN
    os.mkdir("d")
    os.chdir("d")
os.mkfifo("deep-fifo")
os.chdir(top)
for depth in range(1500, 0, -100):  # mode 000 from the bottom up; a read-only folder too
    os.chmod("/".join(["d"] * depth), 0)
os.chmod("w3", 0o500)
"""


def _outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "keep.txt").write_text("keep")
    return out


def _make(top: Path, outside: Path, uid: int | None = None) -> None:
    argv = [sys.executable, "-I", "-c", HOSTILE, str(top), str(outside)]
    if uid is not None:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
    subprocess.run(argv, check=True, timeout=120)


def test_a_hostile_tree_goes_and_nothing_outside_it(tmp_path, monkeypatch):
    monkeypatch.setattr(remove, "MAX_OPEN", 8)  # levels above are closed and reopened through `..`
    outside = _outside(tmp_path)
    top = tmp_path / "tree"
    _make(top, outside)
    remove.tree(top)
    assert not top.exists() and (outside / "keep.txt").read_text() == "keep"
    remove.tree(top)  # nothing there: no error


def test_a_link_is_removed_not_followed(tmp_path):
    outside = _outside(tmp_path)
    (tmp_path / "link").symlink_to(outside)
    remove.tree(tmp_path / "link")
    assert not (tmp_path / "link").is_symlink() and (outside / "keep.txt").exists()


@root_only
def test_the_owner_removes_its_mode_000_folders_without_root():
    """sftree not root: the agent's folders are its own uid's; mode 000 is opened up by chmod as the owner."""
    uid = sandbox_uid(7)
    where = Path(tempfile.mkdtemp(prefix="sftree-remove-test-", dir="/var/tmp"))  # traversable by that uid
    try:
        os.chmod(where, 0o755)
        base = where / "owned"
        base.mkdir()
        os.chown(base, uid, uid)
        outside = _outside(where)
        _make(base / "tree", outside, uid)
        code = textwrap.dedent(f"""
            import sys; sys.path.insert(0, {str(Path(remove.__file__).parents[2])!r})
            from sftree.runtime import remove
            remove.tree({str(base / "tree")!r})
        """)
        as_uid = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        subprocess.run([*as_uid, sys.executable, "-I", "-c", code], check=True, timeout=120)
        assert list(base.iterdir()) == [] and (outside / "keep.txt").exists()
    finally:
        remove.tree(where)


@root_only
def test_a_mount_inside_is_never_entered(tmp_path):
    top = tmp_path / "tree"
    (top / "a" / "m").mkdir(parents=True)
    (top / "a" / "f").write_text("x")
    assert diskquota.mount(top / "a" / "m", diskquota.DiskQuota(1 << 20, 64), 0o755)
    try:
        (top / "a" / "m" / "other-fs.txt").write_text("kept")
        with pytest.raises(remove.RemoveError, match="another file system"):
            remove.tree(top)
        assert (top / "a" / "m" / "other-fs.txt").read_text() == "kept" and not (top / "a" / "f").exists()
    finally:
        diskquota.unmount(top / "a" / "m")
    remove.tree(top)
    assert not top.exists()


def test_quietly_never_raises(tmp_path, caplog):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    assert remove.quietly(fifo) and not fifo.exists()
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "s"))
    assert remove.quietly(tmp_path) and not tmp_path.exists()
