"""Benchmark what the recording proxy adds to one streamed model call, side by side in one run.

    python3 benchmarks/proxy_overhead.py [--requests 40] [--rounds 3]

teacher-sim over HTTP answers an OpenCode-sized request (a 8 KB system prompt, 8 tools of 2 KB) as a stream;
the same request is sent, with one keep-alive client session each, straight to teacher-sim, through the
RecordingProxy as it runs (`proxy`), and through the proxy with Nagle's algorithm left on its sockets (`proxy,
nagle`: the code before TCP_NODELAY). Rounds alternate the order. The table gives the median round trip per
request in ms and its overhead against `direct`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from sftree.agents.proxy import RecordingProxy  # noqa: E402
from sftree.teacher.sim.server import start_teacher_sim  # noqa: E402

TOOLS = [
    {"type": "function", "function": {"name": f"tool{i}", "description": "d" * 2000,
     "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}
    for i in range(8)
]  # fmt: skip
BODY = {
    "model": "student",
    "messages": [
        {"role": "system", "content": "s" * 8000},
        {"role": "user", "content": "Improve the score."},
    ],
    "tools": TOOLS,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def round_trips(base: str, n: int) -> list[float]:
    s = requests.Session()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = s.post(base + "/chat/completions", json=BODY, stream=True, timeout=30)
        for _chunk in r.iter_content(None):
            pass
        out.append(time.perf_counter() - t)
    return out


def proxy(url: str, nagle: bool) -> RecordingProxy:
    p = RecordingProxy(url, retries=1, backoff_max=0.05)
    p.server.RequestHandlerClass.disable_nagle_algorithm = not nagle
    return p.start()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    url, stop = start_teacher_sim(port=0, seed=1)
    proxies = {"proxy": proxy(url, nagle=False), "proxy, nagle": proxy(url, nagle=True)}
    for p in proxies.values():
        p.channel("e1")
    times: dict[str, list[float]] = {"direct": [], **{k: [] for k in proxies}}
    try:
        for rnd in range(args.rounds):
            names = list(times) if rnd % 2 == 0 else list(reversed(times))
            for name in names:
                base = url if name == "direct" else proxies[name].base_url("e1")
                times[name] += round_trips(base, args.requests)
                if name != "direct":
                    proxies[name].channels["e1"].take()
    finally:
        for p in proxies.values():
            p.stop()
        stop()
    direct = statistics.median(times["direct"]) * 1000
    print(f"\n{args.rounds} rounds x {args.requests} streamed requests per way (ms per request):\n")
    print("| way | median | overhead |")
    print("|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts) * 1000
        print(f"| {name} | {med:.1f} | {med - direct:+.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
