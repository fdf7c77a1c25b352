"""An edge sandbox's /tmp is a fresh tmpfs for each command with a quota the kernel enforces, in bytes and (as root)
in files: a write past either fails with ENOSPC inside, and `df` shows it (docs/security.md, "Disk quotas")."""

from __future__ import annotations

import json
import os

import pytest

from sftree.runtime.edgebox import EdgeBox
from sftree.runtime.sandbox import UIDS, bwrap_works
from sftree.runtime.store import TreeStore
from sftree.runtime.workspace import write_world

pytestmark = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot isolate here")

FILL_TMP = r"""
import errno, json, os
st = os.statvfs("/tmp")
out = {"df_mib": st.f_blocks * st.f_frsize >> 20, "df_inodes": st.f_files, "leftover": os.listdir("/tmp")}
for i in range(100000):
    try:
        open(f"/tmp/e{i}", "w").close()
    except OSError as exc:
        out["inode_error"] = errno.errorcode[exc.errno]
        break
out["made"] = i
for i in range(100000):
    if not os.path.exists(f"/tmp/e{i}"):
        break
    os.unlink(f"/tmp/e{i}")
try:
    with open("/tmp/big", "wb") as fh:
        for _ in range(64):
            fh.write(b"x" * (1 << 20))
except OSError as exc:
    out["byte_error"] = errno.errorcode[exc.errno]
out["bytes"] = os.path.getsize("/tmp/big") >> 20
print(json.dumps(out))
"""


@pytest.fixture
def box(base):
    snap = base / "snap"
    (snap / "code").mkdir(parents=True)
    (snap / "code" / "solution.py").write_text("x = 1\n")
    store, state = TreeStore.create(base / "tree", snap, {})
    uid = UIDS.acquire()
    ws = store.fork(state, "e1", agent_id="agent-1", inside="/workspace/results/t", uid=uid)
    write_world(ws, {"AGENTS.md": b"x"})
    b = EdgeBox(ws, "bwrap", hidden=[base / "tree" / "store"], tmp_bytes=16 << 20, tmp_inodes=1000)
    yield b
    UIDS.release(uid)
    store.close()


def test_the_edge_sandboxs_tmp_has_a_kernel_quota_in_bytes_and_files(box):
    runs = []
    for _ in range(2):  # a fresh /tmp for each command: the first one's files are not the second's
        res = box.run([box.python, "-I", "-c", FILL_TMP], timeout=120)
        assert res.returncode == 0, res.stdout
        runs.append(json.loads(res.stdout.decode().strip().splitlines()[-1]))
    for got in runs:
        assert got["df_mib"] == 16 and got["byte_error"] == "ENOSPC" and got["bytes"] <= 16, got
        if os.geteuid() == 0:  # the inode cap is set by a remount as root (unprivileged: the bytes only)
            assert got["df_inodes"] == 1000 and got["inode_error"] == "ENOSPC" and got["made"] < 1000, got
    assert "big" not in runs[1]["leftover"]
