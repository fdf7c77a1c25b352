#!/usr/bin/env python3
"""Benchmark `sftree import-coral` on synthetic Coral-shaped runs with real git repositories.

    nice .venv/bin/python benchmarks/import_coral.py [--sizes 1000,10000] [--jobs N] [--floor-max 2000]
                                                      [--data /var/tmp/sftree-bench-import] [--keep]

The run (tests/helpers/coralrun.py, built with git fast-import): 4 agents, one commit per attempt in the code
repository (three files, one changed per attempt), one checkpoint per submission in `.coral/public/.git` holding
the attempts so far (each graded one submission after its own, 1% crashed), a note every third attempt, skills,
roles and the agents' growing logs (which the default `--shared-items` leaves out). Snapshot i holds every
attempt record of its checkpoint, as Coral's checkpoint does: N(N+1)/2 attempt files in all, 50M at N = 10k,
each a hard link into the store (one inode per distinct record version).

Timed, each as the real command line in a fresh process (`sftree import-coral`), with the child's peak memory:
- full: N attempts into an empty output (the run as it was when the last of them was still pending);
- grow: the run went on by 1% more attempts and the pending one was graded: the new snapshots and the rebuilt
  one, the others kept;
- rerun: the same run again (nothing to do: every record read and compared);
- floor (sizes <= --floor-max): `cp -al` of the finished snapshot folders, i.e. the same folders and hard links
  made by a C tool with no reading or planning at all, for the link cost this filesystem has.
The table gives seconds, links, and microseconds per link. Data are built under --data and removed by a
detached, niced `rm -rf` after the table (--keep leaves them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from helpers.coralrun import Spec, build_run, record_bytes  # noqa: E402


def specs(n: int) -> list[Spec]:
    out = []
    feedback = "Sum of radii: 2.4 | Score: 0.91 | Time: 1.2s | Benchmark: 2.635977"
    for i in range(n):
        agent = f"agent-{i % 4 + 1}"
        crashed = i % 100 == 7
        public = {f"logs/{agent}.0.log": f"[{i}] {feedback}\n".encode() * (i // 4 + 1)}
        if i % 3 == 0:
            public[f"notes/{agent}-{i:06d}.md"] = (
                f"# eval {i}\n\n{feedback}\nNext: shrink the inner ring.\n".encode()
            )
        if i % 500 == 0:
            public[f"skills/skill-{i}/SKILL.md"] = (
                f"---\nname: skill-{i}\n---\nA sweep over constants.\n".encode()
            )
        if i == 0:
            public |= {f"roles/agent-{k}.md": f"# agent-{k}\n".encode() for k in range(1, 5)}
        files = {f"part{i % 3}.py": f"VALUE_{i % 3} = {i}\n".encode()}
        status = "crashed" if crashed else ("improved" if i % 4 else "regressed")
        out.append(
            Spec(agent, files, status, None if crashed else 0.5 + i / (2 * n), public, title=f"attempt {i}")
        )
    return out


def timed(cmd: list[str], cwd: Path) -> tuple[float, int, str]:
    """(seconds, peak KiB of the child, its stdout) of a fresh process."""
    wrap = ["/usr/bin/time", "-f", "PEAK %M"] if Path("/usr/bin/time").exists() else []
    t0 = time.perf_counter()
    p = subprocess.run([*wrap, *cmd], cwd=cwd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    peak = next((int(line.split()[1]) for line in p.stderr.splitlines() if line.startswith("PEAK ")), 0)
    return dt, peak, p.stdout


def links_of(stdout: str) -> int:
    tail = stdout.split("this import:")[1]
    return int(tail.split(" links")[0].rsplit(",", 1)[1])


def trash(path: Path) -> None:
    subprocess.Popen(["nice", "-n", "19", "rm", "-rf", "--", str(path)], start_new_session=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--jobs", type=int, default=None, help="import-coral --jobs (default: its own)")
    ap.add_argument("--floor-max", type=int, default=2000, help="largest size the cp -al floor runs at")
    ap.add_argument("--data", default="/var/tmp/sftree-bench-import")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    sftree = str(Path(sys.executable).parent / "sftree")
    jobs = [] if args.jobs is None else ["--jobs", str(args.jobs)]
    print(
        f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; import-coral {' '.join(jobs) or '(default jobs)'}"
    )
    header = (
        f"{'attempts':>8} {'step':<6} {'snapshots':>9} {'links':>10} {'seconds':>8} {'us/link':>8} "
        f"{'peak MB':>8}  note"
    )
    print(header)
    print("-" * len(header))
    for n in [int(x) for x in args.sizes.split(",")]:
        grow = max(1, n // 100)
        base = data / f"run-{n}"
        if base.exists():
            shutil.rmtree(base)
        t0 = time.perf_counter()
        built = build_run(base / "run", specs(n + grow))
        build_s = time.perf_counter() - t0
        attempts = built.run / ".coral/public/attempts"
        full = {p.name: p.read_bytes() for p in attempts.iterdir()}
        for r in built.records[
            n:
        ]:  # the run as it was: the last `grow` not submitted, attempt n still pending
            (attempts / f"{r['commit_hash']}.json").unlink()
        pend = dict(built.records[n - 1], status="pending", score=None, feedback="")
        pend.pop("metadata", None)
        (attempts / f"{pend['commit_hash']}.json").write_bytes(record_bytes(pend))
        out = base / "out" / "bench"
        cmd = [sftree, "import-coral", str(built.run), "--out", str(out), *jobs]

        def row(step: str, dt: float, peak: int, stdout: str, note: str = "", n=n, out=out) -> None:
            links = links_of(stdout)
            snaps = json.loads((out / "import-coral.json").read_text())["counts"]["snapshots"]
            per = f"{dt / links * 1e6:8.2f}" if links else f"{'-':>8}"
            print(
                f"{n:>8} {step:<6} {snaps:>9} {links:>10} {dt:8.2f} {per} {peak / 1024:8.0f}  {note}",
                flush=True,
            )

        dt, peak, so = timed(cmd, base)
        row("full", dt, peak, so, f"run built in {build_s:.1f}s")
        for name, blob in full.items():
            (attempts / name).write_bytes(blob)
        dt, peak, so = timed(cmd, base)
        row("grow", dt, peak, so, f"+{grow} attempts, 1 graded since")
        dt, peak, so = timed(cmd, base)
        row("rerun", dt, peak, so, "nothing to do")
        if n <= args.floor_max:
            dst = base / "floor"
            dst.mkdir()
            names = [str(p) for p in sorted(out.iterdir()) if p.name.startswith("eval-")]
            t0 = time.perf_counter()
            subprocess.run(["cp", "-al", *names, str(dst)], check=True)
            dt = time.perf_counter() - t0
            files = sum(len(f) for _, _, f in os.walk(dst))
            print(
                f"{n:>8} {'floor':<6} {len(names):>9} {files:>10} {dt:8.2f} {dt / files * 1e6:8.2f} {'-':>8}  cp -al of the snapshots",
                flush=True,
            )
        if not args.keep:
            moved = data / f".trash-{n}-{os.getpid()}"
            base.rename(moved)
            trash(moved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
