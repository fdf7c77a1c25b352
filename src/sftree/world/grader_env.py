"""The grader venv of a packaged Coral task (`grader.entrypoint` + `grader.setup`), built once and cached.

    venv = ensure(spec, install, log=results/<task>/grader_setup.log)   # GraderVenv (path, key, built, seconds)
    check_entrypoint(spec, venv)                                         # InputError: one line, before any tree

With Coral installed it is Coral's own `setup_grader_env` that builds it (run in Coral's interpreter: `uv venv`,
Coral installed editable from its source root, then each `grader.setup` command in the task folder with
VIRTUAL_ENV and PATH pointing at the venv). Without Coral sftree does the same steps itself, with its stand-in
`coral` package put into the venv as an installed distribution (so a grader package that depends on `coral`
resolves without an index). `uv` is sftree's (the venv's `bin/uv`, pinned in pyproject.toml) or the one on PATH.

The cache (config `coral.grader_venv_cache`, else $XDG_CACHE_HOME/sftree/grader_venvs) is keyed by the task's
grader section, the files of the task folder (setup commands run there and may read any of them; seed/ and run
output excluded), any existing path outside it a setup command names, and which Coral (or the stand-in) and
Python build it. A key's folder counts only once its `ready.json` is written; builders of one key take turns
(a lock file), so N trees of a run build it once. Nothing of it lies under results/.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO, TypeAlias

from sftree.errors import InputError
from sftree.world.locate import CoralInstall
from sftree.world.task import TaskSpec

StrPath: TypeAlias = str | os.PathLike[str]

HERE = Path(__file__).resolve().parent
SKIP_DIRS = {"seed", ".git", "results", "latest", ".coral", "__pycache__", "build", "dist", ".venv"}
SETUP_TIMEOUT_S = 1800

# Run in Coral's interpreter: Coral's own builder, its log lines (and a failing command's output) to stderr.
_CORAL_BUILD = r"""
import json, logging, subprocess, sys
from pathlib import Path
from typing import TextIO, TypeAlias
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(message)s")
from coral.config import GraderConfig
from coral.workspace.grader_env import setup_grader_env
a = json.loads(sys.argv[1])
# The venv on the interpreter Coral runs on (Coral's own `uv venv` takes the first Python uv finds); Coral keeps
# an existing venv. Not UV_PYTHON: `uv pip install` would follow it into Coral's own environment.
venv = Path(a["coral_dir"]) / "private" / "grader_venv"
made = subprocess.run(["uv", "venv", "--python", sys._base_executable, str(venv)], capture_output=True, text=True)
sys.stderr.write(made.stdout + made.stderr)
if made.returncode:
    print(json.dumps({"error": f"`uv venv` failed (exit {made.returncode})"}))
    sys.exit(3)
try:
    setup_grader_env(Path(a["coral_dir"]), GraderConfig(entrypoint=a["entrypoint"], setup=a["setup"]),
                     Path(a["task_dir"]))
except RuntimeError as exc:
    sys.stderr.write(str(exc) + "\n")
    print(json.dumps({"error": str(exc).splitlines()[0] if str(exc) else "failed"}))
    sys.exit(3)
print(json.dumps({"ok": True}))
"""

# Run in the built venv: the entrypoint imports and names a TaskGrader subclass (Coral's worker's own checks).
_CHECK = r"""
import importlib, json, sys
spec = sys.argv[1]
mod, _, name = spec.rpartition(":")
try:
    cls = getattr(importlib.import_module(mod), name, None)
except BaseException as exc:
    print(json.dumps({"error": f"does not import: {type(exc).__name__}: {exc}"})); sys.exit(0)
if cls is None:
    print(json.dumps({"error": f"module {mod!r} has no {name!r}"})); sys.exit(0)
try:
    from coral.grader.task_grader import TaskGrader
except ImportError:
    from coral.grader import TaskGrader
