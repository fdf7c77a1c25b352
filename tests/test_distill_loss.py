"""The distillation recipe's loss (`sftree.dataset.distill_loss`, docs/outputs.md "Teacher tokens") in the trainer
venv (scripts/install_trainer.sh), by torch: equal to its definition computed term by term for alpha 0, 0.5 and 1;
alpha 0 is torch's own cross entropy on the trained positions; KL 0 for a Student equal to the Teacher's top-K;
padded alternatives add nothing; gradient steps give finite gradients and a falling loss."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers.trainer import REPO, probe_env, trainer_python


@pytest.mark.trainer
def test_the_distillation_loss_is_its_definition(tmp_path):
    py = trainer_python()
    r = subprocess.run([str(py), str(REPO / "tests/trainer/distill_probe.py")], capture_output=True, text=True,
                       env=probe_env(tmp_path), timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    for case in got["cases"]:
        assert case["loss"] == pytest.approx(case["by_hand"], rel=1e-5), case
    assert got["alpha0"] == pytest.approx(got["cross_entropy"], rel=1e-6)
    assert abs(got["kl_of_the_teacher_itself"]) < 1e-5
    assert got["padded"] == pytest.approx(got["dropped"], rel=1e-6)
    losses = got["losses"]  # convex in the logits: SGD with a small step never climbs
    assert (
        all(b <= a + 1e-6 for a, b in zip(losses[:-1], losses[1:], strict=True))
        and losses[-1] < losses[0] - 0.5
    )
