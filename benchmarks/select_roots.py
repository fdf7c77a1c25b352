#!/usr/bin/env python3
"""Benchmark `sftree select-roots` against the I/O floor on large synthetic Student runs, warm and cold.

    nice python3 benchmarks/select_roots.py [--full 1000,2000] [--sizes 2000,10000,100000] [--reps 2] [--links symlink,hardlink]
                                          [--data /var/tmp/sftree-bench]

Layouts. A real Coral snapshot (and scripts/make_example_snapshots.py) holds every attempt file written so far:
snapshot i has i files in shared/attempts/, N(N+1)/2 in all.

- `full` (sizes from --full): exactly that. 5e9 directory entries at N = 100k do not fit any disk, so it is built
  only where it fits (each attempt file written once, linked into every later snapshot: same bytes, same reads).
- `roots` (sizes from --sizes): every snapshot holds its own attempt file, and each root that select-roots chooses
  holds every attempt so far (found by a first run of the command, then filled in). These are all the files the
  command reads or copies in the full layout; the folders it neither reads nor copies are smaller. Both layouts
  at the same N (2000 by default) show how much that changes.

Each snapshot: metadata.json, its attempt records, a tiny code file; a rising noisy score curve with 5%
eval_ok=false and 1% pending. Timed, each in a fresh process, interleaved, best of --reps:

- floor: read every metadata.json and the snapshot's own attempt file once, paths known in advance, the way the
  product reads (os.open + os.read + os.close, no parsing);
- floor+json: list the folders, parse each metadata.json and the attempt file it names;
- select-roots: the real command line (`python3 -m sftree select-roots ... --plot`), 30 roots, once per --links
  mode: symlink (the default: each root's top-level entries linked to the snapshot) and hardlink (a
  self-contained root, each file hard-linked).

Data: --data DIR builds each run once under DIR and keeps it (a later invocation with the same DIR reuses it,
so the 100k run, 1.29M root files, is built once); the roots each command writes are moved aside and removed by
a detached, niced `rm -rf` after the table is printed. Each size's rows are printed as soon as it is measured.

Warm: the data was just read. Cold: before the run `echo 3 > /proc/sys/vm/drop_caches` (page cache, dentries
and inodes; where it may be written, which the benchmark prints) and every file of the run evicted with
posix_fadvise(DONTNEED) (needs no privilege; directory entries and inodes stay cached then). A virtual disk may
still be cached by its host. Peak memory is the child's own: the child reports /proc/self/status VmHWM itself
on exit (the high-water mark of its own memory map). Its ru_maxrss, from wait4 or from getrusage(RUSAGE_SELF)
inside it, is no good: Linux carries the maximum across exec, so a child forked from a large parent reports the
parent's size.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs the timed work inside the child, then reports the child's own peak memory on stderr.
WRAPPER = r"""
import os, resource, runpy, sys
def peak():
    hwm = 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    sys.stderr.write(f"\nPEAK ru_maxrss_kib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} vmhwm_kib={hwm}\n")
kind = sys.argv[1]
sys.argv = sys.argv[2:]
try:
    if kind == "module":
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        exec(compile(open(sys.argv[0]).read(), sys.argv[0], "exec"), {"__name__": "__main__"})
except SystemExit as exc:
    peak()
    raise
peak()
"""

FLOOR = r"""
import json, os, sys
root, mode = sys.argv[1], sys.argv[2]
n = 0
if mode == "bytes":  # the pure I/O floor: every file path known in advance, read once as the product reads
    with open(os.path.join(root, "..", "files.txt")) as fh:
        paths = fh.read().splitlines()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.read(fd, 65536)
        finally:
            os.close(fd)
        n += 1
else:  # what any reader must do: list the folders, parse metadata.json, open and parse the attempt it names
    for name in sorted(os.listdir(root)):
        if name.startswith("eval-"):
            d = os.path.join(root, name)
            fd = os.open(os.path.join(d, "metadata.json"), os.O_RDONLY)
            commit = json.loads(os.read(fd, 65536))["commit_hash"]
            os.close(fd)
            fd = os.open(os.path.join(d, "shared", "attempts", commit + ".json"), os.O_RDONLY)
            json.loads(os.read(fd, 65536))
            os.close(fd)
            n += 2
print(n)
"""


def build(root: Path, n: int, full: bool, seed: int = 0) -> list[Path]:
    """N snapshot folders; returns each snapshot's own attempt file (index i-1 = snapshot i)."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    files, own, dirs = [], [], []
    for i in range(1, n + 1):
        commit = f"{rng.getrandbits(160):040x}"
        agent = f"agent-{rng.randint(1, 4)}"
        d = root / f"eval-{i:07d}-{agent}-{commit[:12]}"
        attempts = d / "shared" / "attempts"
        attempts.mkdir(parents=True)
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
        mine = attempts / f"{commit}.json"
        mine.write_text(json.dumps(attempt))
        if full:  # every earlier attempt as it stood: the same file, linked
            for p in own:
                os.link(p, attempts / p.name)
        own.append(mine)
        dirs.append(d)
        files += [str(d / "metadata.json"), str(mine)]
        if i % 20000 == 0 or (full and i % 500 == 0):
            print(
                f"  built {i}/{n} folders ({i / (time.monotonic() - t0):.0f}/s)", file=sys.stderr, flush=True
            )
    (root.parent / "files.txt").write_text("\n".join(files) + "\n")
    return own


