"""Packaged Coral graders (task.yaml `grader.entrypoint` + `grader.setup`, sftree.world.grader_env): the task loads,
its grader venv is built once and reused (cache outside results/, keyed by the grader section and files), graded
code cannot see the venv or the grader package, and a bad entrypoint or setup is one line naming the task folder,
the field and the cause (`sftree grader-env`, the workflow's preflight). With the stand-in, and with the real Coral
where it is installed (scripts/install_coral.sh: editable, from a source root, which Coral's setup_grader_env
installs into each grader venv)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.coral import coral_python, grading_worlds, install_for

from sftree.errors import InputError
from sftree.runtime.sandbox import bwrap_works
from sftree.settings import CoralSettings, section_settings
from sftree.world import grader_env
from sftree.world.grading import grade
from sftree.world.task import load_coral_task

SANDBOX = "bwrap" if bwrap_works() else "none"
pytestmark = pytest.mark.skipif(grader_env.find_uv() is None, reason="no uv (scripts/setup.sh installs it)")

GRADER = """
from coral.grader import TaskGrader


class Grader(TaskGrader):
    def evaluate(self):
        res = self.run_program("solution.py")
        return float(res.stdout.strip().splitlines()[-1])


class NotAGrader:
    pass
"""

# The graded program: 1 per grader-side thing it can see (the venv, the grader package, the task folder), else 0.
PROGRAM = """
import os, sys, glob
seen = [p for p in {paths!r} if os.path.exists(p)]
seen += glob.glob("/**/mygrader*", recursive=False)
print(len(seen) + 10 * (sys.executable.find("grader_venv") >= 0))
"""


@pytest.fixture(params=grading_worlds())
def install(request):
    return install_for(request.param)


def make_task(base: Path, setup=None, entry="mygrader.grader:Grader") -> Path:
    task = base / "task"
    pkg = task / "pkg" / "mygrader"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "grader.py").write_text(GRADER)
    (task / "pkg" / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "mygrader"\nversion = "0.1"\n[tool.setuptools]\npackages = ["mygrader"]\n'
    )
    (task / "seed").mkdir()
    (task / "seed" / "solution.py").write_text("print(1.5)\n")
    data = {
        "task": {"name": "packaged", "description": "d"},
        "grader": {
            "entrypoint": entry,
            "setup": setup if setup is not None else ["uv pip install ./pkg"],
            "timeout": 60,
        },
    }
    (task / "task.yaml").write_text(yaml.safe_dump(data))
    return task


def spec_for(task: Path, cache: Path):
    return load_coral_task(task, "packaged", {"coral": {"grader_venv_cache": str(cache)}})


def test_packaged_task_loads(tmp_path):
    spec = spec_for(make_task(tmp_path), tmp_path / "cache")
    assert spec.entrypoint == "mygrader.grader:Grader" and spec.setup == ("uv pip install ./pkg",)


def test_built_once_reused_rebuilt_on_change(tmp_path, install):
    task, cache = make_task(tmp_path), tmp_path / "cache"
    first = grader_env.preflight(spec_for(task, cache), install, tmp_path / "setup.log")
    second = grader_env.preflight(spec_for(task, cache), install, tmp_path / "setup.log")
    assert first.built and not second.built and first.key == second.key and first.path == second.path
    assert "$ uv pip install ./pkg" in (tmp_path / "setup.log").read_text() or install is not None
    assert "grader venv reused" in (tmp_path / "setup.log").read_text()
    (task / "pkg" / "mygrader" / "grader.py").write_text(GRADER.replace("float(", "2 * float("))
    third = grader_env.preflight(spec_for(task, cache), install)
    assert third.built and third.key != first.key
    r = grade(spec_for(task, cache), task / "seed", commit="a" * 40, install=install, sandbox=SANDBOX)
    assert (r.status, r.score) == ("scored", 3.0)  # the rebuilt package grades


def test_graded_code_cannot_see_grader_venv(tmp_path, install):
    task, cache = make_task(tmp_path), tmp_path / "cache"
    spec = spec_for(task, cache)
    venv = grader_env.preflight(spec, install)
    code = tmp_path / "code"
    code.mkdir()
    paths = [str(venv.path), str(task / "pkg"), "/workspace/results/packaged/.coral/private/grader_venv"]
    (code / "solution.py").write_text(PROGRAM.format(paths=paths))
    r = grade(spec, code, commit="b" * 40, install=install, sandbox=SANDBOX)
    assert r.status == "scored" and r.runs == 1, r.feedback
    if SANDBOX == "bwrap":
        assert r.score == 0.0, r.feedback  # nothing of the grader's side, and not run by the venv's Python


@pytest.mark.parametrize(
    "setup,entry,words",
    [
        (["uv pip install ./pkg", "exit 7"], None, ["grader.setup", "`exit 7` failed (exit 7)"]),
        (None, "nosuch.module:Grader", ["grader.entrypoint", "does not import", "nosuch"]),
        (None, "mygrader.grader:NotAGrader", ["grader.entrypoint", "not a TaskGrader subclass"]),
        (None, "mygrader.grader:Missing", ["grader.entrypoint", "has no 'Missing'"]),
    ],
    ids=["setup-fails", "no-import", "not-taskgrader", "no-class"],
)
def test_preflight_one_line(tmp_path, setup, entry, words):
    task = make_task(tmp_path, setup=setup, entry=entry or "mygrader.grader:Grader")
    with pytest.raises(InputError) as err:
        grader_env.preflight(spec_for(task, tmp_path / "cache"), None, tmp_path / "setup.log")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(task)) and all(w in msg for w in words), msg
    # the same line from the workflow's preflight command, nothing written
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "tasks": {"packaged": {"coral_task": str(task)}},
                "coral": {"mode": "stand-in", "grader_venv_cache": str(tmp_path / "cache2")},
            }
        )
    )
    out = tmp_path / "res" / "grader_env.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sftree",
            "grader-env",
            "--task",
            "packaged",
            "--out",
            str(out),
            "--config",
            str(cfg),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{Path(grader_env.find_uv()).parent}:{os.environ['PATH']}"},
    )
    assert proc.returncode == 2 and not out.exists()
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("sftree grader-env: error: ") and all(w in line for w in words), proc.stderr


def test_failed_build_is_not_reused(tmp_path):
    task, cache = make_task(tmp_path, setup=["uv pip install ./pkg", "test -f ok"]), tmp_path / "cache"
    with pytest.raises(InputError):
        grader_env.ensure(spec_for(task, cache), None)
    assert not any(cache.glob("*/ready.json"))


def test_import_coral_never_touches_grader_venv(tmp_path):
    """import-coral reads a run whose task used a packaged grader: its .coral/private/grader_venv (here a FIFO that
    would block a reader, a Python that leaves a mark when run, a link loop, links out of the run to a FIFO and to
    a marked file) is never read or executed."""
    from helpers.coralrun import build_run, simple_specs

    from sftree.roots.import_coral import run_import

    built = build_run(tmp_path / "run", simple_specs(4))
    coral_dir = next(p for p in built.run.rglob(".coral") if p.is_dir())
    venv = coral_dir / "private" / "grader_venv"
    (venv / "bin").mkdir(parents=True)
    mark = tmp_path / "ran"
    for name in ("python", "python3", "uv", "coral"):
        (venv / "bin" / name).write_text(f"#!/bin/sh\ntouch {mark}\n")
        (venv / "bin" / name).chmod(0o755)
    os.mkfifo(venv / "pyvenv.cfg")
    (venv / "loop").symlink_to(venv / "loop")
    outside = tmp_path / "outside"  # links out of the run: a FIFO (a reader blocks) and a file with a mark
    outside.mkdir()
    os.mkfifo(outside / "fifo")
    (outside / "secret.txt").write_text("CANARY-grader-venv-outside\n")
    (venv / "lib").symlink_to(outside)
    (venv / "bin" / "activate").symlink_to(outside / "fifo")
    result = run_import(built.run, tmp_path / "snaps" / "demo")
    assert sum(result.actions.values()) >= 4 and not mark.exists()
    written = [p for p in (tmp_path / "snaps").rglob("*") if p.is_file() and not p.is_symlink()]
    assert not any("grader_venv" in str(p) for p in (tmp_path / "snaps").rglob("*"))
    assert not any(b"CANARY-grader-venv-outside" in p.read_bytes() for p in written)


def _site_listing(python: str) -> list[str]:
    out = subprocess.run(
        [python, "-c", "import site, os; print('\\n'.join(sorted(os.listdir(site.getsitepackages()[0]))))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


@pytest.mark.coral
def test_building_leaves_corals_own_environment_alone(tmp_path):
    """Coral's setup_grader_env installs into the grader venv only (VIRTUAL_ENV): nothing sftree passes to it (an
    interpreter choice for `uv venv`) may send `uv pip install` into the interpreter Coral itself runs on."""
    if coral_python() is None:
        pytest.skip("the real Coral is not installed")
    install = install_for("coral")
    before = _site_listing(install.python)
    venv = grader_env.preflight(spec_for(make_task(tmp_path), tmp_path / "cache"), install)
    assert _site_listing(install.python) == before
    assert any(n.startswith("mygrader") for n in _site_listing(str(venv.python)))


@pytest.mark.coral
@pytest.mark.skipif(not coral_python(), reason="needs the real Coral (scripts/install_coral.sh)")
def test_a_non_editable_coral_is_told_the_cause_and_the_fix(tmp_path, monkeypatch):
    """A plain `pip install coral`: the package lies in a site-packages folder, which Coral's setup_grader_env
    cannot install editable into the grader venv. sftree says so, and the fix, before building; without that
    check the real Coral fails with uv's own words, which name neither."""
    import shutil
    import sysconfig  # noqa: F401 - the real Coral's interpreter is asked below

    from sftree.world.locate import locate

    real = install_for("coral")
    site = tmp_path / "site-packages"  # the package as a wheel install leaves it: no pyproject.toml beside it
    shutil.copytree(real.package, site / "coral", ignore=shutil.ignore_patterns("__pycache__"))
    deps = subprocess.run(
        [real.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    venv = tmp_path / "venv"
    subprocess.run([real.python, "-m", "venv", "--without-pip", str(venv)], check=True)
    vsite = next(venv.glob("lib/python*/site-packages"))
    (vsite / "plain_coral.pth").write_text(f"{site}\n{deps}\n")  # the copy first, then Coral's dependencies
    plain = locate(section_settings(CoralSettings, {"mode": "coral", "python": str(venv / "bin" / "python")}))
    assert Path(plain.package) == site / "coral"
    spec = spec_for(make_task(tmp_path), tmp_path / "cache")
    with pytest.raises(InputError) as err:
        grader_env.preflight(spec, plain, tmp_path / "setup.log")
    text = str(err.value)
    assert (
        "not an editable install" in text and "pip install -e" in text and "scripts/install_coral.sh" in text
    )
    assert "\n" not in text
    # what the check spares the user: the real Coral's own failure
    monkeypatch.setattr(grader_env, "not_buildable", lambda install: None)
    spec = spec_for(make_task(tmp_path / "again"), tmp_path / "cache2")
    with pytest.raises(InputError):
        grader_env.preflight(spec, plain, tmp_path / "coral-setup.log")
    assert "does not appear to be a Python project" in (tmp_path / "coral-setup.log").read_text()
    assert grader_env.not_buildable(real) is None  # the editable Coral of scripts/install_coral.sh builds
