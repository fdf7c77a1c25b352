"""`sftree import-coral` on synthetic Coral-shaped runs (tests/helpers/coralrun.py; no Coral needed).

The real Coral run is tests/test_import_coral_real.py; hostile runs are tests/security/test_import_coral_hostile.py.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from helpers.coralrun import Spec, build_run, git, record_bytes, simple_specs

from sftree.roots import import_coral as ic
from sftree.roots.import_coral import run_import
from sftree.roots.snapshots import scan

ITEMS = ("attempts", "notes", "skills", "roles", "agents", "heartbeat", "eval_logs")


def sftree(*args, cwd=None):
    return subprocess.run(["sftree", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120)


def snapshots(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.name.startswith("eval-"))


def tree_files(git_dir: Path, rev: str) -> dict[str, tuple[str, bytes]]:
    """path -> (mode, content) of every file of `rev`, read with git in the test's own (trusted) repository."""
    out = {}
    for line in git("ls-tree", "-r", "-z", rev, cwd=git_dir).split("\0"):
        if line:
            meta, path = line.split("\t", 1)
            mode, _, oid = meta.split()
            out[path] = (
                mode,
                subprocess.run(["git", "cat-file", "blob", oid], cwd=git_dir, capture_output=True).stdout,
            )
    return out


def disk_files(folder: Path) -> dict[str, tuple[str, bytes]]:
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_symlink():
            out[rel] = ("120000", os.readlink(p).encode())
        elif p.is_file():
            out[rel] = ("100755" if p.stat().st_mode & 0o111 else "100644", p.read_bytes())
    return out


@pytest.fixture
def built(tmp_path):
    return build_run(tmp_path / "run", simple_specs(8))


def test_every_attempt_becomes_a_snapshot_of_its_commit_and_checkpoint(built, tmp_path):
    out = tmp_path / "snaps" / "demo"
    result = run_import(built.run, out)
    assert result.problems == [] and result.counts["snapshots"] == 8
    snaps = snapshots(out)
    # the global order is the submission order (timestamps); names as the seed names them
    expected = [
        f"eval-{i:06d}-{r['agent_id']}-{r['commit_hash'][:12]}" for i, r in enumerate(built.records, 1)
    ]
    assert [s.name for s in snaps] == expected
    graded = 0
    for snap, rec, ssh in zip(snaps, built.records, built.checkpoints, strict=True):
        meta = json.loads((snap / "metadata.json").read_text())
        assert meta["commit_hash"] == rec["commit_hash"] and meta["agent_id"] == rec["agent_id"]
        assert meta["shared_state_hash"] == rec["shared_state_hash"] == ssh
        assert meta["task"] == "demo" and meta["status"] == rec["status"]
        if rec["status"] == "pending":
            assert "eval_ok" not in meta and "eval_count" not in meta  # section 2.1: skipped as pending
        else:
            graded += 1
            assert (
                meta["eval_ok"] is (rec["status"] not in ("crashed", "timeout")) is (rec["score"] is not None)
            )
            assert meta["eval_count"] == graded  # its place among the graded attempts
        # shared/: the checkpoint's folders Coral links into worktrees, logs and run files left out, plus the
        # attempt's own record as Coral holds it now
        own = f"attempts/{rec['commit_hash']}.json"
        want = {
            p: v for p, v in tree_files(built.run / ".coral/public", ssh).items() if p.split("/")[0] in ITEMS
        }
        assert own not in want  # the checkpoint is taken before the record is written
        want[own] = ("100644", (built.run / ".coral/public" / own).read_bytes())
        assert disk_files(snap / "shared") == want
        assert {p.name for p in (snap / "shared").iterdir()} == set(
            ITEMS
        )  # empty ones too, as Coral makes them
        assert disk_files(snap / "code") == tree_files(built.run / "repo", rec["commit_hash"])
    # files are read-only hard links into one store: a record 7 snapshots hold is stored once
    first = built.records[0]["commit_hash"]
    inodes = {(s / "shared/attempts" / f"{first}.json").stat().st_ino for s in snaps[2:]}
    assert len(inodes) == 1
    assert stat.S_IMODE((snaps[0] / "code/solution.py").stat().st_mode) == 0o444
    report = json.loads((out / ic.REPORT_JSON).read_text())
    assert report["counts"] == {
        "records": 8, "snapshots": 8, "pending": 1, "eval_ok_true": 5, "eval_ok_false": 2, "problems": 0
    }  # fmt: skip
    rows = (out / ic.REPORT_TSV).read_text().splitlines()
    assert len(rows) == 9 and rows[1].split("\t")[1] == expected[0]
    assert not list((out / ic.STATE_DIR / "tmp").iterdir())


