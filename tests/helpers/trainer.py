"""The trainer venv (scripts/install_trainer.sh: torch's CPU build, transformers, TRL) as the tests run it: its
Python, or a skip naming the install script, and the environment a probe script runs under there."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).parents[2]


def trainer_python() -> Path:
    cache = Path(os.environ.get("SFTREE_CACHE") or os.path.expanduser("~/.cache/sftree")) / "trainer"
    py = cache / "venv" / "bin" / "python"
    if not (cache / ".installed").is_file() or not py.is_file():
        pytest.skip(f"trainer venv absent ({cache}): run scripts/install_trainer.sh (torch CPU build, TRL)")
    return py


def probe_env(tmp_path: Path) -> dict[str, str]:
    """Offline, CPU, two threads; `src` on the path for the standard-library and torch-only modules."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "2",
        "PYTHONPATH": str(REPO / "src"),  # trainer_labels: standard library only; tree_collator: torch only
        # FlexAttention's kernel compiled into the test's own folder (cold, as on a fresh clone)
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }


def run_probe(
    py: Path, script: Path, cfg: dict[str, Any], tmp_path: Path, timeout: float = 600
) -> tuple[Any, str]:
    """`script` run in the trainer venv on `cfg` (`script CFG OUT`, under `probe_env`): (its JSON answer, its
    stderr, where the probes print their timings)."""
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    out = tmp_path / "out.json"
    res = subprocess.run(
        [str(py), str(script), str(tmp_path / "cfg.json"), str(out)],
        env=probe_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(out.read_text()), res.stderr
