"""The example tasks (Coral task folders) graded by their own TaskGraders through sftree.world.grading: valid and
invalid packings and tours, robustness, the starting code; with sftree's stand-in Coral, and with the real Coral
where it is installed (the same results)."""

import math
import random
import textwrap
from pathlib import Path

import pytest
from helpers.coral import coral_python, coral_settings, grading_worlds, install_for
from helpers.examples import EXAMPLES

from sftree.runtime.sandbox import bwrap_works
from sftree.world.grading import grade as world_grade
from sftree.world.task import load_coral_task

SANDBOX = "bwrap" if bwrap_works() else "none"


@pytest.fixture(params=grading_worlds())
def install(request):
    return install_for(request.param)


def grade(task, tmp_path, source=None, install=None):
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    if source is None:
        code = EXAMPLES / task / "seed"
    else:
        (code / "solution.py").write_text(textwrap.dedent(source))
    spec = load_coral_task(EXAMPLES / task, task)
    r = world_grade(spec, code, commit="e" * 40, install=install, sandbox=SANDBOX)
    return r, {"score": r.score, "feedback": r.feedback}


GRID = """
def pack():
    circles = [(0.1 + 0.2 * i, 0.1 + 0.2 * j, 0.1) for i in range(5) for j in range(5)]
    return circles + [(0.2, 0.2, {extra})]
"""


def test_circle_valid_packing_scores_sum_of_radii(tmp_path, install):
    # 25 circles of radius 0.1 in a 5x5 grid + one of 0.04 in a gap (gap fits 0.1*sqrt(2) - 0.1 = 0.0414)
    r, result = grade(
        "circle_packing",
        tmp_path,
        "print('noise without newline', end='')\n" + GRID.format(extra=0.04),
        install,
    )
    assert r.status == "scored" and r.runs == 1
    assert result["score"] == pytest.approx(2.54, abs=1e-12) and "valid packing" in result["feedback"]


def test_printed_numbers_are_no_score(tmp_path, install):
    """A program that prints a score line or a fake result gets the score of what pack() returns, checked."""
    src = (
        "import json\nprint(json.dumps({'ok': True, 'value': [[0.5, 0.5, 0.5]] * 26}))\n"
        "print('{\"score\": 99}')\n" + GRID.format(extra=0.04)
    )
    _, result = grade("circle_packing", tmp_path, src, install)
    assert result["score"] == pytest.approx(2.54, abs=1e-12)


@pytest.mark.parametrize(
    "source, words",
    [
        (GRID.format(extra=0.05), "overlap"),  # the gap circle is too big
        (
            "def pack():\n    return [(0.05, 0.5, 0.1)] + [(0.1 + 0.03 * i, 0.9, 0.01) for i in range(25)]\n",
            "outside the unit square",
        ),
        ("def pack():\n    return [(0.5, 0.5, 0.01)] * 25\n", "expected 26 circles"),
        ("def pack():\n    return [(0.1, 0.1, 0.0)] * 26\n", "must be > 0"),
        ("def pack():\n    raise ValueError('boom')\n", "ValueError: boom"),
        ("def pack(:\n", "SyntaxError"),
        ("import sys\nsys.exit(3)\n", "SystemExit"),
        ("X = 1\n", "AttributeError"),
        ("import os\nos._exit(3)\n", "exited with code 3"),
    ],
)
def test_circle_invalid_gives_null(tmp_path, source, words, install):
    r, result = grade("circle_packing", tmp_path, source, install)
    assert r.status == "crashed" and result["score"] is None and words in result["feedback"], result


def instance(seed, n):
    rng = random.Random(seed)
    return [(rng.uniform(0, 100), rng.uniform(0, 100)) for _ in range(n)]


def test_tsp_identity_tour_scores_mean_length(tmp_path, install):
    _, result = grade("tsp", tmp_path, "def solve(points):\n    return list(range(len(points)))\n", install)
    sizes = [(1001, 60), (1002, 60), (1003, 80), (1004, 80), (1005, 100)]
    lengths = []
    for seed, n in sizes:
        pts = instance(seed, n)
        lengths.append(sum(math.dist(pts[i - 1], pts[i]) for i in range(n)))
    assert result["score"] == pytest.approx(sum(lengths) / 5, rel=1e-12)


@pytest.mark.parametrize(
    "source, words",
    [
        ("def solve(points):\n    return [0] + list(range(len(points) - 1))\n", "not a permutation"),
        ("def solve(points):\n    return None\n", "list of city indices"),
        ("def solve(points):\n    return list(range(len(points)))[::-1][:-1]\n", "missing [0]"),
        ("def solve(points):\n    return 1 / 0\n", "ZeroDivisionError"),
    ],
)
def test_tsp_invalid_gives_null(tmp_path, source, words, install):
    _, result = grade("tsp", tmp_path, source, install)
    assert result["score"] is None and words in result["feedback"], result


def test_starting_code_scores_and_constants_matter(tmp_path, install):
    _, cp = grade("circle_packing", tmp_path, None, install)
    _, tsp = grade("tsp", tmp_path, None, install)
    # Pinned values of the shipped starting code (regression check: the simulated run and docs rely on them).
    assert cp["score"] == pytest.approx(1.368, abs=1e-9)
    assert tsp["score"] == pytest.approx(895.4874048225067, rel=1e-12)
    # Moving one constant into its documented range really changes the score.
    src = (
        (EXAMPLES / "tsp" / "seed" / "solution.py")
        .read_text()
        .replace("TWO_OPT_ROUNDS = 0", "TWO_OPT_ROUNDS = 5")
    )
    _, better = grade("tsp", tmp_path, src, install)
    assert better["score"] < tsp["score"] - 20


@pytest.mark.coral
@pytest.mark.skipif(not coral_python() or SANDBOX != "bwrap", reason="needs the real Coral and bubblewrap")
def test_coral_python_through_a_linked_folder_grades(tmp_path):
    """`coral.python` given through a linked folder (a venv reached by a symlink, as a worktree's .venv-coral):
    the sandbox shows the resolved folders only, so the interpreter it runs must be named by its resolved folder."""
    from sftree.world.locate import locate

    link = tmp_path / "linked-venv"
    link.symlink_to(Path(coral_python()).parent.resolve().parent)
    inst = locate(coral_settings(python=str(link / "bin" / "python")))
    spec = load_coral_task(EXAMPLES / "circle_packing", "circle_packing")
    r = world_grade(
        spec, EXAMPLES / "circle_packing" / "seed", commit="e" * 40, install=inst, sandbox=SANDBOX
    )
    assert r.status == "scored", r.feedback
