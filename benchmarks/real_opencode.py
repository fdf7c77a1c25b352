"""Where the time of a real model's tree through OpenCode goes: model time (llama-server's own timings) against
framework time, per request and per turn.

    .venv/bin/python benchmarks/real_opencode.py --tree results/circle_packing/trees/<root>

Reads the tree the workflow wrote (examples/real_opencode.yaml): `llama-server.log` (one `prompt eval time` /
`eval time` / `total time` block per request, in order: the server's timings), each edge's step records (the
proxy's latency per request, the server's usage) and tree.json (each edge's wall, grader and model seconds).
Prints two markdown tables: per request (prompt, cached and generated tokens, the server's prompt and generation
milliseconds, the proxy's latency and the difference: relay and queueing) and per edge (wall, model = the server's
total, grader, framework = wall - model - grader: OpenCode, its tools, the sandbox, forks, the coral client, git).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from sftree.records import steplog  # noqa: E402

_TIME = re.compile(r"(prompt eval|eval|total) time =\s*([0-9.]+) ms /\s*([0-9]+) tokens")


def server_timings(log: Path) -> list[dict]:
    """One dict per request the server answered: prompt_ms, prompt_n, gen_ms, gen_n, total_ms."""
    out: list[dict] = []
    cur: dict = {}
    for line in log.read_text(errors="replace").splitlines():
        m = _TIME.search(line)
        if not m:
            continue
        kind, ms, n = m[1], float(m[2]), int(m[3])
        if kind == "prompt eval":
            cur = {"prompt_ms": ms, "prompt_n": n}
        elif kind == "eval":
            cur.update(gen_ms=ms, gen_n=n)
        else:
            cur["total_ms"] = ms
            out.append(cur)
            cur = {}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", required=True, type=Path)
    args = ap.parse_args()
    done = args.tree / "tree.json"
    tree = json.loads((done if done.exists() else args.tree / "tree.live.json").read_text())
    listed = {
        e["id"] for e in tree["edges"]
    }  # a stopped tree: the edges it ran so far, from their transcripts
    tree["edges"] += [{"id": p.name} for p in sorted((args.tree / "edges").iterdir()) if p.name not in listed]
    timings = server_timings(args.tree / "llama-server.log")
    steps = []
    for e in tree["edges"]:
        f = args.tree / "edges" / e["id"] / "steps.jsonl"
        steps += [(e["id"], s) for s in (steplog.read_steps(f) if f.exists() else []) if s.get("response")]
    print(
        "| edge | turn | step | prompt tokens | cached | generated | server prompt ms | server gen ms | proxy latency ms | relay + queue ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (eid, s), t in zip(steps, timings, strict=False):
        u = s.get("usage") or {}
        lat = 1000 * float(s.get("latency_s") or 0)
        print(f"| {eid} | {s['turn']} | {s['step']} | {u.get('prompt_tokens')} | {u.get('cached_tokens')} | "
              f"{u.get('completion_tokens')} | {t['prompt_ms']:.0f} | {t.get('gen_ms', 0):.0f} | {lat:.0f} | "
              f"{lat - t['total_ms']:.0f} |")  # fmt: skip
    model_s = sum(t["total_ms"] for t in timings) / 1000
    print()
    print(
        "| edge | turns (ended) | requests | wall s | model s (server) | grader s | framework s | framework share |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for e in tree["edges"]:
        n = sum(1 for eid, _ in steps if eid == e["id"])
        mine = (
            sum(t["total_ms"] for (eid, _), t in zip(steps, timings, strict=False) if eid == e["id"]) / 1000
        )
        wall, grader = float(e.get("wall_s") or 0), float(e.get("grader_s") or 0)
        fw = wall - mine - grader
        ends = ", ".join(str(t.get("ended")) for t in e.get("turns") or [])
        print(f"| {e['id']} | {ends} | {n} | {wall:.0f} | {mine:.0f} | {grader:.1f} | {fw:.0f} | "
              f"{fw / wall if wall else 0:.1%} |")  # fmt: skip
    print(f"\nserver requests in the log: {len(timings)}, model time in all: {model_s:.0f} s")


if __name__ == "__main__":
    main()
