"""`sftree import-coral` on a hostile Coral run: its agents wrote the repositories and `.coral/public`.

Nothing of the run's git config, hooks, attributes or filters may run (a marker file shows it), no symlink is
followed out of the run, and a crafted tree cannot make the import write outside its output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.coralrun import Spec, build_run, git, record_bytes, simple_specs  # noqa: E402

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


# --- issue 32: nothing the run holds can hang the import or exhaust the host's memory -----------------------

# Runs the CLI, then prints the largest resident set of it and the processes it waited for (its git readers).
_PEAK = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:]).returncode\n"
    "print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(rc)\n"
)
AS_LIMIT = 3 << 30  # address space of the import: an unbounded read fails fast instead of filling the host


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def bounded_import(run: Path, out: Path, timeout: float = 60) -> tuple[int, str, str, int]:
    """(exit status, stdout, stderr, peak KiB) of `sftree import-coral RUN --out OUT` as a fresh process with a
    capped address space. A run past `timeout` kills its whole process group (git blocked on a FIFO too) and
    fails the test: a hang must fail, not block the suite."""
    cmd = [
        sys.executable,
        "-c",
        _PEAK,
        sys.executable,
        "-m",
        "sftree",
        "import-coral",
        str(run),
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_limit_memory,
    )  # fmt: skip
    try:
        so, se = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"sftree import-coral did not finish in {timeout} s (it hangs)")
    lines = se.splitlines()
    peak = int(lines[-1].split()[1]) if lines and lines[-1].startswith("PEAK_KB") else 0
    return proc.returncode, so, "\n".join(lines[:-1]), peak


def add_record(built, commit: str, when: str = "2026-03-02T00:00:00+00:00", **fields) -> dict:
    rec = dict(built.records[0], commit_hash=commit, timestamp=when, **fields)
    (built.run / ".coral/public/attempts" / f"{commit}.json").write_bytes(record_bytes(rec))
    return rec


def loose_path(git_dir: Path, oid: str) -> Path:
    return git_dir / "objects" / oid[:2] / oid[2:]


@pytest.mark.parametrize("where", ["loose commit", "loose blob", "pack index", "pack data", "attempt record"])
def test_a_fifo_among_the_git_objects_never_hangs_the_import(base, where):
    """Item 6: git opens an object file without O_NONBLOCK, so a FIFO in its place blocked it for ever. (The
    attempt record, read by sftree itself, was already opened O_NONBLOCK: kept here so every kind of file the
    import reads is covered.)"""
    built = build_run(base / "run", simple_specs(4, pending_tail=0))
    repo = built.run / "repo"
    if where.startswith("loose"):
        blob = git("hash-object", "-w", "--stdin", cwd=repo, input=b"a loose blob\n").strip()
        tree = git("mktree", cwd=repo, input=f"100644 blob {blob}\tsolution.py\n".encode()).strip()
        commit = git("commit-tree", tree, "-m", "loose", cwd=repo).strip()
        add_record(built, commit)
        victim = loose_path(repo / ".git", commit if where == "loose commit" else blob)
    elif where == "attempt record":
        victim = built.run / ".coral/public/attempts" / f"{built.records[1]['commit_hash']}.json"
    else:
        git("repack", "-a", "-d", "-q", cwd=repo)  # the objects into one pack (fast-import left them loose)
        pack = repo / ".git/objects/pack"
        victim = next(pack.glob("*.idx" if where == "pack index" else "*.pack"))
    victim.unlink()
    os.mkfifo(victim)
    out = base / "out"
    rc, so, se, _ = bounded_import(built.run, out)
    assert "Traceback" not in se, se
    shown = f"{victim.relative_to(built.run)}: a FIFO"
    if where == "attempt record":
        assert rc == 0 and se.count("import-coral: problem: ") == 1, se
        assert f"{victim.relative_to(built.run)}: is a FIFO, not a regular file" in se, se
        assert len(snapshot_names(out)) == 3
    elif where.startswith("loose"):  # only the attempt that needs the object fails
        assert rc == 0 and se.count("import-coral: problem: ") == 1, se
        assert shown in se and "not a regular file" in se, se
        assert len(snapshot_names(out)) == 4
    else:  # git reads every pack index at start: the run is refused, with the path
        assert rc == 2 and shown in se and "not a regular file" in se, se
        assert not snapshot_names(out)


def test_a_fifo_put_in_after_the_check_ends_the_read_instead_of_hanging(base, monkeypatch):
    """Item 6, the race of a live run: an agent swaps an object file for a FIFO after check_objects_dir looked.
    git blocks on it; the reader's watchdog kills git after STALL_SECONDS and the import ends with the reason."""
    from sftree.errors import InputError
    from sftree.roots import gitobjects as go

    monkeypatch.setattr(go, "STALL_SECONDS", 1.0, raising=False)
    built = build_run(base / "run", simple_specs(2, pending_tail=0))
    repo = built.run / "repo"
    blob = git("hash-object", "-w", "--stdin", cwd=repo, input=b"swapped\n").strip()
    objects = go.check_objects_dir(built.run, "repo/.git/objects", "objects")
    assert objects.refused == {}
    loose_path(repo / ".git", blob).unlink()
    os.mkfifo(loose_path(repo / ".git", blob))
    reader = go.ObjectReader(go.host_git_dir(base / "host.git", [objects.path], "sha1"), "sha1", 1 << 20)
    outcome: list = []

    def read() -> None:
        try:
            reader.read(blob, "blob")
        except Exception as exc:  # noqa: BLE001 - the test looks at what it is
            outcome.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(30)
    try:
        assert not t.is_alive(), "the read still hangs after 30 s"
        assert len(outcome) == 1 and isinstance(outcome[0], InputError), outcome
        assert "sent nothing for 1 s" in str(outcome[0]) and blob in str(outcome[0])
    finally:
        if t.is_alive():
            reader.proc.kill()
        reader.close()


