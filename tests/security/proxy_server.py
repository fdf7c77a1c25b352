"""The recording proxy in a process of its own, so a test can measure that process's memory alone.

    python proxy_server.py '{"upstream": URL, "model": ..., "student": ..., "limits": {...}}'

prints `{"url": <channel e1's base URL>, "port": N}`, then answers one JSON line per command read on stdin:
`state` (the channel's records and limit, the refusal counters, VmHWM/VmRSS in KiB) or `reset_peak` (VmHWM
starts again from the current RSS: /proc/self/clear_refs). Exits when stdin closes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sftree.agents.proxy import ProxyLimits, RecordingProxy


def memory() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0])
    return out


def main() -> None:
    cfg = json.loads(sys.argv[1])
    proxy = RecordingProxy(
        cfg["upstream"],
        retries=0,
        model=cfg.get("model"),
        student_model=cfg.get("student"),
        limits=ProxyLimits(**cfg.get("limits", {})),
    ).start()
    ch = proxy.channel("e1", {"X-Sftree-Edge": "e1"})
    print(json.dumps({"url": proxy.base_url("e1"), "port": proxy.port}), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "reset_peak":
            Path("/proc/self/clear_refs").write_text("5")
            print(json.dumps(memory()), flush=True)
        elif cmd == "state":
            mem = memory()  # before the sizes below are computed (they cost memory themselves)
            with ch.lock:
                recs = list(ch.records)
            print(json.dumps({
                **mem,
                "records": len(recs),
                "record_bytes": sum(len(json.dumps(r)) for r in recs),
                "over_limit": ch.over_limit,
                "refused": dict(proxy.refused),
                "channel_refused": dict(ch.refused),
            }), flush=True)  # fmt: skip
    proxy.stop()


if __name__ == "__main__":
    main()
