#!/usr/bin/env python3
"""Crash harness: the demo killed at random moments, rerun with the README's command, compared byte for byte with
the run that was never killed.

    python3 benchmarks/crash_harness.py [--runs 30] [--twice 0.3] [--term 0.3] [--roots 2] [--tasks A,B]
                                        [--width2 2] [--native] [--seed 0] [--work DIR] [--json OUT]

The demo's config (examples/demo.yaml at `search.parallel_width: 1`, the example Student run made once and
shared, the tree form on) runs once to the end in DIR/run: its outputs are the reference. Then --runs times, in
the same folder (so nothing that names it can differ) emptied first: the README command started, killed at a
moment drawn uniformly over the first 80% of the reference run's duration, either with SIGKILL to every process
of the run (Snakemake and all below it, a node lost) or, a --term share of the runs, with SIGTERM to Snakemake
alone (as Slurm sends it); a --twice share is killed again in its first rerun; then the README command is run
again until it succeeds. Each run reports:

- the stage(s) running at the kill (the `sftree` subcommands then alive, or `snakemake` alone);
- reruns: README commands needed after the last kill (1: resumed with the one command);
- survivors: processes of the killed run (any seen below Snakemake while it ran) alive 10 s after the kill;
- folders: temporary folders (runtime/tempdirs.py prefixes) named with a pid of the killed runs, left after the
  rerun finished;
- redone: edges finished twice (each tree's explore.log, appended by every run, says `edge eN done` once per
  finished edge);
- identical: every output equals the reference byte for byte: each tree's paths.json, every exported form, the
  LLaMA-Factory file and its dataset_info.json, the export stats, and the card's figures (sft.figures.json, whose
  timing fields are left out of the comparison).

Then --width2 runs at `parallel_width: 2` (killed the same way): every output there must be valid (the demo's
consumers read it: paths.json and the record readers) and complete, nothing redone; with two edges at once the
schedule depends on which finishes first, so the data may differ from any one reference.

Ends with the table: kills survived per stage, identical outputs, redone edges, processes and folders left.
Each run is a whole demo on 2 cores (minutes): the full harness takes hours; run it niced in the background.
The test suite runs a reduced form (tests/test_crash_resume.py: one tree, a few kills).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from sftree.config import REPO_ROOT
from sftree.runtime import procs, tempdirs
from sftree.runtime.runowner import start_time

SNAKEMAKE = Path(sys.executable).parent / "snakemake"
# sft.figures.json fields that measure time (they differ between any two runs)
TIMING_KEYS = ("wall_s", "seconds", "elapsed", "duration", "_at", "time")


def demo_config(snapshots: Path, width: int, roots: int | None, tasks: list[str] | None) -> dict:
    """examples/demo.yaml with absolute task and Student paths, the shared snapshots instead of `example_run`."""
    config = yaml.safe_load((REPO_ROOT / "examples/demo.yaml").read_text())
    config.pop("example_run", None)
    config["snapshots"] = str(snapshots)
    config["search"]["parallel_width"] = width
    if roots:
        config["select_roots"]["num_roots"] = roots
    if tasks:
        config["tasks"] = {t: config["tasks"][t] for t in tasks}
    for task in config["tasks"].values():
        task["coral_task"] = str(REPO_ROOT / task["coral_task"])
    for key in ("path", "chat_template"):
        config["export"]["student"][key] = str(REPO_ROOT / config["export"]["student"][key])
    config["export"]["tree_packed"] = True  # the tree form too (it needs the Student, which the demo names)
    return config


def make_snapshots(out: Path, tasks: list[str], count: int = 96, seed: int = 0) -> Path:
    """The demo's simulated Student run (its `example_run`), made once."""
    script = REPO_ROOT / "scripts/make_example_snapshots.py"
    argv = [sys.executable, str(script), "--out", str(out), "--tasks", ",".join(tasks)]
    subprocess.run([*argv, "--count", str(count), "--seed", str(seed)], check=True, capture_output=True)
    return out


