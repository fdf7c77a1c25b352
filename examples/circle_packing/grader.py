"""Grade a circle packing: `python3 grader.py CODE_DIR`.

Runs CODE_DIR/solution.py's `pack()` in a sandboxed child process (sftree.runtime.gradebox: no network, only the code
folder visible, time, memory and process limits) and reads back only its return value; checks 26 circles inside the unit square without overlap and
prints {"score": sum of radii | null, "feedback": "..."} as JSON on the last stdout line. It never fails:
code that raises, hangs or returns garbage gives score null with the reason, and the exit status is 0.
"""

import json
import math
import sys
from pathlib import Path

from sftree.runtime.gradebox import run_solution

N = 26
TOL = 1e-9  # numerical slack for touching circles and walls
TIME_LIMIT = 60  # seconds for the solution itself


class Invalid(Exception):
    pass


def check(circles):
    """Return the sum of radii of a valid packing, or raise Invalid naming the first problem."""
    try:
        circles = [tuple(float(v) for v in c) for c in circles]
    except (TypeError, ValueError) as exc:
        raise Invalid(f"pack() must return (x, y, r) number triples: {exc}") from None
    if len(circles) != N:
        raise Invalid(f"expected {N} circles, got {len(circles)}")
    for i, c in enumerate(circles):
        if len(c) != 3 or not all(math.isfinite(v) for v in c):
            raise Invalid(f"circle {i} is not three finite numbers: {c}")
        x, y, r = c
        if r <= 0:
            raise Invalid(f"circle {i} has radius {r:.6g} (must be > 0)")
        if x - r < -TOL or y - r < -TOL or x + r > 1 + TOL or y + r > 1 + TOL:
            raise Invalid(f"circle {i} at ({x:.4f}, {y:.4f}) r={r:.4f} is outside the unit square")
    for i in range(N):
        for j in range(i + 1, N):
            (xi, yi, ri), (xj, yj, rj) = circles[i], circles[j]
            d = math.hypot(xi - xj, yi - yj)
            if d < ri + rj - TOL:
                raise Invalid(f"circles {i} and {j} overlap by {ri + rj - d:.3g}")
    return sum(c[2] for c in circles)


def grade(code_dir):
    if not (Path(code_dir) / "solution.py").is_file():
        return {"score": None, "feedback": f"invalid packing: no solution.py in {code_dir}"}
    # pack() runs in its own sandboxed process; only its return value comes back, and the score is
    # computed here from it, so nothing the solution prints or does can set the score (docs/security.md).
    run = run_solution(code_dir, "pack", calls=[()], timeout=TIME_LIMIT)
    if not run.ok:
        return {"score": None, "feedback": f"solution failed:\n{run.error}"}
    try:
        circles = run.values[0]
        score = check(circles)
    except Invalid as exc:
        return {"score": None, "feedback": f"invalid packing: {exc}"}
    radii = sorted(float(c[2]) for c in circles)
    return {
        "score": score,
        "feedback": f"valid packing of {N} circles, sum of radii {score:.6f} "
        f"(smallest radius {radii[0]:.4f}, largest {radii[-1]:.4f})",
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        result = {"score": None, "feedback": "usage: grader.py CODE_DIR"}
    else:
        result = grade(sys.argv[1])
    print(json.dumps(result), flush=True)
    sys.exit(0)
