#!/usr/bin/env python3
"""Tokens a trainer processes per trained token, form by form (step, merged, path, tree), under a Student.

    PYTHONPATH=src python3 benchmarks/export_forms.py [--results results] [--student GGUF_OR_HF_FOLDER]
                                                      [--chat-template FILE] [--steps 120] [--json OUT]

Exports every task's selected paths (`results/<task>/trees/*/paths.json`, e.g. the demo's) in each form under the
Student (default: Qwen2.5-Coder-0.5B's GGUF from scripts/install_llm_server.sh --models-only) and prints records,
tokens processed (whole rendered records; the tree form: its lines), tokens trained and their ratio per form. Then
the same for one long session made here: `--steps` model calls in two rollout turns, on OpenCode's own system
prompt and tools (taken from the first record of the results, when there is one), each call reading a file of about
1.5 kB. The step and merged forms train the same tokens (tests/test_export_merged.py); the path form's loss takes a
shared edge once per path through it (`objective`: its trained tokens counted so; `trained`: each token once, the
tree form's), the tree form each token once with that count as its weight. Then `simulated_sweep`: the four forms' figures, counted from the shape alone, on full
trees of sessions (branching x depth edges of `steps` model calls each) on OpenCode's ~7k-token context.
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
from sftree.dataset.tree_packed import pack_records
from sftree.records.paths import write_paths
from sftree.records.sft import iter_records
from sftree.records.tree import Tree

REPO = Path(__file__).parents[1]
sys.path.insert(0, str(REPO / "tests"))
QWEN = "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"


def default_student() -> str:
    cache = os.environ.get("SFTREE_CACHE") or os.path.expanduser("~/.cache/sftree")
    found = glob.glob(f"{cache}/llama.cpp-*/install/models/{QWEN}")
    if not found:
        sys.exit(f"{QWEN} absent: run scripts/install_llm_server.sh --models-only, or give --student")
    return found[0]


def figures(paths_files: list[str], st, cap: int = 10**7) -> dict:
    out = {}
    for form in ("step", "merged", "path"):
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
    records, _ = export_task(paths_files, "path", student=st)
    lines, t = pack_records(records, st, cap)
    path = out["path"]  # its loss counts a shared token once per path: each counted once, as the tree's
    path.update(objective=path["trained"], trained=t.trained, ratio=round(path["processed"] / t.trained, 1))
    out["tree"] = {
        "records": len(lines),
        "processed": t.processed,
        "trained": t.trained,
        "ratio": round(t.processed / t.trained, 1) if t.trained else None,
        "longest": t.longest,
        "objective": t.objective,
        "unsplit": t.unsplit,
    }
    return out


def simulated(branching: int, depth: int, steps: int, system=7000, completion=60, result=400) -> dict:
    """The four forms on a full tree of `branching`**`depth` selected paths, each edge a session continued from its
    parent of `steps` model calls (`completion` trained tokens, then a tool result of `result` tokens), on a context
    of `system` tokens; each form as the export writes it (step: each edge once; merged: a run per path's edges not
    yet written, ending on its last trained message; path: every path whole; tree: each distinct prefix once)."""
    per_step = completion + result
    edge = steps * per_step
    paths = [
        tuple(divmod(i, branching**k)[0] % branching for k in range(depth)) for i in range(branching**depth)
    ]
    written: set = set()
    step_p = merged_p = 0
    for p in paths:
        new = [k for k in range(depth) if p[: k + 1] not in written]
        written.update(p[: k + 1] for k in new)
        for k in new:
            step_p += sum(system + k * edge + j * per_step + completion for j in range(steps))
        if new:
            merged_p += system + (depth * edge) - result
    distinct = len(written)
    trained = distinct * steps * completion
    n = len(paths)
    forms = {
        "step": (step_p, trained),
        "merged": (merged_p, trained),
        "path": (n * (system + depth * edge), trained),  # its loss counts them n*depth*steps*completion times
        "tree": (system + distinct * edge, trained),
    }
    return {f: {"processed": p, "trained": t, "ratio": round(p / t, 2)} for f, (p, t) in forms.items()}


def simulated_sweep() -> list[dict]:
    rows = []
    for branching, depth in ((2, 2), (2, 3), (3, 2), (2, 4), (3, 3)):
        for steps in (5, 20):
            rows.append(
                {"branching": branching, "depth": depth, "steps": steps} | simulated(branching, depth, steps)
            )
    return rows


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
    typed_tree = Tree.from_doc(json.loads((tree / "tree.json").read_text()))
    write_paths(tree / "paths.json", select_paths(typed_tree, top_k=1))  # the path through e1 only
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
    report["simulated"] = simulated_sweep()
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
