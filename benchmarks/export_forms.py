#!/usr/bin/env python3
"""Tokens a trainer processes per trained token, step form against merged form, under a Student.

    PYTHONPATH=src python3 benchmarks/export_forms.py [--results results] [--student GGUF_OR_HF_FOLDER]
                                                      [--chat-template FILE] [--steps 120] [--json OUT]

Exports every task's selected paths (`results/<task>/trees/*/paths.json`, e.g. the demo's) in both forms under the
Student (default: Qwen2.5-Coder-0.5B's GGUF from scripts/install_llm_server.sh --models-only) and prints records,
tokens processed (whole rendered records), tokens trained and their ratio per form. Then the same for one long
session made here: `--steps` model calls in two rollout turns, on OpenCode's own system prompt and tools (taken
from the first record of the results, when there is one), each call reading a file of about 1.5 kB. Both forms
train the same tokens (tests/test_export_merged.py); only what is processed differs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
from pathlib import Path

from sftree.dataset.export import export_task
from sftree.dataset.select_paths import select_paths
from sftree.dataset.student import load_student
from sftree.fileio import write_json_atomic
from sftree.records.sft import iter_records

REPO = Path(__file__).parents[1]
sys.path.insert(0, str(REPO / "tests"))
QWEN = "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"


def default_student() -> str:
    cache = os.environ.get("SFTREE_CACHE") or os.path.expanduser("~/.cache/sftree")
    found = glob.glob(f"{cache}/llama.cpp-*/install/models/{QWEN}")
    if not found:
        sys.exit(f"{QWEN} absent: run scripts/install_llm_server.sh --models-only, or give --student")
    return found[0]


def figures(paths_files: list[str], st) -> dict:
    out = {}
    for form in ("step", "merged"):
        records, stats = export_task(paths_files, form, student=st)
        s = stats.student
        out[form] = {
            "records": len(records),
            "processed": s.processed,
            "trained": s.trained,
            "ratio": round(s.processed / s.trained, 1) if s.trained else None,
            "longest": s.longest,
        }
    out["merged_fraction"] = round(out["merged"]["processed"] / out["step"]["processed"], 4)
    return out


def long_session(base: Path, steps: int, context: tuple[list, list]) -> str:
    """A tree of one path whose one edge is a session of `steps` model calls (helpers_export's layout)."""
    from helpers.export import make_results

    system, tools = context
    tree = make_results(base, faults={}, reasoning=False)
    text = "".join(f"    x{i} = compute(x{i - 1}, radius={i * 0.01:.2f})  # step {i}\n" for i in range(1, 30))
    messages, lines = list(system), []
    per_turn = steps // 2
    for turn in (1, 2):
        messages.append({"role": "user", "content": f"Turn {turn}: improve the packing and run coral eval."})
        for step in range(1, per_turn + 1):
            cid = f"call_{turn}_{step}"
            resp = {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {
                            "name": "read",
                            "arguments": json.dumps({"filePath": f"src/m{step}.py"}),
                        },
                    }
                ],
            }
            lines.append(
                {
                    "edge": "e1",
                    "turn": turn,
                    "step": step,
                    "kind": "agent",
                    "request": {"model": "m", "messages": list(messages), "tools": tools},
                    "response": resp,
                    "tool_results": [{"tool_call_id": cid, "name": "read", "content": text, "error": False}],
                    "usage": {"prompt_tokens": 0, "completion_tokens": 0},
                    "finish_reason": "tool_calls",
                }
            )
            messages += [resp, {"role": "tool", "tool_call_id": cid, "content": text}]
    (tree / "edges" / "e1" / "steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    doc = select_paths(json.loads((tree / "tree.json").read_text()), top_k=1)  # the path through e1 only
    write_json_atomic(tree / "paths.json", doc)
    return str(tree / "paths.json")


def opencode_context(results: Path) -> tuple[list, list]:
    sft = results / "sft.jsonl"
    if sft.is_file():
        rec = next(iter_records(sft))
        system = [m for m in rec["prompt"] if m["role"] == "system"]
        return system, rec["tools"]
    from helpers.export import TOOLS

    return [{"role": "system", "content": "You are a Coral agent."}], TOOLS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default="results")
    ap.add_argument("--student")
    ap.add_argument("--chat-template")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--json")
    args = ap.parse_args()
    st = load_student(args.student or default_student(), 10**7, args.chat_template)
    results = Path(args.results)
    report = {"student": st.describe()}
    tasks = sorted({Path(p).parts[-4] for p in glob.glob(f"{results}/*/trees/*/paths.json")})
    for task in tasks:
        report[task] = figures(sorted(glob.glob(f"{results}/{task}/trees/*/paths.json")), st)
    with tempfile.TemporaryDirectory() as tmp:
        pf = long_session(Path(tmp) / "results", args.steps, opencode_context(results))
        report[f"long_session_{args.steps}_steps"] = figures([pf], st)
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
