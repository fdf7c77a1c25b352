"""Grade a TSP heuristic: `python3 grader.py CODE_DIR`.

Runs CODE_DIR/solution.py's `solve(points)` in a sandboxed child process (sftree.runtime.gradebox: no network, only
the code folder visible, time, memory and process limits), reading back only its return values, on fixed
seeded instances (uniform points in a 100 x 100 square), checks each result is a permutation of the cities and prints {"score": mean closed-tour length | null,
"feedback": "..."} as JSON on the last stdout line (lower is better). It never fails: code that raises, hangs or
returns an invalid tour gives score null with the reason, and the exit status is 0.
"""

import json
import math
import random
import sys
from pathlib import Path

from sftree.runtime.gradebox import run_solution

INSTANCES = [(1001, 60), (1002, 60), (1003, 80), (1004, 80), (1005, 100)]  # (seed, cities): fixed forever
TIME_LIMIT = 60  # seconds for the solution on all instances


class Invalid(Exception):
    pass


def instance(seed, n):
    rng = random.Random(seed)
    return [(rng.uniform(0, 100), rng.uniform(0, 100)) for _ in range(n)]


def tour_length(points, tour, name):
    """Closed-tour length, or Invalid when `tour` is not a permutation of the cities."""
    n = len(points)
    try:
        tour = [int(c) for c in tour]
    except (TypeError, ValueError) as exc:
        raise Invalid(f"{name}: solve() must return a list of city indices: {exc}") from None
    if sorted(tour) != list(range(n)):
        missing = sorted(set(range(n)) - set(tour))[:5]
        raise Invalid(
            f"{name}: tour of {len(tour)} entries is not a permutation of {n} cities (missing {missing})"
        )
    return sum(math.dist(points[tour[i - 1]], points[tour[i]]) for i in range(n))


def grade(code_dir):
    if not (Path(code_dir) / "solution.py").is_file():
        return {"score": None, "feedback": f"invalid tour: no solution.py in {code_dir}"}
    # solve() runs in its own sandboxed process; only its return values come back, and the score is
    # computed here from them, so nothing the solution prints or does can set the score (docs/security.md).
    instances = [instance(seed, n) for seed, n in INSTANCES]
    run = run_solution(code_dir, "solve", calls=[(pts,) for pts in instances], timeout=TIME_LIMIT)
    if not run.ok:
        return {"score": None, "feedback": f"solution failed:\n{run.error}"}
    try:
        lengths = [
            tour_length(points, tour, f"instance seed={seed} n={n}")
            for (seed, n), points, tour in zip(INSTANCES, instances, run.values, strict=True)
        ]
    except Invalid as exc:
        return {"score": None, "feedback": f"invalid tour: {exc}"}
    score = sum(lengths) / len(lengths)
    per = ", ".join(f"{n}:{length:.1f}" for (_, n), length in zip(INSTANCES, lengths, strict=True))
    return {
        "score": score,
        "feedback": f"mean tour length {score:.3f} over {len(lengths)} instances (cities:length {per})",
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        result = {"score": None, "feedback": "usage: grader.py CODE_DIR"}
    else:
        result = grade(sys.argv[1])
    print(json.dumps(result), flush=True)
    sys.exit(0)