if not (isinstance(cls, type) and issubclass(cls, TaskGrader)):
    print(json.dumps({"error": f"{cls!r} is not a TaskGrader subclass"})); sys.exit(0)
print(json.dumps({"ok": True}))
"""


# On PYTHONPATH of the grader venv's worker inside the grading sandbox (world/grading.py): what the grader starts
# with sys.executable (Coral's run_program, get_python_command) is sftree's forwarder, i.e. graded code.
SITECUSTOMIZE = """import os, sys
_f = os.environ.get("SFTREE_FORWARDER")
if _f:
    import multiprocessing
    multiprocessing.set_executable(sys.executable)
    sys.executable = _f
"""


@dataclass(frozen=True)
class GraderVenv:
    path: Path  # the venv (bin/python); graded through at <run_dir>/.coral/private/grader_venv
    key: str
    built: bool  # False: reused from the cache
    seconds: float  # building (or finding) it
    roots: tuple[str, ...]  # host folders its interpreter and editable installs need (read-only in a sandbox)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


def cache_root(spec: TaskSpec) -> Path:
    if spec.venv_cache:
        return Path(spec.venv_cache).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sftree" / "grader_venvs"


def find_uv() -> str | None:
    """sftree's uv (installed beside its interpreter by the set-up), else the one on PATH."""
    for cand in (Path(sys.executable).parent / "uv", Path(sysconfig.get_path("scripts")) / "uv"):
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return shutil.which("uv")


def _hash_tree(h: hashlib._Hash, root: Path, skip_top: bool) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if skip_top and not rel.parts and name == "task.yaml":
                continue  # its grader section is hashed on its own (a new description does not rebuild)
            if p.is_symlink() or not p.is_file():
                continue
            h.update(f"{p.relative_to(root)}\0{p.stat().st_size}\0".encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())


def _outside_paths(spec: TaskSpec) -> list[Path]:
    """Existing paths outside the task folder that a setup command names (`uv pip install ../shared/pkg`)."""
    out = []
    for cmd in spec.setup:
        try:
            words = shlex.split(cmd)
        except ValueError:
            continue
        for w in words:
            w = w.split("=", 1)[-1] if w.startswith("-") else w
            if not w or w.startswith("-"):
                continue
            p = (spec.folder / w).resolve() if not os.path.isabs(w) else Path(w)
            try:
                if p.exists() and spec.folder not in p.parents and p != spec.folder:
                    out.append(p)
            except OSError:
                continue
    return sorted(set(out))


def venv_key(spec: TaskSpec, install: CoralInstall | None) -> str:
    h = hashlib.sha256()
    grader = {k: (spec.coral.get("grader") or {}).get(k) for k in ("entrypoint", "setup")}
    who = (
        {"coral": install.version, "package": install.package, "python": install.python}
        if install
        else {"stand-in": _standin_digest(), "python": sys.executable}
    )
    h.update(json.dumps({"grader": grader, "by": who}, sort_keys=True).encode())
    _hash_tree(h, spec.folder, skip_top=True)
    for p in _outside_paths(spec):
        h.update(f"\0outside:{p}\0".encode())
        if p.is_dir():
            _hash_tree(h, p, skip_top=False)
        elif p.is_file():
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:24]


def _standin_digest() -> str:
    h = hashlib.sha256()
    _hash_tree(h, HERE / "standin_pkg", skip_top=False)
    return h.hexdigest()[:16]