def readme_command(work: Path) -> list[str]:
    """The README's command for a working folder (`--directory`: the checkout's Snakefile and profile)."""
    return [str(SNAKEMAKE), "--cores", "2", "--configfile", str(work / "config.yaml"),
            "--snakefile", str(REPO_ROOT / "Snakefile"), "--directory", str(work)]  # fmt: skip


def reset(work: Path, config: dict) -> None:
    """An empty working folder with the config: nothing of an earlier run (results, Snakemake's state)."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / "config.yaml").write_text(yaml.safe_dump(config))


@dataclass
class Watched:
    """A started README command and every process seen below it while it ran (pid -> start time)."""

    proc: subprocess.Popen
    seen: dict[int, str] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def look(self) -> list[int]:
        found = [self.proc.pid, *procs.descendants(self.proc.pid)]
        for pid in found:
            started = start_time(pid)
            if started is not None:
                self.seen.setdefault(pid, started)
        return found

    def alive(self) -> list[int]:
        return [pid for pid, started in self.seen.items() if start_time(pid) == started]


def start(work: Path, log) -> Watched:
    proc = subprocess.Popen(readme_command(work), stdout=log, stderr=subprocess.STDOUT, cwd=work,
                            start_new_session=True)  # fmt: skip
    w = Watched(proc)

    def loop() -> None:
        while not w.stop.is_set() and w.proc.poll() is None:
            w.look()
            time.sleep(0.2)

    threading.Thread(target=loop, daemon=True).start()
    return w


def stages(pids: list[int]) -> str:
    """The `sftree` subcommands among `pids`, or `snakemake` when none runs."""
    found = set()
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for i, a in enumerate(argv[:-1]):
            if os.path.basename(a) == b"sftree" and argv[i + 1][:1].isalpha():
                found.add(argv[i + 1].decode())
    return "+".join(sorted(found)) or "snakemake"


def kill(w: Watched, how: str) -> str:
    """Kill the run (`kill`: SIGKILL to every process of it; `term`: SIGTERM to Snakemake); the stage it hit."""
    now = w.look()
    stage = stages(now)
    if how == "term":
        os.kill(w.proc.pid, signal.SIGTERM)
    else:
        for _ in range(5):  # a process forked while we kill is met in the next round
            for pid in [w.proc.pid, *procs.descendants(w.proc.pid), *w.alive()]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
    return stage


def survivors(w: Watched, within: float = 10.0) -> int:
    """Processes of the killed run still alive `within` s after the kill (then killed, so they spoil no later
    run). After SIGTERM Snakemake itself has until then to finish."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and (w.alive() or w.proc.poll() is None):
        time.sleep(0.2)
    w.stop.set()
    left = w.alive()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        w.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    return len(left)


def run_to_end(work: Path, log, tries: int = 3) -> tuple[int, dict[int, str]]:
    """The README command until it succeeds: (commands it took, processes seen); 0 when none succeeded."""
    seen: dict[int, str] = {}
    for n in range(1, tries + 1):
        w = start(work, log)
        rc = w.proc.wait()
        w.stop.set()
        seen.update(w.seen)
        if rc == 0:
            return n, seen
    return 0, seen


def outputs(work: Path) -> dict[str, bytes]:
    """Every output compared with the reference, by path under results/."""
    res = work / "results"
    out: dict[str, bytes] = {}
    for p in sorted(res.glob("*/trees/*/paths.json")) + sorted(res.glob("**/sft*.jsonl")):
        # ATIF's metrics give the server's cache hits, which a resumed run's new server (a cold cache) cannot repeat
        if p.name.endswith(".atif.jsonl"):
            lines = [json.dumps(_uncached(json.loads(x))) for x in p.read_bytes().splitlines()]
            out[f"{p.relative_to(res)} (no cache hits)"] = "\n".join(lines).encode()
            continue
        out[str(p.relative_to(res))] = p.read_bytes()
    for name in ("dataset_info.json", "sft.stats.json"):
        for p in sorted(res.glob(f"**/{name}")):
            out[str(p.relative_to(res))] = p.read_bytes()
    figures = res / "sft.figures.json"
    if figures.exists():
        out["sft.figures.json (no timings)"] = json.dumps(_untimed(json.loads(figures.read_bytes()))).encode()
    return out