def test_a_deeply_nested_attempt_record_is_one_problem(base):
    """Item 7: 100,000 nested lists in one record stopped the whole import with a RecursionError."""
    built = build_run(base / "run", simple_specs(4, pending_tail=0))
    victim = built.records[1]
    path = built.run / ".coral/public/attempts" / f"{victim['commit_hash']}.json"
    deep = b"[" * 100_000 + b"]" * 100_000
    path.write_bytes(record_bytes(dict(victim, metadata="@@")).replace(b'"@@"', deep))
    rc, so, se, _ = bounded_import(built.run, base / "out")
    assert rc == 0 and "Traceback" not in se, se
    assert se.count("import-coral: problem: ") == 1 and "nested deeper than" in se, se
    assert len(snapshot_names(base / "out")) == 3


BOMB = (
    "task:\n  name: bomb\ngrader:\n"
    '  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "  b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n  c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "  d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n  e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "  f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n  g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "  direction: [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
)


@pytest.mark.parametrize(
    "config, field",
    [
        (BOMB, "grader.b"),  # the first alias, long before grader.direction would expand it
        ("task:\n  name: " + "[" * 5000 + "]" * 5000 + "\ngrader:\n  direction: maximize\n", "task.name"),
    ],
    ids=["alias bomb", "nested flow sequences"],
)
def test_a_hostile_config_yaml_is_one_clear_error(base, config, field):
    """Item 8: an alias bomb took 2.7 GB and its refusal printed the expanded value; 5000 nested sequences gave a
    traceback. Now: refused with the file and the field, nothing expanded, nothing printed of the value."""
    built = build_run(base / "run", simple_specs(3))
    (built.run / ".coral/config.yaml").write_text(config)
    rc, so, se, peak = bounded_import(built.run, base / "out")
    assert rc == 2 and "Traceback" not in se and "MemoryError" not in se, se[-3000:]
    assert ".coral/config.yaml" in se and field in se, se
    assert "lol" not in se and len(se) < 2000, se[:3000]
    assert peak < 300 << 10, f"peak {peak} KiB"
    assert not snapshot_names(base / "out")


def test_a_tree_of_millions_of_entries_is_refused_as_it_is_read(base):
    """Item 9: one tree object of 2.2M entries (a 77 MB tree) was read and parsed whole (about 1 GB) before the
    2M-entry limit was checked. Now the entries are counted as they are read, and reading stops at the limit."""
    built = build_run(base / "run", simple_specs(3, pending_tail=0))
    repo = built.run / "repo"
    blob = bytes.fromhex(git("hash-object", "-w", "--stdin", cwd=repo, input=b"x\n").strip())
    raw = b"".join(b"100644 %07d\0" % i + blob for i in range(2_200_000))
    commit = crafted_tree_commit(repo, raw)
    del raw
    add_record(built, commit)
    rc, so, se, peak = bounded_import(built.run, base / "out", timeout=180)
    assert rc == 0 and "Traceback" not in se, se[-3000:]
    assert se.count("import-coral: problem: ") == 1 and "more than 2000000" in se, se
    assert len(snapshot_names(base / "out")) == 3
    assert peak < 400 << 10, f"peak {peak} KiB: the tree was held whole"


def crafted_tree_commit(repo: Path, raw: bytes) -> str:
    tree = git("hash-object", "-t", "tree", "--literally", "-w", "--stdin", cwd=repo, input=raw).strip()
    return git("commit-tree", tree, "-m", "crafted", cwd=repo).strip()


ESC = "\x1b]0;owned\x07\x1b[2J\x1b[31m"


@pytest.mark.parametrize("where", ["record file name", "tree entry name", "object folder name"])
def test_terminal_escapes_in_names_are_printed_escaped(base, where):
    """Item 10: a file name holding terminal escape sequences reached the terminal raw in the problem line."""
    built = build_run(base / "run", simple_specs(3, pending_tail=0))
    repo = built.run / "repo"
    if where == "record file name":
        (built.run / ".coral/public/attempts" / f"{ESC}.json").write_text("{}")
    elif where == "tree entry name":
        blob = git("hash-object", "-w", "--stdin", cwd=repo, input=b"x\n").strip()
        raw = b"100600 " + ESC.encode() + b"\0" + bytes.fromhex(blob)  # an unknown mode: a problem naming it
        add_record(built, crafted_tree_commit(repo, raw))
    else:
        (repo / ".git/objects/pack" / ESC).symlink_to("/etc")
    rc, so, se, _ = bounded_import(built.run, base / "out")
    assert "Traceback" not in se, se
    assert "\x1b" not in so + se and "\x07" not in so + se, repr(se)
    assert "\\x1b]0;owned\\x07\\x1b[2J" in se, se
    if where != "object folder name":
        assert rc == 0 and se.count("import-coral: problem: ") == 1, se
        for report in ("import-coral.tsv", "import-coral.json"):
            assert "\x1b" not in (base / "out" / report).read_text(), report
    else:
        assert rc == 2
