"""Grade a TSP heuristic: `python3 grader.py CODE_DIR`.

Imports CODE_DIR/solution.py, calls `solve(points)` on fixed seeded instances (uniform points in a 100 x 100
square), checks each result is a permutation of the cities and prints {"score": mean closed-tour length | null,
"feedback": "..."} as JSON on the last stdout line (lower is better). It never fails: code that raises, hangs or
returns an invalid tour gives score null with the reason, and the exit status is 0.
"""

import contextlib
import importlib.util
import json
import math
import random
import signal
import sys
import traceback
from pathlib import Path

INSTANCES = [(1001, 60), (1002, 60), (1003, 80), (1004, 80), (1005, 100)]  # (seed, cities): fixed forever
TIME_LIMIT = 60  # seconds for the solution on all instances


class Invalid(Exception):
    pass


def instance(seed, n):
    rng = random.Random(seed)
    return [(rng.uniform(0, 100), rng.uniform(0, 100)) for _ in range(n)]


def load_solution(code_dir):
    path = Path(code_dir) / "solution.py"
    if not path.is_file():
        raise Invalid(f"no solution.py in {code_dir}")
    spec = importlib.util.spec_from_file_location("solution", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(Path(code_dir).resolve()))
    spec.loader.exec_module(module)
    return module


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


def _timeout(signum, frame):
    raise TimeoutError(f"solution took longer than {TIME_LIMIT} s")


def grade(code_dir):
    lengths = []
    try:
        signal.signal(signal.SIGALRM, _timeout)
        signal.alarm(TIME_LIMIT)
        # The solution's own prints go to stderr so the JSON stays the last stdout line.
        with contextlib.redirect_stdout(sys.stderr):
            module = load_solution(code_dir)
            for seed, n in INSTANCES:
                points = instance(seed, n)
                tour = module.solve([tuple(p) for p in points])
                lengths.append(tour_length(points, tour, f"instance seed={seed} n={n}"))
        signal.alarm(0)
    except Invalid as exc:
        return {"score": None, "feedback": f"invalid tour: {exc}"}
    except BaseException:  # noqa: BLE001 - any failure of the graded code is a null score, not a crash
        tail = "".join(traceback.format_exc().splitlines(keepends=True)[-8:])
        return {"score": None, "feedback": f"solution failed:\n{tail}"}
    finally:
        signal.alarm(0)
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
