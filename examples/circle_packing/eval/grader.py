"""Circle packing grader (a Coral TaskGrader): 26 circles in the unit square, score = sum of radii.

The program's `pack()` runs in a child process started with Coral's own helper (`run_script_json`, the grader's
Python): under sftree that child is graded code in a sandbox of its own; under Coral it is Coral's usual child. The
child only calls `pack()` and sends back its return value (the solution's own prints go to stderr); the grader
checks the circles itself and computes the score from them, so nothing the program prints about itself is a
score (docs/security.md).
"""

from __future__ import annotations

import math

from coral.grader import TaskGrader

N = 26
TOL = 1e-9  # numerical slack for touching circles and walls

RUNNER = """
import json, os, sys, traceback
out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
try:
    sys.path.insert(0, {code!r})
    import {module} as m
    value = m.{func}()
    text = json.dumps({{"ok": True, "value": value}}, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
except BaseException:
    text = json.dumps({{"ok": False, "error": "".join(traceback.format_exc().splitlines(True)[-6:])}})
out.write("\\n" + text + "\\n")
out.flush()
os._exit(0)
"""


class Invalid(Exception):
    pass


def check(circles) -> float:
    """The sum of radii of a valid packing, or Invalid naming the first problem."""
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


def run(grader: TaskGrader, script: str) -> dict | str:
    """The runner's result, or why there is none (the program raised, exited, hung or printed no result)."""
    import json
    import subprocess

    try:
        proc = grader.run_script(script, timeout=grader.timeout or 60)
    except subprocess.TimeoutExpired:
        return f"solution took longer than {grader.timeout or 60} s"
    if proc.returncode != 0:
        return f"solution exited with code {proc.returncode} without returning a value\n{proc.stderr.strip()[-2000:]}"
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                res = json.loads(line)
            except ValueError:
                continue
            if isinstance(res, dict) and res.get("ok") is True:
                return res
            if isinstance(res, dict) and res.get("ok") is False:
                return f"solution failed:\n{res.get('error', '')}"
    return f"solution exited without returning a value\n{proc.stderr.strip()[-2000:]}"


class Grader(TaskGrader):
    def evaluate(self):
        program = self.args.get("program_file", "solution.py")
        module = program.removesuffix(".py")
        res = run(self, RUNNER.format(code=self.codebase_path, module=module, func="pack"))
        if isinstance(res, str):
            return self.fail(res)
        try:
            score = check(res.get("value"))
        except Invalid as exc:
            return self.fail(f"invalid packing: {exc}")
        radii = sorted(float(c[2]) for c in res["value"])
        return self.score(
            score,
            f"valid packing of {N} circles, sum of radii {score:.6f} "
            f"(smallest radius {radii[0]:.4f}, largest {radii[-1]:.4f})",
        )
