"""The example tasks' real graders: valid and invalid packings and tours, robustness, the starting code."""

import json
import math
import random
import subprocess
import sys
import textwrap

import pytest
from helpers_examples import EXAMPLES


def grade(task, tmp_path, source=None):
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    if source is None:
        code = EXAMPLES / task / "code"
    else:
        (code / "solution.py").write_text(textwrap.dedent(source))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / task / "grader.py"), str(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc, (json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None)


GRID = """
def pack():
    circles = [(0.1 + 0.2 * i, 0.1 + 0.2 * j, 0.1) for i in range(5) for j in range(5)]
    return circles + [(0.2, 0.2, {extra})]
"""


def test_circle_valid_packing_scores_sum_of_radii(tmp_path):
    # 25 circles of radius 0.1 in a 5x5 grid + one of 0.04 in a gap (gap fits 0.1*sqrt(2) - 0.1 = 0.0414)
    proc, result = grade(
        "circle_packing", tmp_path, "print('noise without newline', end='')\n" + GRID.format(extra=0.04)
    )
    assert proc.returncode == 0
    assert result["score"] == pytest.approx(2.54, abs=1e-12) and "valid packing" in result["feedback"]


@pytest.mark.parametrize(
    "source, words",
    [
        (GRID.format(extra=0.05), "overlap"),  # the gap circle is too big
        (
            "def pack():\n    return [(0.05, 0.5, 0.1)] + [(0.5, 0.5, 0.01)] * 0 + [(0.1 + 0.03 * i, 0.9, 0.01) for i in range(25)]\n",
            "outside the unit square",
        ),
        ("def pack():\n    return [(0.5, 0.5, 0.01)] * 25\n", "expected 26 circles"),
        ("def pack():\n    return [(0.1, 0.1, 0.0)] * 26\n", "must be > 0"),
        ("def pack():\n    raise ValueError('boom')\n", "ValueError: boom"),
        ("def pack(:\n", "SyntaxError"),
        ("import sys\nsys.exit(3)\n", "SystemExit"),
        ("X = 1\n", "AttributeError"),
    ],
)
def test_circle_invalid_gives_null_and_exit_zero(tmp_path, source, words):
    proc, result = grade("circle_packing", tmp_path, source)
    assert proc.returncode == 0 and result["score"] is None and words in result["feedback"], result


def instance(seed, n):
    rng = random.Random(seed)
    return [(rng.uniform(0, 100), rng.uniform(0, 100)) for _ in range(n)]


def test_tsp_identity_tour_scores_mean_length(tmp_path):
    proc, result = grade("tsp", tmp_path, "def solve(points):\n    return list(range(len(points)))\n")
    sizes = [(1001, 60), (1002, 60), (1003, 80), (1004, 80), (1005, 100)]
    lengths = []
    for seed, n in sizes:
        pts = instance(seed, n)
        lengths.append(sum(math.dist(pts[i - 1], pts[i]) for i in range(n)))
    assert proc.returncode == 0 and result["score"] == pytest.approx(sum(lengths) / 5, rel=1e-12)


@pytest.mark.parametrize(
    "source, words",
    [
        ("def solve(points):\n    return [0] + list(range(len(points) - 1))\n", "not a permutation"),
        ("def solve(points):\n    return None\n", "list of city indices"),
        ("def solve(points):\n    return list(range(len(points)))[::-1][:-1]\n", "missing [0]"),
        ("def solve(points):\n    return 1 / 0\n", "ZeroDivisionError"),
    ],
)
def test_tsp_invalid_gives_null_and_exit_zero(tmp_path, source, words):
    proc, result = grade("tsp", tmp_path, source)
    assert proc.returncode == 0 and result["score"] is None and words in result["feedback"], result


def test_starting_code_scores_and_constants_matter(tmp_path):
    _, cp = grade("circle_packing", tmp_path)
    _, tsp = grade("tsp", tmp_path)
    # Pinned values of the shipped starting code (regression check: the simulated run and docs rely on them).
    assert cp["score"] == pytest.approx(1.368, abs=1e-9)
    assert tsp["score"] == pytest.approx(895.4874048225067, rel=1e-12)
    # Moving one constant into its documented range really changes the score.
    src = (
        (EXAMPLES / "tsp" / "code" / "solution.py")
        .read_text()
        .replace("TWO_OPT_ROUNDS = 0", "TWO_OPT_ROUNDS = 5")
    )
    _, better = grade("tsp", tmp_path, src)
    assert better["score"] < tsp["score"] - 20