def _env(uv: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV" and not k.startswith("VSCODE_")}
    env["PATH"] = f"{Path(uv).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env.update(extra or {})
    return env


def _run_setup(spec: TaskSpec, venv: Path, uv: str, log: TextIO) -> None:
    """The stand-in's `setup_grader_env`: the same steps and environment as Coral's (grader_env.py)."""
    env = _env(uv, {"VIRTUAL_ENV": str(venv)})
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        [uv, "venv", "--python", sys.executable, str(venv)], capture_output=True, text=True, env=_env(uv)
    )
    log.write(proc.stdout + proc.stderr)
    if proc.returncode:
        raise _SetupFailed(f"`uv venv` failed (exit {proc.returncode})")
    _install_standin(venv)
    for cmd in spec.setup:
        log.write(f"$ {cmd}\n")
        log.flush()
        try:
            step = subprocess.run(
                cmd,
                shell=True,
                cwd=spec.task_dir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=SETUP_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise _SetupFailed(f"`{cmd}` took longer than {SETUP_TIMEOUT_S} s") from None
        if step.returncode:
            raise _SetupFailed(f"`{cmd}` failed (exit {step.returncode})")


def _install_standin(venv: Path) -> None:
    """sftree's stand-in `coral` as an installed distribution of the venv (no build, no index)."""
    site = next((venv / "lib").glob("python*/site-packages"))
    shutil.copytree(
        HERE / "standin_pkg" / "coral", site / "coral", ignore=shutil.ignore_patterns("__pycache__")
    )
    dist = site / "coral-0.0.0+sftree.standin.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: coral\nVersion: 0.0.0+sftree.standin\n")
    (dist / "INSTALLER").write_text("sftree\n")
    files = [str(p.relative_to(site)) for p in (site / "coral").rglob("*") if p.is_file()]
    (dist / "RECORD").write_text("".join(f"{f},,\n" for f in [*files, f"{dist.name}/METADATA"]))


class _SetupFailed(Exception):
    pass


def _roots(venv: Path) -> tuple[str, ...]:
    """What the venv's interpreter and its editable installs need to be visible (pyvenv.cfg's home, the folders
    of `direct_url.json` editable installs)."""
    roots = set()
    try:
        for line in (venv / "pyvenv.cfg").read_text().splitlines():
            k, _, v = line.partition("=")
            if k.strip() == "home" and v.strip():
                roots.add(str(Path(v.strip()).resolve().parent))
    except OSError:
        pass
    try:
        roots.add(str((venv / "bin" / "python").resolve().parent.parent))
    except OSError:
        pass
    for du in venv.glob("lib/python*/site-packages/*.dist-info/direct_url.json"):
        try:
            data = json.loads(du.read_text())
        except (OSError, ValueError):
            continue
        url = data.get("url") or ""
        if (data.get("dir_info") or {}).get("editable") and url.startswith("file://"):
            roots.add(url[len("file://") :])
    return tuple(sorted(r for r in roots if r and r != "/"))


def ensure(
    spec: TaskSpec, install: CoralInstall | None, log: str | os.PathLike[str] | None = None
) -> GraderVenv:
    """The task's grader venv: from the cache, or built now (once per key, whoever asks first)."""
    if not spec.entrypoint:
        raise ValueError(f"task {spec.name}: not a packaged grader")
    t0 = time.monotonic()
    root = cache_root(spec)
    key = venv_key(spec, install)
    where = f"{spec.task_dir}: grader.setup"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{spec.task_dir}: grader venv cache {root} cannot be made: {exc}") from None
    home = root / key
    venv = home / ".coral" / "private" / "grader_venv"
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second tree waits for the first one's build, then reuses it
        if (home / "ready.json").is_file() and (venv / "bin" / "python").exists():
            _note(log, f"grader venv reused: {venv} (key {key})\n")
            return GraderVenv(venv, key, False, time.monotonic() - t0, _roots(venv))
        shutil.rmtree(home, ignore_errors=True)  # a build that did not finish
        home.mkdir()
        setup_log = home / "setup.log"
        uv = find_uv()
        if uv is None:
            raise InputError(
                f"{where}: no `uv` (Coral builds grader venvs with it): run scripts/setup.sh, or put uv on PATH"
            )
        if install is not None and (why := not_buildable(install)):
            raise InputError(f"{where}: {why}")
        with open(setup_log, "w", encoding="utf-8") as fh:
            fh.write(f"sftree: building the grader venv of {spec.task_dir} (key {key}) with {uv}\n")
            fh.flush()
            try:
                if install is not None:
                    _build_with_coral(spec, install, venv, uv, fh)
                else:
                    _run_setup(spec, venv, uv, fh)
            except _SetupFailed as exc:
                fh.flush()
                _copy_log(setup_log, log)
                shown = log or setup_log
                raise InputError(f"{where}: {exc} (output: {shown})") from None
        from sftree.fileio import write_json_atomic

        secs = time.monotonic() - t0
        write_json_atomic(home / "ready.json", {"key": key, "task_dir": str(spec.task_dir), "build_s": secs})
        _copy_log(setup_log, log)
        _note(log, f"grader venv built: {venv} (key {key}, {secs:.1f} s)\n")
        return GraderVenv(venv, key, True, secs, _roots(venv))