def test_select_roots_reads_the_imported_snapshots(built, tmp_path):
    out = tmp_path / "snaps" / "demo"
    run_import(built.run, out)
    s = scan(out, "demo")
    assert len(s.snapshots) == 7 and len(s.pending) == 1
    by_commit = {r["commit_hash"]: r for r in built.records}
    for snap in s.snapshots:
        assert snap.score == by_commit[snap.commit_hash]["score"]
        assert snap.status == by_commit[snap.commit_hash]["status"]
    proc = sftree(
        "select-roots", "--snapshots", out, "--out", tmp_path / "roots", "--table", tmp_path / "stages.tsv",
        "--direction", "maximize", "--num-roots", "2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len((tmp_path / "stages.tsv").read_text().splitlines()) == 8


def test_a_rerun_changes_nothing(built, tmp_path):
    out = tmp_path / "t"
    run_import(built.run, out)
    before = {p: p.stat() for p in [*snapshots(out), out / ic.REPORT_JSON, out / ic.REPORT_TSV]}
    result = run_import(built.run, out)
    assert result.actions["up_to_date"] == 8 and result.actions["links"] == 0
    for p, st in before.items():
        assert (p.stat().st_ino, p.stat().st_mtime_ns) == (st.st_ino, st.st_mtime_ns), p


def test_a_growing_run_is_imported_incrementally(tmp_path):
    built = build_run(tmp_path / "run", simple_specs(10, pending_tail=1))
    attempts = built.run / ".coral/public/attempts"
    full = {p.name: p.read_bytes() for p in attempts.iterdir()}
    recs = built.records
    # An earlier look at the run: attempts 7..10 not submitted yet, attempt 6 still pending, and attempt 3's
    # record not written yet (it appears later, with an earlier timestamp than those imported).
    for r in recs[6:] + [recs[2]]:
        (attempts / f"{r['commit_hash']}.json").unlink()
    six = dict(recs[5], status="pending", score=None, feedback="")
    six.pop("metadata")
    (attempts / f"{six['commit_hash']}.json").write_bytes(record_bytes(six))
    out = tmp_path / "t"
    first = run_import(built.run, out)
    assert first.counts["snapshots"] == 5 and first.counts["pending"] == 1
    early = {s.name: s.stat().st_ino for s in snapshots(out)}
    six_name = next(n for n in early if six["commit_hash"][:12] in n)
    assert "eval_ok" not in json.loads((out / six_name / "metadata.json").read_text())
    for name, data in full.items():  # the run went on
        (attempts / name).write_bytes(data)
    second = run_import(built.run, out)
    assert (
        second.actions["written"] == 5
        and second.actions["rebuilt"] == 1
        and second.actions["up_to_date"] == 4
    )
    names = [s.name for s in snapshots(out)]
    assert len(names) == 10 and set(early) <= set(names)  # indices, once given, never change
    for name, ino in early.items():
        if name != six_name:
            assert (out / name).stat().st_ino == ino, name  # finished snapshots are kept as they are
    meta6 = json.loads((out / six_name / "metadata.json").read_text())
    assert meta6["eval_ok"] is True and meta6["status"] == recs[5]["status"]
    assert (out / six_name / "shared/attempts" / f"{six['commit_hash']}.json").read_bytes() == full[
        f"{six['commit_hash']}.json"
    ]
    late = next(n for n in names if recs[2]["commit_hash"][:12] in n)
    assert late.startswith("eval-000006-")  # the next free index, not its place in time
    assert any("appeared after later ones were imported" in n for n in second.notes)
    # eval_count follows the global indices: attempt 3 (graded) now counts before attempts 7..10
    counts = [json.loads((out / n / "metadata.json").read_text()).get("eval_count") for n in names]
    assert counts == [1, 2, 3, 4, 5, 6, 7, 8, 9, None]


def test_a_pending_attempt_graded_later_is_rebuilt_with_eval_ok(tmp_path):
    specs = simple_specs(4, pending_tail=0)
    built = build_run(tmp_path / "run", specs)
    last = built.records[-1]
    path = built.run / ".coral/public/attempts" / f"{last['commit_hash']}.json"
    graded = path.read_bytes()
    pending = dict(last, status="pending", score=None, feedback="")
    pending.pop("metadata")
    path.write_bytes(record_bytes(pending))
    out = tmp_path / "t"
    run_import(built.run, out)
    snap = snapshots(out)[-1]
    assert "eval_ok" not in json.loads((snap / "metadata.json").read_text())
    path.write_bytes(graded)
    result = run_import(built.run, out)
    assert result.actions["rebuilt"] == 1 and result.actions["up_to_date"] == 3
    assert json.loads((snap / "metadata.json").read_text())["eval_ok"] is True
    assert (snap / "shared/attempts" / path.name).read_bytes() == graded


def problem_lines(result) -> list[str]:
    return [p.line() for p in result.problems]


def test_bad_records_are_reported_one_by_one_and_the_rest_imported(built, tmp_path):
    attempts = built.run / ".coral/public/attempts"
    good = built.records[1]
    no_commit = dict(good, commit_hash="ab" * 20, timestamp="2026-03-01T10:00:00+00:00")
    no_checkpoint = dict(good, commit_hash=built.records[3]["commit_hash"], shared_state_hash="cd" * 20)
    (attempts / f"{no_commit['commit_hash']}.json").write_bytes(record_bytes(no_commit))
    (attempts / f"{no_checkpoint['commit_hash']}.json").write_bytes(record_bytes(no_checkpoint))
    (attempts / ("ef" * 20 + ".json")).write_text("{not json")
    (attempts / "notes.json").write_text("{}")
    mismatch = dict(good, commit_hash="12" * 20)
    (attempts / ("34" * 20 + ".json")).write_bytes(record_bytes(mismatch))
    out = tmp_path / "t"
    result = run_import(built.run, out)
    lines = "\n".join(problem_lines(result))
    assert f"commit {'ab' * 20} is not in the run's code repository" in lines
    assert f"checkpoint {'cd' * 20} is not in the checkpoint repository .coral/public/.git" in lines
    assert f"{'ef' * 20}.json: not valid JSON" in lines
    assert "notes.json: not named <commit hash>.json" in lines
    assert f"commit_hash '{'12' * 20}' is not the commit its file is named after" in lines
    assert (
        result.counts["problems"] == 5 and result.counts["snapshots"] == 7
    )  # 8 - the one whose checkpoint is gone
    assert not any(built.records[3]["commit_hash"][:12] in s.name for s in snapshots(out))
    assert not list((out / ic.STATE_DIR / "tmp").iterdir())  # nothing half-written
    report = json.loads((out / ic.REPORT_JSON).read_text())
    assert len(report["problems"]) == 5 and all(p["reason"] for p in report["problems"])
    # the CLI prints each problem and the count; --strict makes any problem an error
    proc = sftree("import-coral", built.run, "--out", out)
    assert proc.returncode == 0 and proc.stderr.count("import-coral: problem: ") == 5, proc.stderr
    assert "5 problem(s)" in proc.stdout
    assert sftree("import-coral", built.run, "--out", out, "--strict").returncode == 2


def test_a_run_of_an_older_coral_without_checkpoints_names_every_attempt(tmp_path):
    specs = simple_specs(4, pending_tail=0)
    for s in specs:
        s.shared_state = False
    built = build_run(tmp_path / "run", specs)
    proc = sftree("import-coral", built.run, "--out", tmp_path / "t")
    assert proc.returncode == 2
    assert proc.stderr.count("no shared_state_hash: the Coral that made this run records no checkpoint") == 4
    assert "no snapshot could be made" in proc.stderr and "4 problem(s)" in proc.stderr
    assert not snapshots(tmp_path / "t")


def test_a_run_in_progress_is_imported_with_its_pending_attempts(built, tmp_path):
    (built.run / ".coral/public/manager.pid").write_text(str(os.getpid()))  # a live manager
    proc = sftree("import-coral", built.run, "--out", tmp_path / "t")
    assert proc.returncode == 0, proc.stderr
    assert "the run is in progress" in proc.stderr and "import again later" in proc.stderr
    report = json.loads((tmp_path / "t" / ic.REPORT_JSON).read_text())
    assert report["coral"]["in_progress"] is True and report["counts"]["pending"] == 1


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda run: shutil.rmtree(run / ".coral/public/.git"), "no checkpoint repository"),
        (lambda run: shutil.rmtree(run / "repo"), "no code repository"),
        (lambda run: shutil.rmtree(run / ".coral/public/attempts"), "no attempt records"),
        (lambda run: shutil.rmtree(run / ".coral"), "is not a Coral run folder"),
    ],
)
def test_a_run_that_cannot_be_read_is_one_clear_error(built, tmp_path, breakage, message):
    breakage(built.run)
    proc = sftree("import-coral", built.run, "--out", tmp_path / "t")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_direction_and_foreign_output_are_refused(built, tmp_path):
    proc = sftree("import-coral", built.run, "--out", tmp_path / "t", "--direction", "minimize")
    assert proc.returncode == 2 and "graded it to maximize" in proc.stderr
    other = tmp_path / "other"
    (other / "eval-000001-agent-1-abcdef123456").mkdir(parents=True)
    (other / "eval-000001-agent-1-abcdef123456" / "metadata.json").write_text("{}")
    proc = sftree("import-coral", built.run, "--out", other)
    assert proc.returncode == 2 and "which import-coral did not make" in proc.stderr


