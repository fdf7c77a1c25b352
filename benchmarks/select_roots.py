#!/usr/bin/env python3
"""Benchmark `sftree select-roots` against the I/O floor on large synthetic Student runs.

    nice python3 benchmarks/select_roots.py [--sizes 10000,100000] [--keep DIR]

For each size N it builds N snapshot folders in a temporary folder (metadata.json, one attempt record, a tiny
code file; a rising noisy score curve with 5% eval_ok=false and 1% pending), then times, each in a fresh process
with warm page cache:

- floor: read every metadata.json and attempt file once, paths known in advance (bytes, no parsing);
- floor+json: list the folders, parse each metadata.json and the attempt file it names (what any reader must do);
- select-roots: the real command line (`python3 -m sftree select-roots ... --plot`), 30 roots copied.

and prints wall time, peak memory (max RSS of that process), the ratio to the floor and the cost per 1k snapshots.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR = r"""
import json, os, sys
root, mode = sys.argv[1], sys.argv[2]
n = 0
if mode == "bytes":  # the pure I/O floor: every file path known in advance, read once
    with open(os.path.join(root, "..", "files.txt")) as fh:
        for path in fh.read().splitlines():
            with open(path, "rb") as f:
                f.read()
            n += 1
else:  # what any reader must do: list the folders, parse metadata.json, open and parse the attempt it names
    for name in sorted(os.listdir(root)):
        if name.startswith("eval-"):
            d = os.path.join(root, name)
            with open(os.path.join(d, "metadata.json"), "rb") as fh:
                commit = json.loads(fh.read())["commit_hash"]
            with open(os.path.join(d, "shared", "attempts", commit + ".json"), "rb") as fh:
                json.loads(fh.read())
            n += 2
print(n)
"""


def build(root: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    t0 = time.monotonic()
    files = []
    for i in range(1, n + 1):
        commit = f"{rng.getrandbits(160):040x}"
        agent = f"agent-{rng.randint(1, 4)}"
        d = root / f"eval-{i:07d}-{agent}-{commit[:12]}"
        (d / "shared" / "attempts").mkdir(parents=True)
        (d / "code").mkdir()
        (d / "code" / "solution.py").write_text(f"X = {i}\n")
        pending = rng.random() < 0.01
        ok = rng.random() >= 0.05
        score = (1 - 1 / (1 + 8 * i / n)) + rng.gauss(0, 0.03) if ok else None
        meta = {
            "eval_count": i // 4 + 1,
            "agent_id": agent,
            "commit_hash": commit,
            "shared_state_hash": commit[::-1],
            "exported_shared_content_hash": commit,
            "task": "bench",
        }
        if not pending:
            meta["eval_ok"] = ok
        (d / "metadata.json").write_text(json.dumps(meta))
        attempt = {
            "commit_hash": commit,
            "agent_id": agent,
            "title": f"attempt {i}",
            "score": score,
            "status": "pending" if pending else ("improved" if ok else "crashed"),
            "parent_hash": None,
            "timestamp": "2026-01-01T00:00:00Z",
            "feedback": "synthetic",
        }
        (d / "shared" / "attempts" / f"{commit}.json").write_text(json.dumps(attempt))
        files += [str(d / "metadata.json"), str(d / "shared" / "attempts" / f"{commit}.json")]
        if i % 20000 == 0:
            print(
                f"  built {i}/{n} folders ({i / (time.monotonic() - t0):.0f}/s)", file=sys.stderr, flush=True
            )
    (root.parent / "files.txt").write_text("\n".join(files) + "\n")


def measure(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of one command in its own process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    out, err = proc.stdout.read(), proc.stderr.read()
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
    return wall, usage.ru_maxrss / 1024, out


def bench(n: int, keep: Path | None) -> dict:
    base = Path(tempfile.mkdtemp(prefix=f"sftree-bench-{n}-", dir=keep))
    try:
        snaps = base / "bench"
        snaps.mkdir()
        t0 = time.monotonic()
        build(snaps, n)
        build_s = time.monotonic() - t0
        floor_cmd = [sys.executable, "-c", FLOOR, str(snaps)]
        measure(floor_cmd + ["json"])  # warm the page cache
        select_cmd = [
            sys.executable,
            "-m",
            "sftree",
            "select-roots",
            "--snapshots",
            str(snaps),
            "--out",
            str(base / "out" / "roots"),
            "--table",
            str(base / "out" / "stages.tsv"),
            "--plot",
            str(base / "out" / "stages.svg"),
            "--direction",
            "maximize",
        ]
        floors, parsed, selects = [], [], []
        for _ in range(2):  # interleaved, best of two: other work on the machine hits both alike
            floors.append(measure(floor_cmd + ["bytes"])[:2])
            parsed.append(measure(floor_cmd + ["json"])[:2])
            selects.append(measure(select_cmd)[:2])
            shutil.rmtree(base / "out")
        floor, floor_json, select = min(floors), min(parsed), min(selects)
        return {"n": n, "build_s": build_s, "floor": floor, "floor_json": floor_json, "select": select}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument(
        "--keep", type=Path, help="build the synthetic runs under this folder (default: $TMPDIR)"
    )
    args = parser.parse_args()
    rows = [bench(int(s), args.keep) for s in args.sizes.split(",")]
    print()
    print(
        f"{'N':>8} | {'floor s':>8} | {'floor+json s':>12} | {'select-roots s':>14} | {'ratio':>5} | "
        f"{'ratio json':>10} | {'ms / 1k':>8} | {'peak MiB':>8} | {'floor MiB':>9}"
    )
    print("-" * 104)
    for r in rows:
        (fs, fm), (js, _), (ss, sm) = r["floor"], r["floor_json"], r["select"]
        print(
            f"{r['n']:>8} | {fs:>8.2f} | {js:>12.2f} | {ss:>14.2f} | {ss / fs:>5.2f} | {ss / js:>10.2f} | "
            f"{1000 * ss / (r['n'] / 1000):>8.1f} | {sm:>8.1f} | {fm:>9.1f}"
        )
    print(
        "\nfloor: read every metadata.json and attempt file once (paths known, bytes only); floor+json: list the"
        "\nfolders and parse metadata.json + the attempt it names;"
        "\nselect-roots: the full command (read, stages, table, plot, copy 30 roots); best of 2 runs each;"
        "\nratio: select-roots / floor (the goal is at most 2), ratio json: select-roots / floor+json."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