def not_buildable(install: CoralInstall) -> str | None:
    """Why this Coral cannot build a packaged grader's venv, with the fix; None when it can. Coral's
    `setup_grader_env` installs Coral itself into the venv with `uv pip install -e <the folder holding its
    package>`: a plain `pip install` leaves that folder site-packages, no Python project, and the build fails
    with uv's "... does not appear to be a Python project", which says nothing of the cause."""
    root = Path(install.package).parent
    if (root / "pyproject.toml").is_file() or (root / "setup.py").is_file():
        return None
    return (
        f"the Coral at {install.package} is not an editable install, and Coral builds a packaged grader's venv "
        f"by installing itself from the folder holding its package (`uv pip install -e {root}`), which is no "
        "Python project (no pyproject.toml or setup.py). Fix: install Coral from a clone with `pip install -e "
        "<clone>` (scripts/install_coral.sh does this), or set coral.python to the interpreter of such a Coral"
    )


def _build_with_coral(spec: TaskSpec, install: CoralInstall, venv: Path, uv: str, fh: TextIO) -> None:
    arg = {
        "coral_dir": str(venv.parent.parent),
        "entrypoint": spec.entrypoint,
        "setup": list(spec.setup),
        "task_dir": str(spec.task_dir),
    }
    env = _env(uv)
    try:
        proc = subprocess.run(
            [install.python, "-c", _CORAL_BUILD, json.dumps(arg)],
            stdout=subprocess.PIPE,
            stderr=fh,
            text=True,
            env=env,
            timeout=SETUP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise _SetupFailed(f"Coral's setup_grader_env took longer than {SETUP_TIMEOUT_S} s") from None
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        out = {"error": f"Coral's setup_grader_env exited {proc.returncode} with no answer"}
    if proc.returncode or not out.get("ok"):
        raise _SetupFailed(out.get("error") or f"exit {proc.returncode}")


def _note(log: StrPath | None, text: str) -> None:
    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(text)


def _copy_log(src: Path, log: StrPath | None) -> None:
    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(src.read_text(encoding="utf-8", errors="replace"))


def check_entrypoint(spec: TaskSpec, venv: GraderVenv) -> None:
    """The entrypoint imports in the venv and names a TaskGrader subclass, or one InputError line."""
    try:
        proc = subprocess.run(
            [str(venv.python), "-c", _CHECK, spec.entrypoint],
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/tmp")},
        )
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        out = {"error": f"the grader venv's Python does not run ({exc})"}
    if not out.get("ok"):
        raise InputError(f"{spec.task_dir}: grader.entrypoint {spec.entrypoint!r} {out.get('error')}")


def preflight(spec: TaskSpec, install: CoralInstall | None, log: StrPath | None = None) -> GraderVenv | None:
    """Build (or find) and check a packaged task's grader venv; None for an eval/grader.py task."""
    if spec.kind != "coral" or not spec.entrypoint:
        return None
    venv = ensure(spec, install, log)
    check_entrypoint(spec, venv)
    return venv
