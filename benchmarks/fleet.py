#!/usr/bin/env python3
"""A fleet of real Teacher workers behind SGLang's router: cache share per worker and throughput, cache_aware
against round_robin, measured beside the prediction of the fleet cache model (sftree.teacher.kvcache).

    python3 benchmarks/fleet.py [--workers 2] [--policies cache_aware,round_robin] [--reps 1] [--roots 2]
                                [--width 2] [--steps 2] [--max-tokens 48] [--edges 4] [--json OUT]

Per run (the policies interleaved, rep by rep, each on a fresh fleet so every run starts with cold caches):
`--workers` llama-server workers (SmolLM2-135M, 1 thread, 1 slot each, `--metrics`) behind
`sglang-router launch --policy P`, and the demo's fleet of explore jobs against it: `--roots` roots of each
example task (select-roots on the demo's simulated Student run), all trees grown at once, `--width` expansions
each, with examples/real.yaml's agent and Teacher limits (`--steps` model calls per turn, `--max-tokens`) and a
budget of `--edges` valid edges per tree. The trees run in this process (the real edge runtime, as
`sftree explore` runs it), so every model call is recorded with its prompt, reply and times.

Measured, per worker: requests (the router's `smg_worker_cb_outcomes_total`), prompt tokens and the share served
from its cache (llama-server's `prompt_tokens_cached_total` / (`prompt_tokens_total` + cached)), tokens generated
and seconds busy (prompt + generation); for the fleet: the same share from the replies' own usage, completion
tokens per second of wall time and steps per minute. Predicted: the run's recorded calls replayed through
`kvcache.replay_fleet` (N caches behind RouterModel with the run's policy; unbounded caches, as llama-server's
8 GiB prompt cache is for these sessions), giving requests and cache share per worker and overall. The
prompts' token counts in the model are characters / 4, so compare shares, not token totals.
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from schedule import record_calls  # noqa: E402

from sftree.config import load_config  # noqa: E402
from sftree.runtime.workspace import NodeState  # noqa: E402
from sftree.search import mcts  # noqa: E402
from sftree.search import tree as treemod  # noqa: E402
from sftree.search.edge import EdgeContext, run_edge  # noqa: E402
from sftree.settings import settings_of  # noqa: E402
from sftree.teacher import kvcache  # noqa: E402
from sftree.teacher.fleet import start_fleet  # noqa: E402
from sftree.teacher.llm_server import LaunchSpec  # noqa: E402
from sftree.world.task import task_config  # noqa: E402

TASKS = ("circle_packing", "tsp")


def make_roots(work: Path, per_task: int) -> list[tuple[str, Path]]:
    """The demo's Student run (scripts/make_example_snapshots.py) and `per_task` roots of each task from it."""
    snaps = work / "snapshots"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_example_snapshots.py"), "--out", str(snaps),
                    "--count", "40", "--seed", "0", "--tasks", ",".join(TASKS)], check=True,
                   capture_output=True)  # fmt: skip
    roots = []
    for task in TASKS:
        out = work / "roots" / task
        direction = "maximize" if task == "circle_packing" else "minimize"
        subprocess.run([str(Path(sys.executable).parent / "sftree"), "select-roots", "--snapshots",
                        str(snaps / task), "--out", str(out), "--table", str(work / f"{task}.tsv"), "--direction",
                        direction, "--num-roots", str(per_task), "--task", task], check=True,
                       capture_output=True)  # fmt: skip
        roots += [(task, r) for r in sorted(p for p in out.iterdir() if p.is_dir())]
    return roots


def tree_config(work: Path, base_url: str, args) -> dict:
    real = __import__("yaml").safe_load((REPO / "examples" / "real.yaml").read_text())
    overrides = {
        "tasks": {t: {**real["tasks"][t], "coral_task": str(REPO / "examples" / t)} for t in TASKS},
        "results": str(work / "results"),
        "teacher": {
            **{k: v for k, v in real["teacher"].items() if k != "launch"},
            "base_url": base_url,
            "max_tokens": args.max_tokens,
            "stall_timeout": 120,
            "first_chunk_timeout": 900,
            "request_timeout": 1800,
            "retries": 4,
            "health_timeout": 60,
        },  # fmt: skip
        "agent": {**real["agent"], "max_steps_per_turn": args.steps, "sandbox": args.sandbox},
        "search": {
            "root_children": 2,
            "max_children": 2,
            "max_depth": 2,
            "target_good_leaves": 4,
            "max_valid_edges": args.edges,
            "max_failed_expansions": 2,
            "parallel_width": args.width,
            "hard_token_limit": 6000,
            "seed": 0,
        },  # fmt: skip
    }
    config = load_config(REPO / "config.yaml", overrides)
    config["tasks"] = overrides["tasks"]
    return config