def _uncached(obj):
    """An ATIF document without its cached-token counts (`cached_tokens`, `total_cached_tokens`): what the Teacher's
    server had cached, which a run that was killed and resumed (a new server, a cold cache) cannot repeat."""
    if isinstance(obj, dict):
        return {k: _uncached(v) for k, v in obj.items() if "cached_tokens" not in k}
    if isinstance(obj, list):
        return [_uncached(v) for v in obj]
    return obj


def _untimed(obj):
    if isinstance(obj, dict):
        return {k: _untimed(v) for k, v in obj.items() if not any(t in k for t in TIMING_KEYS)}
    if isinstance(obj, list):
        return [_untimed(v) for v in obj]
    return obj


def redone(work: Path) -> int:
    """Edges finished more than once, over every run's lines in each tree's explore.log."""
    total = 0
    for log in (work / "results").glob("*/trees/*/explore.log"):
        done = Counter()
        for line in log.read_text(errors="replace").splitlines():
            if " edge e" in line and " done: " in line:
                done[line.split(" edge ", 1)[1].split(" ", 1)[0]] += 1
        total += sum(n - 1 for n in done.values())
    return total


def folders_left(pids: set[int]) -> int:
    """Temporary folders named with one of `pids` (the killed runs') still in the temp dir."""
    left = 0
    for p in Path(tempfile.gettempdir()).iterdir():
        prefix = next((x for x in tempdirs.PREFIXES if p.name.startswith(x)), None)
        pid = p.name[len(prefix) :].split("-", 1)[0] if prefix else ""
        left += pid.isdigit() and int(pid) in pids
    return left


@dataclass
class Trial:
    how: str  # kill | term
    kills: int  # 1, or 2 when the first rerun was killed too
    at_s: list[float]
    stages: list[str]
    survivors: int
    reruns: int
    folders: int
    redone: int
    identical: bool | None  # None at width 2 (no one reference)
    differing: list[str]


def trial(work: Path, config: dict, reference: dict[str, bytes] | None, duration: float, rng: random.Random,
          how: str, kills: int, log) -> Trial:  # fmt: skip
    reset(work, config)
    at, hit, alive, pids = [], [], 0, set()
    for _ in range(kills):
        # (a later run may be quicker than the reference: a kill past its end hits nothing)
        moment = rng.uniform(1.0, max(2.0, 0.8 * duration))
        w = start(work, log)
        deadline = time.monotonic() + moment
        while time.monotonic() < deadline and w.proc.poll() is None:
            time.sleep(0.1)
        at.append(round(moment, 1))
        if w.proc.poll() is not None:  # finished before the moment came: nothing to kill
            hit.append("(done)")
            w.stop.set()
            continue
        hit.append(kill(w, how))
        alive += survivors(w)
        pids |= set(w.seen)
    reruns, seen = run_to_end(work, log)
    outs = outputs(work)
    if reference is None:
        differing = [] if _complete(work) else ["incomplete"]
    else:
        differing = sorted(k for k in reference.keys() | outs.keys() if reference.get(k) != outs.get(k))
    return Trial(how, kills, at, hit, alive, reruns, folders_left(pids), redone(work),
                 None if reference is None else not differing, differing)  # fmt: skip


def _complete(work: Path) -> bool:
    """Width 2: every tree finished and selected, and the outputs read by their own checking readers."""
    from sftree.errors import InputError
    from sftree.records.paths import paths_path, read_paths
    from sftree.records.sft import iter_records

    res = work / "results"
    trees = list(res.glob("*/trees/*"))
    try:
        for t in trees:
            if not (t / "tree.json").exists():
                return False
            read_paths(paths_path(t))
        sum(1 for _ in iter_records(res / "sft.jsonl"))
    except InputError:
        return False
    return bool(trees) and (res / "report.html").exists() and (res / "sft_llamafactory.jsonl").exists()


