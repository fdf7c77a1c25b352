"""Host-side git cannot discover a repository above the folder it runs in (defence in depth: every host call
names its git dir, so a workspace's parent, the tree store or the project checkout is never picked up)."""

from __future__ import annotations

import os
import subprocess

from sftree.runtime.workspace import git


def test_host_git_in_a_workspace_subfolder_finds_no_repository_above(base):
    outer = base / "outer"
    git(["init", "-q", str(outer)])
    sub = outer / "work" / "e1" / "code" / "sub"
    sub.mkdir(parents=True)
    # Without the ceiling, plain git walks up from the subfolder and finds the outer repository.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    plain = subprocess.run(
        ["git", "rev-parse", "--absolute-git-dir"], cwd=sub, env=env, capture_output=True, text=True
    )
    assert plain.returncode == 0 and plain.stdout.strip() == str((outer / ".git").resolve())
    # The host's git does not.
    proc = git(["rev-parse", "--absolute-git-dir"], cwd=sub, check=False)
    assert proc.returncode != 0 and "not a git repository" in proc.stderr, proc
    # ...also when the call's own folder is a workspace subfolder and no cwd is given.
    here = os.getcwd()
    os.chdir(sub)
    try:
        assert git(["status"], check=False).returncode != 0
    finally:
        os.chdir(here)
    # A call that names its git dir still works from there.
    named = git(["rev-parse", "--absolute-git-dir"], git_dir=outer / ".git", cwd=sub)
    assert named.stdout.strip() == str((outer / ".git").resolve())