def grow(work: Path, task: str, root: Path, config: dict, t0: float, calls: list, lock) -> dict:
    settings = settings_of(config)
    tcfg = task_config(settings, task)
    meta = json.loads((root / "metadata.json").read_text())
    out = work / "trees" / task / root.name
    ctx = EdgeContext.create(out, root, settings, tcfg)
    record_calls(ctx.teacher, t0, calls, lock)
    params = settings.search
    tree = treemod.Tree.new(task, root.name, tcfg["direction"], params, meta.get("score"),
                            ctx.root_state.to_dict(), meta.get("eval_count"))  # fmt: skip

    def run_one(d: mcts.Dispatch):
        return run_edge(ctx, NodeState.from_dict(d.parent_state), d.edge, d.parent_score, depth=d.depth,
                        attempt=d.attempt, eval_count=d.parent_eval_count or 0)  # fmt: skip

    try:
        tree = mcts.run_search(tree, run_one, lambda t: treemod.save(t, out / "tree.live.json"))
    finally:
        ctx.close()
    return {"edges": len(tree.edges), "teacher": ctx.teacher.report()}


def worker_requests(metrics: str) -> dict[str, float]:
    out = {}
    for m in re.finditer(
        r'smg_worker_cb_outcomes_total\{worker="([^"]+)",outcome="success"\} (\S+)', metrics
    ):
        out[m.group(1)] = float(m.group(2))
    return out


