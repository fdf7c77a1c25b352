"""`sftree import-coral` on a hostile Coral run: its agents wrote the repositories and `.coral/public`.

Nothing of the run's git config, hooks, attributes or filters may run (a marker file shows it), no symlink is
followed out of the run, and a crafted tree cannot make the import write outside its output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers_coralrun import Spec, build_run, git, record_bytes, simple_specs  # noqa: E402

from sftree.roots.import_coral import run_import  # noqa: E402


def sftree(*args):
    return subprocess.run(["sftree", *map(str, args)], capture_output=True, text=True, timeout=120)


def snapshot_names(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("eval-")) if out.is_dir() else []


def hostile_config(git_dir: Path, marker: Path) -> None:
    """Every way a repository's own config or hooks could run a program when git works in it."""
    hooks = git_dir / "evil-hooks"
    hooks.mkdir()
    for name in (
        "post-checkout",
        "pre-commit",
        "reference-transaction",
        "post-index-change",
        "fsmonitor-watchman",
    ):
        (hooks / name).write_text(f"#!/bin/sh\necho {name} >> {marker}\n")
        (hooks / name).chmod(0o755)
        (git_dir / "hooks").mkdir(exist_ok=True)
        (git_dir / "hooks" / name).write_text(f"#!/bin/sh\necho {name} >> {marker}\n")
        (git_dir / "hooks" / name).chmod(0o755)
    with open(git_dir / "config", "a") as fh:
        fh.write(
            f'[core]\n\tfsmonitor = "echo fsmonitor >> {marker}; false"\n\thooksPath = {hooks}\n'
            f'\tsshCommand = "echo ssh >> {marker}"\n\tpager = "echo pager >> {marker}"\n'
            f'[filter "evil"]\n\tsmudge = "echo smudge >> {marker}; cat"\n\tclean = "echo clean >> {marker}; cat"\n'
            f'\tprocess = "echo process >> {marker}"\n\trequired = true\n'
            f'[diff "evil"]\n\ttextconv = "echo textconv >> {marker}; cat"\n'
            f'[uploadpack]\n\tpackObjectsHook = "echo pack >> {marker}"\n'
        )


def test_the_runs_git_config_hooks_and_filters_never_run(tmp_path):
    marker = tmp_path / "marker"
    specs = simple_specs(5)
    specs[0].files |= {".gitattributes": b"* filter=evil diff=evil\n"}
    built = build_run(tmp_path / "run", specs)
    hostile_config(built.run / "repo" / ".git", marker)
    hostile_config(built.run / ".coral" / "public" / ".git", marker)
    (built.run / ".coral/public/.gitattributes").write_text("* filter=evil\n")
    out = tmp_path / "out"
    result = run_import(built.run, out)
    assert result.problems == [] and result.counts["snapshots"] == 5
    assert not marker.exists(), marker.read_text()
    # the bytes are the blobs git stores, never a filter's output
    first = out / snapshot_names(out)[0]
    assert (first / "code/solution.py").read_bytes() == specs[0].files["solution.py"]
    assert (first / "code/.gitattributes").read_bytes() == b"* filter=evil diff=evil\n"


def test_a_symlinked_attempt_record_is_not_followed_out_of_the_run(tmp_path):
    built = build_run(tmp_path / "run", simple_specs(4, pending_tail=0))
    victim = built.records[1]
    outside = tmp_path / "outside.json"  # a valid record, but it lives outside the run
    outside.write_bytes(record_bytes(dict(victim, title="SECRET-OUTSIDE-THE-RUN")))
    link = built.run / ".coral/public/attempts" / f"{victim['commit_hash']}.json"
    link.unlink()
    link.symlink_to(outside)
    out = tmp_path / "out"
    result = run_import(built.run, out)
    reasons = [p.line() for p in result.problems]
    assert len(reasons) == 1 and "is a symlink; sftree does not follow links in a Coral run" in reasons[0]
    assert len(snapshot_names(out)) == 3 and not any(
        victim["commit_hash"][:12] in n for n in snapshot_names(out)
    )
    for p in out.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert b"SECRET-OUTSIDE-THE-RUN" not in p.read_bytes(), p


