#!/usr/bin/env python3
"""One tree grown by a real model (llama-server on the CPU), summed up as a row of docs/real_teacher.md's sweeps:
tool calls (parsed by llama.cpp, or read from JSON content), tool errors, `coral eval` calls, graded turns and
scores, changed files, repeated calls, replies cut at max_tokens.

    python3 benchmarks/real_sweep.py [--model qwen|smollm|PATH] [--template own|qwen25] [--constrain none|...]
                                     [--tool-choice required|auto] [--slots 2] [--steps 4] [--max-tokens 128]
                                     [--temperature 0.7] [--seed 1] [--task circle_packing] [--sandbox auto]
                                     [--keep DIR]

The tree: examples/real.yaml's agent and Teacher limits with these overrides, `--slots` root directions (each a
first try and, when it fails, its fallback: up to 2 x slots edges of 2 turns), no deeper edges. `--model qwen` is
Qwen2.5-Coder-0.5B-Instruct Q4_K_M, `smollm` SmolLM2-135M-Instruct Q4_1 (both from
scripts/install_llm_server.sh); `--template own` uses the GGUF's own chat template (`chat_template_file: null`),
`qwen25` the Qwen 2.5 template file examples/real.yaml gives the 135M model.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))

from helpers.explore import explore, make_root  # noqa: E402

from sftree.records import steplog  # noqa: E402
from sftree.search import tree as treemod  # noqa: E402

MODELS = {
    "qwen": ".tools/llama.cpp/models/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
    "smollm": ".tools/llama.cpp/models/SmolLM2-135M-Instruct.Q4_1.gguf",
}


def summarize(out: Path) -> dict:
    tree = treemod.load(out / "tree.json")
    steps = [s for e in tree.edges for s in steplog.read_steps(out / "edges" / e.id / "steps.jsonl")]
    answered = [s for s in steps if s["response"] is not None]
    calls = [(s, tc) for s in answered for tc in s["response"].get("tool_calls", [])]
    results = [r for s in answered for r in s["tool_results"]]
    native = sum(1 for s, _ in calls if not any(n.startswith("text_tool_calls") for n in s.get("notes", [])))
    evals, prev, repeats, changed = 0, None, 0, 0
    names: dict[str, int] = {}
    for _, tc in calls:
        fn = tc["function"]
        names[fn["name"]] = names.get(fn["name"], 0) + 1
        try:
            args = json.loads(fn["arguments"])
        except ValueError:
            args = {}
        if fn["name"] == "bash" and "coral eval" in str(args.get("command", "")):
            evals += 1
        key = (fn["name"], fn["arguments"])
        repeats += key == prev
        prev = key
    for s in answered:
        for tc, r in zip(s["response"].get("tool_calls", []), s["tool_results"], strict=False):
            if tc["function"]["name"] in ("write", "edit") and not r["error"]:
                changed += 1
    turns = [t for e in tree.edges for t in e.turns]
    graded = [t for t in turns if isinstance(t.score, int | float)]
    statuses: dict[str, int] = {}
    for t in turns:
        if t.eval_status:
            statuses[t.eval_status] = statuses.get(t.eval_status, 0) + 1
    return {
        "edges": len(tree.edges), "turns": len(turns), "steps": len(steps), "answered": len(answered),
        "calls": len(calls), "native_calls": native, "tools": names,
        "tool_errors": sum(1 for r in results if r["error"]), "coral_eval": evals,
        "eval_statuses": statuses, "graded": len(graded), "scores": [t.score for t in graded],
        "root_score": tree.root_node.score, "changed": changed, "repeats": repeats,
        "cut": sum(1 for s in answered if s["finish_reason"] == "length"),
        "prompt": sum(s["usage"]["prompt_tokens"] for s in answered),
        "cached": sum(s["usage"]["cached_tokens"] for s in answered),
        "model_s": round(sum(s["latency_s"] for s in answered), 1),
    }  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen")
    p.add_argument("--template", choices=["own", "qwen25"], default="own")
    p.add_argument("--constrain", default="none")
    p.add_argument("--tool-choice", default="required")
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--task", default="circle_packing")
    p.add_argument("--sandbox", default="auto")
    p.add_argument("--extra-body", default="{}", help="JSON passed as teacher.extra_body")
    p.add_argument("--keep", default=None, help="keep the tree in this folder")
    args = p.parse_args(argv)
    signal.signal(
        signal.SIGTERM, lambda *_: sys.exit(143)
    )  # the tree's llama-server is stopped on the way out
    work = Path(tempfile.mkdtemp(prefix="sftree-sweep-"))
    try:
        root = make_root(work, args.task)
        cfg = yaml.safe_load((REPO / "examples/real.yaml").read_text())
        cfg.pop("snapshots")
        cfg["results"] = str(work / "results")
        cfg["tasks"] = {
            args.task: {**cfg["tasks"][args.task], "coral_task": str(REPO / "examples" / args.task)}
        }
        launch = {"threads": 1, "model": MODELS.get(args.model, args.model)}
        if args.template == "own":
            launch["chat_template_file"] = None
        cfg["teacher"].update({"launch": launch, "constrain": args.constrain, "tool_choice": args.tool_choice,
                               "max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed,
                               "extra_body": json.loads(args.extra_body)})  # fmt: skip
        cfg["agent"].update({"max_steps_per_turn": args.steps, "sandbox": args.sandbox})
        cfg["search"].update({"root_children": args.slots, "max_valid_edges": args.slots,
                              "max_failed_expansions": 2, "target_good_leaves": args.slots})  # fmt: skip
        path = work / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        out = work / "tree"
        rc = explore(root, out, path)
        row = {"args": vars(args), "rc": rc, **(summarize(out) if (out / "tree.json").exists() else {})}
        print(json.dumps(row))
        if args.keep:
            shutil.copytree(out, args.keep, dirs_exist_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