def one_run(policy: str, rep: int, roots, args, work: Path) -> dict:
    run_dir = work / f"{policy}-{rep}"
    spec = LaunchSpec.from_config({"threads": 1, "parallel": args.parallel, "ctx_size": 8192 * args.parallel,
                                   "extra_args": args.worker_args.split()})  # fmt: skip
    with start_fleet(args.workers, run_dir / "fleet", kind="llama-server", policy=policy, spec=spec) as fleet:
        config = tree_config(run_dir, fleet.base_url, args)
        calls: list = []
        lock = threading.Lock()
        results: dict = {}
        t0 = time.monotonic()

        def job(task, root):
            results[root.name] = grow(run_dir, task, root, config, t0, calls, lock)

        threads = [threading.Thread(target=job, args=tr, daemon=True) for tr in roots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        makespan = time.monotonic() - t0
        per_worker = []
        routed = worker_requests(fleet.router_metrics())
        for w in fleet.workers:
            m = fleet.metrics(w)
            processed, cached = m.get("prompt_tokens_total", 0), m.get("prompt_tokens_cached_total", 0)
            per_worker.append({
                "worker": w.index, "url": w.url, "requests": int(routed.get(w.url, 0)),
                "prompt": int(processed + cached), "cached": int(cached),
                "share": cached / (processed + cached) if processed + cached else None,
                "generated": int(m.get("tokens_predicted_total", 0)),
                "busy_s": m.get("prompt_seconds_total", 0) + m.get("tokens_predicted_seconds_total", 0),
            })  # fmt: skip
    if len(results) != len(roots):
        raise SystemExit(f"{policy} rep {rep}: {len(roots) - len(results)} tree(s) failed (see {run_dir})")
    prompt = sum(c[5] for c in calls)
    cached = sum(c[6] for c in calls)
    completion = sum(r["teacher"]["completion_tokens"] for r in results.values())
    fleet_calls = [
        kvcache.FleetCall(a, b, tuple(kvcache.chain(m, tools)), kvcache.extend(kvcache.chain(m, tools), reply),
                          tuple(kvcache.routing_text(m)))
        for a, b, m, tools, reply, _, _ in sorted(calls, key=lambda c: c[0])
    ]  # fmt: skip
    if args.trace:
        with open(f"{args.trace}.{policy}-{rep}.pickle", "wb") as f:
            pickle.dump(fleet_calls, f)
    # the workers' cache as this run's llama-server has it (kvcache.SlotCache: its slots and host prompt cache,
    # --slot-prompt-similarity 0.1, or 0 with --worker-args '-sps 0'); a reply written as JSON content comes back
    # rendered as a tool call, so it is not reused. Beside it, SGLang's radix cache on the same trace.
    sps0 = re.search(r"(--slot-prompt-similarity|-sps)[ =]0(\.0*)?(?![\d.])", args.worker_args) is not None
    kind = {"cache": "slots", "slots": args.parallel, "similarity": 0.0 if sps0 else 0.1}
    model = kvcache.replay_fleet(fleet_calls, args.workers, float("inf"), policy, replies=False, **kind)
    radix = kvcache.replay_fleet(fleet_calls, args.workers, float("inf"), policy)
    one = kvcache.replay([kvcache.Call(c.start, c.end, c.prompt, c.reply) for c in fleet_calls], float("inf"))
    return {
        "policy": policy, "rep": rep, "trees": len(results), "edges": sum(r["edges"] for r in results.values()),
        "calls": len(calls), "makespan_s": makespan, "prompt": prompt, "cached": cached,
        "share": cached / prompt if prompt else None, "completion": completion,
        "tok_per_s": completion / makespan, "steps_per_min": 60 * len(calls) / makespan,
        "failed_attempts": sum(r["teacher"]["failed_attempts"] for r in results.values()),
        "workers": per_worker,
        "model": {"share": model.share, "requests": model.requests, "cache": f"slots, sps {kind['similarity']:g}",
                  "shares": [r.share for r in model.per_server], "one_server_share": one.share,
                  "sglang_share": radix.share},
        "sweep": sweep(fleet_calls),
    }  # fmt: skip


SWEEP = [("round_robin", {}), ("cache_aware", {}), ("cache_aware", {"balance_abs": 2})]  # SGLang radix caches


def sweep(calls) -> list[dict]:
    """The model alone on this run's trace: 1-4 servers, each policy (and cache_aware balancing at 2 requests in
    flight instead of 64): share, and requests per server."""
    out = []
    for n in (1, 2, 3, 4):
        for policy, opts in SWEEP:
            r = kvcache.replay_fleet(calls, n, float("inf"), policy, **opts)
            name = policy + "".join(f" {k}={v}" for k, v in opts.items())
            out.append({"servers": n, "policy": name, "share": r.share, "requests": r.requests})
    return out


def sweep_table(runs: list[dict]) -> str:
    lines = ["| trace of | servers | router (model) | predicted cache share | requests per server |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        for s in r["sweep"]:
            lines.append(f"| {r['policy']} {r['rep']} | {s['servers']} | {s['policy']} | {fmt(s['share'])} | "
                         f"{' / '.join(map(str, s['requests']))} |")  # fmt: skip
    return "\n".join(lines)


def fmt(x, nd=3) -> str:
    if x is None:
        return "-"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def table(runs: list[dict]) -> str:
    head = ("| policy | rep | worker | requests | model requests | prompt tok | cache share | model share | "
            "generated tok | busy s |")  # fmt: skip
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        for w in r["workers"]:
            k = w["worker"]
            lines.append(f"| {r['policy']} | {r['rep']} | {k} | {w['requests']} | {r['model']['requests'][k]} | "
                         f"{w['prompt']} | {fmt(w['share'])} | {fmt(r['model']['shares'][k])} | {w['generated']} | "
                         f"{fmt(w['busy_s'], 1)} |")  # fmt: skip
        lines.append(f"| {r['policy']} | {r['rep']} | all | {r['calls']} | {sum(r['model']['requests'])} | "
                     f"{r['prompt']} | {fmt(r['share'])} | {fmt(r['model']['share'])} | {r['completion']} | "
                     f"{fmt(sum(w['busy_s'] for w in r['workers']), 1)} |")  # fmt: skip
    lines += ["", "| policy | rep | trees | edges | model calls | makespan s | completion tok/s | steps/min | "
              "cache share | model share (worker cache) | model, SGLang radix | model, one SGLang server | "
              "attempts sent again |", "|" + "---|" * 13]  # fmt: skip
    for r in runs:
        m = r["model"]
        lines.append(f"| {r['policy']} | {r['rep']} | {r['trees']} | {r['edges']} | {r['calls']} | "
                     f"{fmt(r['makespan_s'], 1)} | {fmt(r['tok_per_s'], 2)} | {fmt(r['steps_per_min'], 1)} | "
                     f"{fmt(r['share'])} | {fmt(m['share'])} ({m['cache']}) | {fmt(m['sglang_share'])} | "
                     f"{fmt(m['one_server_share'])} | {r['failed_attempts']} |")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--policies", default="cache_aware,round_robin")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--roots", type=int, default=2, help="roots per example task (the demo: 2)")
    p.add_argument("--width", type=int, default=2, help="search.parallel_width of each tree (the demo: 2)")
    p.add_argument("--steps", type=int, default=2, help="agent.max_steps_per_turn")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--edges", type=int, default=4, help="search.max_valid_edges per tree")
    p.add_argument("--parallel", type=int, default=1, help="llama-server slots per worker")
    p.add_argument("--sandbox", default="auto")
    p.add_argument(
        "--worker-args", default="", help="more llama-server arguments, e.g. '--slot-prompt-similarity 0'"
    )
    p.add_argument("--json", default=None)
    p.add_argument(
        "--trace", default=None, help="also pickle each run's calls to TRACE.<policy>-<rep>.pickle"
    )
    args = p.parse_args(argv)
    signal.signal(
        signal.SIGTERM, lambda *_: sys.exit(143)
    )  # the fleet's processes are stopped on the way out
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    work = Path(tempfile.mkdtemp(prefix="sftree-fleet-"))
    runs = []
    try:
        roots = make_roots(work, args.roots)
        for rep in range(args.reps):
            for policy in args.policies.split(","):
                print(f"run {policy} rep {rep}: {len(roots)} trees on {args.workers} workers ...", flush=True)
                runs.append(one_run(policy, rep, roots, args, work))
                print(table(runs[-1:]), flush=True)
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(runs, indent=1))
        shutil.rmtree(work, ignore_errors=True)
    print("\n" + table(runs) + "\n\nThe fleet model alone on each run's trace:\n\n" + sweep_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
