"""Find the user's Coral: the interpreter that imports `coral`, its version and where its package lies.

Config (`coral:` in config.yaml):

    coral:
      mode: auto        # auto: Coral's own texts when a Coral is found, else sftree's stand-ins | coral: required | stand-in
      python: null      # the interpreter that imports coral; null: sftree's own if it imports coral, else the
                        # `coral` executable on PATH (its shebang's interpreter)

`locate(cfg)` -> `CoralInstall | None` (None: mode stand-in, or auto and none found). A configured `python` that
does not work, or `mode: coral` without a Coral, is an InputError that says what was tried.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sftree.errors import InputError
from sftree.jsontypes import CoralDoc
from sftree.settings import CoralSettings

MODES = ("auto", "coral", "stand-in")
_PROBE = (
    "import json, sys, os, coral, coral.config\n"
    "p = os.path.dirname(os.path.abspath(coral.__file__))\n"
    "print(json.dumps({'version': getattr(coral, '__version__', '?'), 'package': p,"
    " 'prefix': sys.prefix, 'base_prefix': sys.base_prefix, 'executable': sys.executable}))\n"
)


@dataclass(frozen=True)
class CoralInstall:
    python: str  # the interpreter (as given or found; run with `python -I`, the package's parent on sys.path)
    version: str
    package: str  # .../coral (the package folder)
    roots: tuple[str, ...]  # folders the interpreter and the package need, for a sandbox's read-only binds
    found_by: str  # "config" | "sftree" | "PATH"

    @property
    def root(self) -> str:
        """The folder holding the `coral` package (put on sys.path)."""
        return str(Path(self.package).parent)

    def to_dict(self) -> CoralDoc:
        return {
            "python": self.python,
            "version": self.version,
            "package": self.package,
            "found_by": self.found_by,
        }


def _probe(python: str) -> tuple[CoralDoc | None, str]:
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=60, env=_probe_env()
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if proc.returncode != 0:
        return None, (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return None, f"unreadable answer {proc.stdout[-200:]!r}"


def _probe_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME",)}


def _install(python: str, info: CoralDoc, found_by: str) -> CoralInstall:
    # Its folder resolved, the file itself not (a venv's bin/python links out of the venv): a sandbox shows the
    # resolved roots only, where a path through a linked folder (a venv reached by a symlink) does not exist.
    python = str(Path(python).parent.resolve() / Path(python).name)
    exe = Path(info["executable"]).resolve()
    roots = {str(Path(info["prefix"]).resolve()), str(Path(info["base_prefix"]).resolve())}
    roots.add(str(exe.parent.parent))
    roots.add(str(Path(info["package"]).resolve().parent))
    # A venv's python is often a link into a base installation: both must be visible in a sandbox.
    roots.add(str(Path(python).resolve().parent.parent))
    return CoralInstall(
        python=str(python),
        version=str(info["version"]),
        package=str(Path(info["package"]).resolve()),
        roots=tuple(sorted(roots)),
        found_by=found_by,
    )


def _shebang(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if not parts:
        return None
    if Path(parts[0]).name == "env" and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0]


def locate(cfg: CoralSettings) -> CoralInstall | None:
    mode = cfg.mode
    if mode not in MODES:
        raise InputError(f"coral.mode: {mode!r} is not one of {', '.join(MODES)}")
    if mode == "stand-in":
        return None
    tried = []
    if cfg.python:
        python = str(cfg.python)
        if os.sep in python:
            python = os.path.abspath(python)  # a venv's bin/python: not resolved (that would leave the venv)
        info, why = _probe(python)
        if info is None:
            raise InputError(f"coral.python: {python} cannot import coral ({why})")
        return _install(python, info, "config")
    info, why = _probe(sys.executable)
    if info is not None:
        return _install(sys.executable, info, "sftree")
    tried.append(f"sftree's interpreter {sys.executable} ({why})")
    exe = shutil.which("coral")
    if exe:
        shebang = _shebang(exe)
        if shebang:
            info, why = _probe(shebang)
            if info is not None:
                return _install(shebang, info, "PATH")
            tried.append(f"the interpreter of {exe}, {shebang} ({why})")
        else:
            tried.append(f"{exe} (no interpreter in its first line)")
    else:
        tried.append("no `coral` on PATH")
    if mode == "coral":
        raise InputError("coral.mode is `coral` but no Coral was found: tried " + "; ".join(tried))
    return None
