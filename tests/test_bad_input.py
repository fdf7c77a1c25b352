"""Bad input ends with one clear line naming the path or key, exit 2, no output folder, nothing modified."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from helpers.cli import fails
from helpers.explore import explore_cmd, make_root, write_config

from sftree import cli


def snapshot_of(path: Path) -> dict[str, bytes | str]:
    """Every entry under path with its content (files) or kind: to show nothing was modified."""
    out = {}
    for top, dirs, files in os.walk(os.fsencode(path)):
        for name in dirs + files:
            p = os.path.join(top, name)
            if os.path.islink(p) or not os.path.isfile(p):
                out[p] = "dir" if os.path.isdir(p) else "special"
            else:
                with open(p, "rb") as fh:
                    out[p] = fh.read()
    return out


@pytest.fixture
def setup(tmp_path):
    root = make_root(tmp_path)
    cfg = write_config(tmp_path, {"root_children": 1, "max_depth": 1, "parallel_width": 1})
    return tmp_path, root, cfg


def explore_argv(root, out, cfg) -> list[str]:
    return ["explore", "--root", str(root), "--out", str(out), "--config", str(cfg)]


def test_root_symlink_loop(setup, capsys):
    tmp, _, cfg = setup
    loop = tmp / "loop"
    loop.symlink_to(loop)
    out = tmp / "trees" / "t"
    fails(capsys, explore_argv(loop, out, cfg), f"--root {loop}", "cannot be resolved")
    assert not out.exists() and not (tmp / "trees").exists()


def test_out_under_a_file(setup, capsys):
    tmp, root, cfg = setup
    (tmp / "afile").write_text("x")
    out = tmp / "afile" / "trees" / "t"
    fails(capsys, explore_argv(root, out, cfg), f"--out {out}", f"{tmp / 'afile'} exists and is not a folder")
    assert (tmp / "afile").read_text() == "x"


@pytest.mark.parametrize(
    "sim, needles",
    [
        ({"seed": 0, "colour": "red"}, ["teacher.sim", "'colour' was unexpected"]),
        ({"seed": "abc"}, ["teacher.sim.seed", "'abc' is not of type 'integer'"]),
        ({"seed": 0, "fault_rate": "http_500=lots"}, ["--fault-rate", "http_500='lots'"]),
    ],
)
def test_bad_teacher_sim_options(setup, capsys, sim, needles):
    tmp, root, cfg = setup
    data = yaml.safe_load(cfg.read_text())
    data["teacher"]["sim"] = sim
    cfg.write_text(yaml.safe_dump(data))
    out = tmp / "trees" / "t"
    fails(capsys, explore_argv(root, out, cfg), *needles)
    assert not (tmp / "trees").exists()


def test_missing_prompt_template_before_first_dispatch(setup, capsys):
    tmp, root, cfg = setup
    data = yaml.safe_load(cfg.read_text())
    data["agent"]["prompts"] = {"system": str(tmp / "no-such-system.md")}  # used only inside an edge
    cfg.write_text(yaml.safe_dump(data))
    out = tmp / "trees" / "t"
    fails(capsys, explore_argv(root, out, cfg), "prompt template 'system'", "no-such-system.md")
    assert not (tmp / "trees").exists()  # no store, no edge: nothing was dispatched


def test_unreachable_teacher_leaves_no_tree_folder(tmp_path, capsys):
    root = make_root(tmp_path)
    cfg = write_config(tmp_path, {"root_children": 1, "max_depth": 1}, base_url="http://127.0.0.1:9/v1")
    data = yaml.safe_load(cfg.read_text())
    data["teacher"]["health_timeout"] = 0.3
    cfg.write_text(yaml.safe_dump(data))
    out = tmp_path / "trees" / root.name
    fails(capsys, explore_argv(root, out, cfg), "Teacher server at http://127.0.0.1:9 not ready")
    assert not (tmp_path / "trees").exists()


@pytest.mark.parametrize("kind", ["fifo", "socket", "non_utf8_name"])
def test_root_with_unexplorable_entries_is_refused_up_front(setup, capsys, kind):
    tmp, root, cfg = setup
    code = root / "code"
    if kind == "fifo":
        os.mkfifo(code / "pipe")
        bad, why = "pipe", "a FIFO"
    elif kind == "socket":
        sock_dir = Path(tempfile.mkdtemp(prefix="s11-", dir="/tmp"))  # AF_UNIX paths must stay short
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(sock_dir / "s"))
        s.close()
        os.rename(sock_dir / "s", code / "sock")
        shutil.rmtree(sock_dir)
        bad, why = "sock", "a socket"
    else:
        with open(os.path.join(os.fsencode(code), b"caf\xe9.py"), "w") as fh:
            fh.write("X = 1\n")
        bad, why = "caf\\udce9.py", "file name is not UTF-8"
    before = snapshot_of(root)
    out = tmp / "trees" / "t"
    fails(capsys, explore_argv(root, out, cfg), f"{code}/{bad}: {why}")
    assert not (tmp / "trees").exists() and snapshot_of(root) == before


def test_select_roots_refuses_a_fifo_in_a_snapshot(tmp_path, example_snapshots_dir, capsys):
    snaps = tmp_path / "snaps"
    shutil.copytree(example_snapshots_dir / "circle_packing", snaps / "circle_packing")
    for d in (snaps / "circle_packing").glob("eval-*"):
        os.mkfifo(d / "code" / "pipe")
    out = tmp_path / "results" / "roots"
    # Placing files one by one needs them to be files or folders; a linked root (the default) is checked by
    # explore instead (tests/test_roots_links.py).
    argv = ["select-roots", "--snapshots", str(snaps / "circle_packing"), "--task", "circle_packing",
            "--direction", "maximize", "--num-roots", "3", "--out", str(out), "--link", "hardlink",
            "--table", str(tmp_path / "results" / "stages.tsv")]  # fmt: skip
    fails(capsys, argv, "/code/pipe: a FIFO, not a file or folder")
    assert not (tmp_path / "results").exists()


def test_teacher_sim_bad_port_port_in_use_and_fault_rate(capsys):
    fails(capsys, ["teacher-sim", "--port", "99999"], "--port: 99999 is not a TCP port")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        fails(capsys, ["teacher-sim", "--port", str(port)], f"cannot listen on 127.0.0.1:{port}", "in use")
    finally:
        busy.close()
    fails(
        capsys, ["teacher-sim", "--port", "0", "--fault-rate", "http_500=abc"], "--fault-rate: http_500='abc'"
    )


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tree")
    root = make_root(tmp)
    cfg = write_config(tmp, {"root_children": 1, "max_depth": 1, "parallel_width": 1})
    out = tmp / "trees" / root.name
    assert cli.main(explore_argv(root, out, cfg)) == 0
    return out


def test_select_paths_validates_the_tree_first(small_tree, tmp_path, capsys):
    tree = json.loads((small_tree / "tree.json").read_text())
    tree["nodes"][1]["score"] = "2.5"  # a string: read as "no score" it would silently drop every path
    bad = tmp_path / "tree.json"
    bad.write_text(json.dumps(tree))
    out = tmp_path / "paths.json"
    capsys.readouterr()
    assert cli.main(["select-paths", "--tree", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"tree file {bad}" in err and "nodes.1.score: '2.5' is not of type 'number', 'null'" in err
    assert not out.exists()


def test_non_utf8_steps_jsonl_names_file_and_line(small_tree, tmp_path, capsys):
    tree_dir = tmp_path / "trees" / small_tree.name
    shutil.copytree(small_tree, tree_dir)
    paths = tree_dir / "paths.json"
    assert cli.main(["select-paths", "--tree", str(tree_dir / "tree.json"), "--out", str(paths)]) == 0
    steps = tree_dir / "edges" / "e1" / "steps.jsonl"
    lines = steps.read_bytes().splitlines(keepends=True)
    steps.write_bytes(lines[0] + b'{"bad": "\xff\xfe"}\n' + b"".join(lines[1:]))
    out = tmp_path / "sft.jsonl"
    fails(capsys, ["export-sft", "--paths", str(paths), "--out", str(out)], f"{steps} line 2: not UTF-8")
    assert not out.exists()


# --- temporary folders ------------------------------------------------------------------------------------------


def _ours(tmpdir: Path) -> list[str]:
    return sorted(p.name for p in tmpdir.iterdir() if p.name.startswith(("sftree-coral-", "sftree-grade-")))


def _run_env(tmpdir: Path) -> dict:
    return {**os.environ, "TMPDIR": str(tmpdir)}


@pytest.fixture
def private_tmp():
    d = Path(tempfile.mkdtemp(prefix="t11-", dir="/tmp"))  # short: coral sockets live under it
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_temp_folders_removed_after_a_run_and_after_a_failure(tmp_path, private_tmp):
    root = make_root(tmp_path)
    cfg = write_config(tmp_path, {"root_children": 1, "max_depth": 1, "parallel_width": 1})
    res = subprocess.run(
        explore_cmd(root, tmp_path / "t1", cfg), env=_run_env(private_tmp), capture_output=True
    )
    assert res.returncode == 0 and (tmp_path / "t1" / "tree.json").exists()
    assert _ours(private_tmp) == []
    # the Teacher goes down during the second turn: the run fails (rerun resumes), its temp folders are gone
    data = yaml.safe_load(cfg.read_text())
    data["teacher"]["sim"]["script"] = [{"match": {"turn": 2}, "fault": "http_500"}]
    cfg.write_text(yaml.safe_dump(data))
    res = subprocess.run(
        explore_cmd(root, tmp_path / "t2", cfg), env=_run_env(private_tmp), capture_output=True
    )
    assert res.returncode == 2 and b"Traceback" not in res.stderr
    assert (tmp_path / "t2" / "tree.live.json").exists()
    assert _ours(private_tmp) == []


def _kill_mid_edge(cmd, tmpdir: Path, sig: int) -> None:
    proc = subprocess.Popen(cmd, env=_run_env(tmpdir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _ours(tmpdir):
            time.sleep(0.05)
        assert _ours(tmpdir), "no edge started"
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == -sig
    finally:
        proc.kill()
        proc.wait()


def test_temp_folders_removed_on_sigterm_and_after_kill_9(tmp_path, private_tmp):
    root = make_root(tmp_path)
    cfg = write_config(tmp_path, {"root_children": 2, "max_depth": 2, "parallel_width": 2})
    data = yaml.safe_load(cfg.read_text())
    data["teacher"]["sim"]["latency_ms_per_token"] = 2.0  # slow enough to be caught mid-edge
    cfg.write_text(yaml.safe_dump(data))
    out = tmp_path / "trees" / root.name
    cmd = explore_cmd(root, out, cfg)
    _kill_mid_edge(cmd, private_tmp, signal.SIGTERM)
    assert _ours(private_tmp) == []
    assert (out / "tree.live.json").exists()  # a rerun resumes
    # kill -9 cannot clean up; the next run removes what the dead process left, and only that
    _kill_mid_edge(cmd, private_tmp, signal.SIGKILL)
    left = _ours(private_tmp)
    assert left
    alive = private_tmp / f"sftree-coral-{os.getpid()}-keep"  # a live process's folder is not touched
    alive.mkdir()
    data["teacher"]["sim"]["latency_ms_per_token"] = 0.0
    cfg.write_text(yaml.safe_dump(data))
    res = subprocess.run(cmd, env=_run_env(private_tmp), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"removed {len(left)} temporary folder(s) of killed runs" in res.stderr
    assert _ours(private_tmp) == [alive.name]
