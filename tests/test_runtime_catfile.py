"""The one `git cat-file --batch` reader (runtime/catfile.py) under the host's stores (runtime/objects.py): many
objects a round trip, a missing object a clear error after which the next read works; a git that sends nothing
is stopped by the watchdog (the hostile case: tests/security/test_import_coral_hostile.py)."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from sftree.runtime.catfile import CatFile, Missing, Stopped
from sftree.runtime.objects import GitError, ObjectDB, git_env, init_bare


def blobs(git_dir, contents):
    out = []
    for data in contents:
        proc = subprocess.run(
            ["git", "--git-dir", str(git_dir), "hash-object", "-w", "--stdin"],
            input=data,
            capture_output=True,
            check=True,
            env=git_env(),
        )
        out.append(proc.stdout.decode().strip())
    return out


def test_many_objects_a_round_trip_and_a_missing_one(tmp_path):
    repo = tmp_path / "s.git"
    init_bare(repo)
    contents = [b"", b"x\n", b"\0" * 200_000] + [f"{i}\n".encode() * i for i in range(300)]
    ids = blobs(repo, contents)
    db = ObjectDB(repo)
    try:
        assert db.read_many(ids) == [("blob", c) for c in contents]
        with pytest.raises(GitError, match=r"object 0{40} not found \(b'0{40} missing'\)"):
            db.read_many([ids[1], "0" * 40, ids[2]])
        assert db.read(ids[1]) == ("blob", b"x\n")  # git started again
        assert not db.exists("0" * 40) and db.exists(ids[0])
    finally:
        db.close()


def test_a_git_that_sends_nothing_is_stopped(tmp_path):
    repo = tmp_path / "s.git"
    init_bare(repo)
    (oid,) = blobs(repo, [b"hello\n"])
    git = CatFile(repo, env=git_env(), stall=0.5)
    try:
        with pytest.raises(Missing):
            git.ask("1" * 40)
        assert git.ask(oid) == ("blob", 6)
        data = b""
        while len(data) < 7:
            data += git.chunk(oid, 7 - len(data))
        assert data == b"hello\n\n"
        git.idle()
        git.proc.send_signal(signal.SIGSTOP)  # git will owe an answer and send nothing
        t0 = time.monotonic()
        with pytest.raises(Stopped) as err:
            git.ask(oid)
        assert err.value.stalled == oid and time.monotonic() - t0 < 10
    finally:
        git.close()