def test_shared_items_all_adds_the_agents_logs(built, tmp_path):
    run_import(built.run, tmp_path / "t", items=list(ic.CORAL_ITEMS))
    snap = snapshots(tmp_path / "t")[-1]
    assert (snap / "shared/logs/agent-2.0.log").read_bytes() == tree_files(
        built.run / ".coral/public", built.checkpoints[-1]
    )["logs/agent-2.0.log"][1]
    assert not (snap / "shared/agent.pids").exists() and not (snap / "shared/eval_count").exists()


def test_file_kinds_are_written_as_git_stores_them(tmp_path):
    specs = [
        Spec("agent-1", {"run.sh": ("x", b"#!/bin/sh\necho hi\n"), "link": ("l", "/etc/passwd")}),
        Spec("agent-1", {"sub/deep/file.txt": b"deep\n", "link": ("l", "sub/deep/file.txt")}),
    ]
    built = build_run(tmp_path / "run", specs)
    run_import(built.run, tmp_path / "t")
    first, second = snapshots(tmp_path / "t")
    assert stat.S_IMODE((first / "code/run.sh").stat().st_mode) == 0o555
    assert os.readlink(first / "code/link") == "/etc/passwd"  # a symlink as stored, never followed
    assert (first / "code/link").is_symlink()
    assert os.readlink(second / "code/link") == "sub/deep/file.txt"
    assert (second / "code/sub/deep/file.txt").read_bytes() == b"deep\n"


