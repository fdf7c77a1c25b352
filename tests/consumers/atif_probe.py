"""Run with .venv-consumers-atif's python: read an ATIF file with atif-scan's own loader (a second ATIF consumer,
its parser independent of the `atif` models) and print what it understood of each trajectory as JSON."""

from __future__ import annotations

import json
import sys

from atif_scan.data.loader import load_bytes

out = []
with open(sys.argv[1], "rb") as fh:
    for line in fh:
        trace = load_bytes(line)
        agent = [s for s in trace.steps if s.source == "agent"]
        out.append({
            "version": trace.schema_version,
            "sources": [s.source for s in trace.steps],
            "calls": [[c.name for c in s.calls] for s in agent],
            "paired": [sorted(o.source_call_id or "" for o in s.observations) == sorted(c.id for c in s.calls)
                       for s in agent],
            "completion_tokens": [s.completion_tokens for s in agent],
            "prompt_tokens": trace.usage.prompt_tokens if trace.usage else None,
            "agent": list(trace.agent),
        })  # fmt: skip
print(json.dumps(out))
