"""TSP grader (a Coral TaskGrader): mean closed-tour length of `solve(points)` on fixed seeded instances (lower is
better). `solve` runs in a child process started with Coral's own helper (`run_script_json`; under sftree a
sandbox of its own) that only sends back the tours; the grader checks each is a permutation of the cities and
measures it itself, so nothing the program prints about itself is a score (docs/security.md).
"""

from __future__ import annotations

import math
import random

from coral.grader import TaskGrader

INSTANCES = [(1001, 60), (1002, 60), (1003, 80), (1004, 80), (1005, 100)]  # (seed, cities): fixed forever

RUNNER = """
import json, os, sys, traceback
out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
try:
    sys.path.insert(0, {code!r})
    import {module} as m
    value = [m.solve(pts) for pts in {instances!r}]
    text = json.dumps({{"ok": True, "value": value}}, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
except BaseException:
    text = json.dumps({{"ok": False, "error": "".join(traceback.format_exc().splitlines(True)[-6:])}})
out.write("\\n" + text + "\\n")
out.flush()
os._exit(0)
"""


class Invalid(Exception):
    pass


def instance(seed: int, n: int) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    return [(rng.uniform(0, 100), rng.uniform(0, 100)) for _ in range(n)]


def tour_length(points, tour, name: str) -> float:
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
        instances = [instance(seed, n) for seed, n in INSTANCES]
        script = RUNNER.format(
            code=self.codebase_path, module=program.removesuffix(".py"), instances=instances
        )
        res = run(self, script)
        if isinstance(res, str):
            return self.fail(res)
        tours = res.get("value")
        if not isinstance(tours, list) or len(tours) != len(INSTANCES):
            return self.fail(f"invalid tour: expected {len(INSTANCES)} results, got {type(tours).__name__}")
        try:
            lengths = [
                tour_length(points, tour, f"instance seed={seed} n={n}")
                for (seed, n), points, tour in zip(INSTANCES, instances, tours, strict=True)
            ]
        except Invalid as exc:
            return self.fail(f"invalid tour: {exc}")
        score = sum(lengths) / len(lengths)
        per = ", ".join(f"{n}:{length:.1f}" for (_, n), length in zip(INSTANCES, lengths, strict=True))
        return self.score(
            score, f"mean tour length {score:.3f} over {len(lengths)} instances (cities:length {per})"
        )