def test_a_store_file_with_many_links_is_followed_by_a_fresh_copy(built, tmp_path, monkeypatch):
    monkeypatch.setattr(ic, "LINK_SOFT_MAX", 3)
    out = tmp_path / "t"
    run_import(built.run, out)
    first = built.records[0]["commit_hash"]
    files = [s / "shared/attempts" / f"{first}.json" for s in snapshots(out)]
    assert {f.read_bytes() for f in files} == {
        (built.run / ".coral/public/attempts" / f"{first}.json").read_bytes()
    }
    assert max(f.stat().st_nlink for f in files) <= 3
    assert any(n.endswith(".1") for n in os.listdir(out / ic.STATE_DIR / "blobs"))
    run_import(built.run, out)  # a rerun starts from the newest copy
    assert max(f.stat().st_nlink for f in files) <= 3


def test_the_command_is_registered():
    assert "import-coral" in sftree("--help").stdout
    proc = sftree("import-coral", "--help")
    assert proc.returncode == 0 and "--shared-items" in proc.stdout and "RUN_DIR" in proc.stdout


def test_brackets_inside_a_records_strings_are_not_nesting(built, tmp_path):
    """The depth limit on records (100) counts arrays and objects, never brackets or quotes inside strings."""
    rec = dict(built.records[1], feedback='say "[[[" \\" ' + "[{" * 500, metadata={"a": [[[[{"b": "]]}"}]]]]})
    (built.run / ".coral/public/attempts" / f"{rec['commit_hash']}.json").write_bytes(record_bytes(rec))
    result = run_import(built.run, tmp_path / "t")
    assert result.problems == [] and result.counts["snapshots"] == 8