@pytest.mark.parametrize(
    "what", ["attempts folder", "repo folder", "checkpoint objects", "alternates", "object symlink"]
)
def test_links_out_of_the_run_are_refused(tmp_path, what):
    built = build_run(tmp_path / "run", simple_specs(3))
    run = built.run
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if what == "attempts folder":
        target = run / ".coral/public/attempts"
        target.rename(elsewhere / "attempts")
        target.symlink_to(elsewhere / "attempts")
        message = "is a symlink or not a folder"
    elif what == "repo folder":
        (run / "repo").rename(elsewhere / "repo")
        (run / "repo").symlink_to(elsewhere / "repo")
        message = "is a symlink"
    elif what == "checkpoint objects":
        objects = run / ".coral/public/.git/objects"
        objects.rename(elsewhere / "objects")
        objects.symlink_to(elsewhere / "objects")
        message = "is a symlink or not a folder"
    elif what == "alternates":
        git("init", "-q", "--bare", str(elsewhere / "other.git"))
        (run / "repo/.git/objects/info/alternates").write_text(str(elsewhere / "other.git/objects") + "\n")
        message = "borrows objects from elsewhere (alternates)"
    else:
        pack = run / "repo/.git/objects/pack"
        (pack / "evil").symlink_to("/etc")
        message = "a symlink in a git object folder"
    proc = sftree("import-coral", run, "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not snapshot_names(tmp_path / "out")


def crafted_commit(repo: Path, entries: list[tuple[bytes, bytes, str]]) -> str:
    """A commit whose root tree holds exactly `entries` (mode, name, hex oid), written raw: git's own tools
    would refuse such names, an agent's raw object writes need not."""
    raw = b"".join(m + b" " + n + b"\0" + bytes.fromhex(o) for m, n, o in entries)
    tree = git("hash-object", "-t", "tree", "--literally", "-w", "--stdin", cwd=repo, input=raw).strip()
    return git("commit-tree", tree, "-m", "crafted", cwd=repo).strip()


@pytest.mark.parametrize(
    "name, reason",
    [
        (b"..", "is not a plain file name"),
        (b".git", "a '.git' entry"),
        (b".GIT.", "a '.GIT.' entry"),
        (b"\xff\xfe", "is not UTF-8"),
    ],
)
def test_crafted_tree_names_are_refused_and_nothing_is_written(tmp_path, name, reason):
    built = build_run(tmp_path / "run", simple_specs(3, pending_tail=0))
    repo = built.run / "repo"
    blob = git("hash-object", "-w", "--stdin", cwd=repo, input=b"ESCAPED\n").strip()
    sub = git("mktree", cwd=repo, input=f"100644 blob {blob}\tescaped.txt\n".encode()).strip()
    mode = b"40000" if name != b"\xff\xfe" else b"100644"
    commit = crafted_commit(repo, [(mode, name, sub if mode == b"40000" else blob)])
    rec = dict(built.records[0], commit_hash=commit, timestamp="2026-03-02T00:00:00+00:00")
    (built.run / ".coral/public/attempts" / f"{commit}.json").write_bytes(record_bytes(rec))
    out = tmp_path / "snaps" / "t"
    result = run_import(built.run, out)
    lines = [p.line() for p in result.problems]
    assert len(lines) == 1 and reason in lines[0], lines
    assert len(snapshot_names(out)) == 3
    written = [p for p in tmp_path.rglob("escaped.txt")]
    assert written == [], written  # not in the output, not beside it
    assert not list((out / ".coral-import" / "tmp").iterdir())


def test_oversized_files_are_refused(tmp_path):
    specs = [Spec("agent-1", {"big.bin": b"x" * 5000}), Spec("agent-1", {"big.bin": b"small"})]
    built = build_run(tmp_path / "run", specs)
    result = run_import(built.run, tmp_path / "out", max_file=4096)
    assert len(result.problems) == 1 and "more than the limit of 4096" in result.problems[0].line()
    assert result.counts["snapshots"] == 1


def test_a_hostile_agent_id_cannot_steer_the_folder_name(tmp_path):
    built = build_run(tmp_path / "run", simple_specs(2, pending_tail=0))
    rec = dict(built.records[0], agent_id="../../x y")
    (built.run / ".coral/public/attempts" / f"{rec['commit_hash']}.json").write_bytes(record_bytes(rec))
    out = tmp_path / "out"
    run_import(built.run, out)
    names = snapshot_names(out)
    assert names[0] == f"eval-000001-x_y-{rec['commit_hash'][:12]}", names
    assert json.loads((out / names[0] / "metadata.json").read_text())["agent_id"] == "../../x y"
    assert sorted(os.listdir(tmp_path)) == ["out", "run"]