def fill_roots(snaps: Path, chosen: list[str], own: list[Path]) -> int:
    """Give each chosen root every attempt so far (the full layout's roots); returns the files added."""
    added = 0
    for name in chosen:
        i = int(name.split("-")[1])
        attempts = snaps / name / "shared" / "attempts"
        for p in own[: i - 1]:
            os.link(p, attempts / p.name)
        added += i - 1
    return added


def evict(paths: list[str]) -> None:
    """Drop these files' pages from the page cache (posix_fadvise DONTNEED; needs no privilege), and every cache
    (page cache, dentries, inodes) where /proc/sys/vm/drop_caches may be written."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
    except OSError:
        pass
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def drop_caches_status() -> str:
    if os.access("/proc/sys/vm/drop_caches", os.W_OK):
        return "cold runs: drop_caches (page cache, dentries and inodes) and posix_fadvise per file"
    return "cold runs: posix_fadvise per file only (/proc/sys/vm/drop_caches is not writable here)"


def measure(cmd: list[str], cold: list[str] | None = None) -> tuple[float, float, str, str]:
    """(wall seconds, the child's own peak MiB, stdout, stderr) of one command in a fresh process."""
    if cold is not None:
        evict(cold)
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")}
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    m = re.search(r"PEAK ru_maxrss_kib=(\d+) vmhwm_kib=(\d+)", proc.stderr)
    if not m:
        raise SystemExit(f"no peak memory report from {' '.join(cmd)}")
    # VmHWM: the high-water mark of the child's own memory map. ru_maxrss, even read by the child itself, keeps
    # the size of the process it was forked from (Linux carries it across exec), so it shows the parent's size.
    return wall, int(m.group(2)) / 1024, proc.stdout, proc.stderr


STAMP = 2  # bump when build() or fill_roots() change what they write


def prepare(base: Path, n: int, layout: str) -> tuple[Path, list[str], int, float]:
    """The synthetic run of N snapshots under `base` (built once; a folder whose stamp matches is reused).

    Returns (snapshots folder, the chosen roots' names, files in the chosen roots, build seconds).
    """
    snaps, stamp_file = base / "bench", base / "stamp.json"
    want = {"stamp": STAMP, "n": n, "layout": layout}
    if stamp_file.exists():
        stamp = json.loads(stamp_file.read_text())
        if {k: stamp.get(k) for k in want} == want:
            print(f"  reusing {snaps} (built in {stamp['build_s']:.0f}s)", file=sys.stderr, flush=True)
            return snaps, stamp["chosen"], stamp["root_files"], stamp["build_s"]
    if base.exists():  # a stale or half-built one
        shutil.rmtree(base)
    base.mkdir(parents=True)
    snaps.mkdir()
    t0 = time.monotonic()
    own = build(snaps, n, full=layout == "full")
    out = base / "choose"
    measure(select_command(snaps, out) + ["symlink"])  # which roots it chooses (and a warm page cache)
    chosen = sorted(os.listdir(out / "roots"))
    shutil.rmtree(out)
    if layout == "roots":
        fill_roots(snaps, chosen, own)
    build_s = time.monotonic() - t0
    root_files = sum(len(files) for name in chosen for _, _, files in os.walk(snaps / name))
    stamp_file.write_text(
        json.dumps({**want, "chosen": chosen, "root_files": root_files, "build_s": build_s})
    )
    return snaps, chosen, root_files, build_s


def select_command(snaps: Path, out: Path) -> list[str]:
    return [sys.executable, "-c", WRAPPER, "module", "sftree", "select-roots", "--snapshots", str(snaps),
            "--out", str(out / "roots"), "--table", str(out / "stages.tsv"), "--plot", str(out / "stages.svg"),
            "--direction", "maximize", "--link"]  # fmt: skip


def bench(n: int, layout: str, reps: int, links: list[str], data: Path | None, trash: Path) -> list[dict]:
    """Time the commands on one synthetic run. With `data` the run is kept there for the next invocation;
    without it, it is built in a temporary folder and moved to `trash` (removed in the background at the end)."""
    base = data / f"{layout}-{n}" if data else Path(tempfile.mkdtemp(prefix=f"sftree-bench-{layout}-{n}-"))
    try:
        snaps, chosen, root_files, build_s = prepare(base, n, layout)
        floor_py = base / "floor.py"
        floor_py.write_text(FLOOR)
        floor_cmd = [sys.executable, "-c", WRAPPER, "script", str(floor_py), str(snaps)]
        out = trash / f"out-{layout}-{n}"
        select_cmd = select_command(snaps, out)
        t0 = time.monotonic()
        every = [os.path.join(d, f) for d, _, files in os.walk(snaps) for f in files]
        every = list({os.stat(p).st_ino: p for p in every}.values())  # one path per file
        print(f"  {len(every):,} files to evict for cold runs (listed in {time.monotonic() - t0:.0f}s)",
              file=sys.stderr, flush=True)  # fmt: skip
        runs: dict[str, list] = {"floor": [], "json": [], "floor_cold": []}
        placed = {}

        def select(mode: str, cold: list[str] | None = None) -> tuple[float, float]:
            wall, mib, _, err = measure(select_cmd + [mode], cold)
            out.rename(trash / f"done-{time.monotonic_ns()}")  # deleted at the end, in the background
            found = re.search(r"root files: (.*)", err)
            placed[mode] = found.group(1) if found else "?"
            return wall, mib

        for _ in range(reps):  # interleaved: other work on the machine hits every command alike
            runs["floor"].append(measure(floor_cmd + ["bytes"])[:2])
            runs["json"].append(measure(floor_cmd + ["json"])[:2])
            for mode in links:
                runs.setdefault(mode, []).append(select(mode))
            runs["floor_cold"].append(measure(floor_cmd + ["bytes"], cold=every)[:2])
            for mode in links:
                runs.setdefault(mode + "_cold", []).append(select(mode, cold=every))
        best = {k: min(v) for k, v in runs.items()}
        rows = [
            {"n": n, "layout": layout, "build_s": build_s, "root_files": root_files, "link": mode,
             "placed": placed[mode], "floor": best["floor"], "json": best["json"], "floor_cold": best["floor_cold"],
             "select": best[mode], "select_cold": best[mode + "_cold"], "load": os.getloadavg()}
            for mode in links
        ]  # fmt: skip
        # at once: removing millions of links can take many minutes on a loaded machine
        print("\n".join(table(rows).splitlines()[2:]), file=sys.stderr, flush=True)
        return rows
    finally:
        if data is None and base.exists():
            base.rename(trash / base.name)


def remove_in_background(trash: Path) -> None:
    """Delete `trash` in a detached, niced process: the results are printed without waiting for it."""
    subprocess.Popen(
        ["nice", "-n", "19", "rm", "-rf", "--", str(trash)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def table(rows: list[dict]) -> str:
    head = ("| N | layout | root files | --link | floor s | floor+json s | select-roots s | ratio | floor cold s | "
            "select cold s | ratio cold | ms / 1k | peak MiB | floor MiB | load |")  # fmt: skip
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        (fs, fm), (js, _), (ss, sm) = r["floor"], r["json"], r["select"]
        fc, sc = r["floor_cold"][0], r["select_cold"][0]
        lines.append(
            f"| {r['n']:,} | {r['layout']} | {r['root_files']:,} | {r['link']} | {fs:.2f} | {js:.2f} | {ss:.2f} | {ss / fs:.2f} | "
            f"{fc:.2f} | {sc:.2f} | {sc / fc:.2f} | {1000 * ss / (r['n'] / 1000):.0f} | {sm:.0f} | {fm:.0f} | "
            f"{r['load'][0]:.1f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", default="1000,2000", help="sizes built in the full layout")
    parser.add_argument("--sizes", default="2000,10000,100000", help="sizes built in the roots layout")
    parser.add_argument("--reps", type=int, default=2, help="runs of each command (best is reported)")
    parser.add_argument("--links", default="symlink,hardlink", help="select-roots --link modes to time")
    parser.add_argument(
        "--data",
        type=Path,
        help="build the synthetic runs under this folder and keep them there; a later run with the same folder "
        "reuses them (default: a temporary folder, removed in the background at the end)",
    )
    args = parser.parse_args()
    print(drop_caches_status(), file=sys.stderr)
    plan = [(int(s), "full") for s in args.full.split(",") if s] + [
        (int(s), "roots") for s in args.sizes.split(",") if s
    ]
    rows = []
    if args.data:
        args.data.mkdir(parents=True, exist_ok=True)
    trash = Path(tempfile.mkdtemp(prefix="sftree-bench-trash-", dir=args.data))
    try:
        for n, layout in plan:
            rows += bench(n, layout, args.reps, args.links.split(","), args.data, trash)
            for r in rows[-len(args.links.split(",")) :]:
                print(f"  {layout} {n} --link {r['link']}: built in {r['build_s']:.0f}s, roots: {r['placed']}",
                      file=sys.stderr)  # fmt: skip
    finally:
        remove_in_background(trash)
    print()
    print(table(rows))
    print(
        "\nfloor: read every metadata.json and the snapshot's own attempt file once (paths known, os.read, no"
        "\nparsing); floor+json: list the folders, parse metadata.json + the attempt it names; select-roots: the"
        "\nfull command (read, stages, table, plot, place 30 roots with that --link); root files: the files"
        "\nof the 30 chosen folders; cold: every file evicted (posix_fadvise DONTNEED) before the run;"
        f"\nbest of {args.reps} runs each; ratio: select-roots / floor (goal <= 2); peak: the child's own VmHWM."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