def table(trials: list[Trial]) -> str:
    rows = ["| width | kill | stage(s) at the kill | runs | resumed with 1 command | identical | redone | "
            "processes left | folders left |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    groups: dict[tuple[str, str, str], list[Trial]] = {}
    for t in trials:
        width = "2" if t.identical is None else "1"
        kind = f"{'SIGKILL all' if t.how == 'kill' else 'SIGTERM snakemake'}{' x2' if t.kills == 2 else ''}"
        groups.setdefault((width, kind, " / ".join(t.stages)), []).append(t)
    for (width, kind, stage), ts in sorted(groups.items()):
        same = "valid, complete" if width == "2" else f"{sum(bool(t.identical) for t in ts)}/{len(ts)}"
        if width == "2":
            same = f"{sum(not t.differing for t in ts)}/{len(ts)} valid, complete"
        rows.append(f"| {width} | {kind} | {stage} | {len(ts)} | {sum(t.reruns == 1 for t in ts)}/{len(ts)} | "
                    f"{same} | {sum(t.redone for t in ts)} | {sum(t.survivors for t in ts)} | "
                    f"{sum(t.folders for t in ts)} |")  # fmt: skip
    n = len(trials)
    rows.append(f"| all | | | {n} | {sum(t.reruns == 1 for t in trials)}/{n} | "
                f"{sum(t.identical is not False and not t.differing for t in trials)}/{n} | "
                f"{sum(t.redone for t in trials)} | {sum(t.survivors for t in trials)} | "
                f"{sum(t.folders for t in trials)} |")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="killed runs at width 1")
    ap.add_argument(
        "--twice", type=float, default=0.3, help="share of runs killed again in their first rerun"
    )
    ap.add_argument("--term", type=float, default=0.3, help="share of runs killed by SIGTERM to Snakemake")
    ap.add_argument("--width2", type=int, default=2, help="killed runs at parallel_width 2")
    ap.add_argument("--roots", type=int, default=None, help="roots per task (default: the demo's)")
    ap.add_argument("--tasks", default=None, help="comma-separated tasks (default: the demo's)")
    ap.add_argument(
        "--native",
        action="store_true",
        help="agent.backend native (sftree's fast imitation of OpenCode: a run in about a minute)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a new temporary one)")
    ap.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    args = ap.parse_args()
    work_root = args.work or Path(tempfile.mkdtemp(prefix="crash-harness-"))
    tasks = args.tasks.split(",") if args.tasks else None
    snaps = work_root / "snapshots"
    if not snaps.exists():
        make_snapshots(snaps, tasks or ["circle_packing", "tsp"])
    work = work_root / "run"
    log = open(work_root / "runs.log", "ab")  # noqa: SIM115 (every run's output, for a look afterwards)
    rng = random.Random(args.seed)
    config = demo_config(snaps, 1, args.roots, tasks)
    if args.native:
        config["agent"]["backend"] = "native"
    reset(work, config)
    t0 = time.monotonic()
    n, _ = run_to_end(work, log, tries=1)
    duration = time.monotonic() - t0
    if n != 1:
        sys.exit(f"the uninterrupted run failed: see {work_root / 'runs.log'}")
    reference = outputs(work)
    print(f"reference run: {duration:.0f} s, {len(reference)} outputs", flush=True)
    trials: list[Trial] = []
    plan = [(1, "term" if rng.random() < args.term else "kill", 2 if rng.random() < args.twice else 1)
            for _ in range(args.runs)]  # fmt: skip
    plan += [(2, "term" if i % 2 else "kill", 1) for i in range(args.width2)]
    for i, (width, how, kills) in enumerate(plan):
        cfg = config if width == 1 else {**config, "search": {**config["search"], "parallel_width": 2}}
        t = trial(work, cfg, reference if width == 1 else None, duration, rng, how, kills, log)
        trials.append(t)
        print(f"run {i + 1}/{len(plan)} width {width}: {asdict(t)}", flush=True)
        if args.json:
            args.json.write_text(json.dumps({"reference_s": duration, "runs": [asdict(x) for x in trials]}))
    print(table(trials))


if __name__ == "__main__":
    main()
