#!/usr/bin/env python3
"""Wall time of one training step per form (step, merged, path, tree) on the small model, on CPU.

    PYTHONPATH=src .venv/bin/python benchmarks/tree_train_time.py [--results results] [--layers 30] [--repeat 2]
                                                                  [--threads N] [--attn sdpa] [--json OUT]

Exports the selected paths of `--results` (default: the test fixture's tree, tests/helpers/export.py) in each form
under SmolLM2-135M's tokenizer with Qwen2.5's template (as tests/test_tree_trainer.py), then, in the trainer venv
(scripts/install_trainer.sh), one training step per form over all of that form's records: every record (step,
merged, path: `token_labels` rows; tree: its lines through `tree_collator`) forward and backward one at a time on
SmolLM2-135M (its first `--layers` decoder layers, float32, `--attn` attention (sdpa: the tree's CPU path; eager
as the first measurement had it), every parameter trained), then one optimizer step (learning rate 0: every form
meets the same weights); the forms take turns, best of `--repeat` each. Wall and CPU seconds per form and their ratios to the tree form's (a markdown table, docs/benchmarks.md).
The path and tree forms train the same tokens; the step and merged forms may train a few more (the steps after an
ill-formed one, which the path form cuts: docs/benchmarks.md).

    PYTHONPATH=src ~/.cache/sftree/trainer/venv/bin/python benchmarks/tree_train_time.py --demo results
                                                                  [--tokenizer GGUF] [--template JINJA] [--parts N]

`--demo DIR`: the export's own files instead (DIR/sft.jsonl, merged records; DIR/sft.tree.jsonl, tree lines; a
task's folder too), at their real lengths, merged against tree only, in this process (the trainer venv): the
merged records tokenized with `token_labels` under the Student's tokenizer (default: DIR's sft.stats.json's
`student`), the lines through `collate`. The model is a 2-layer Llama of hidden size 64 (4 heads, random weights,
float32, sdpa) with the tokenizer's vocabulary, so that the step measures the tokens processed and the attention
and its mask, not a large model's matmuls. Both forms take the loss at their trained rows only, in chunks
(`tree_loss`: a merged record is a chain, each token's parent the one before it), as a trainer must at 20-32k tokens
and V = 151,665 (full float32 logits of one record: ~12 GB); the merged form's attention is sdpa's causal, no mask,
the tree's the dense ancestor mask (`tree_attention`, the CPU path). `--parts N`: the first N lines only, and the
merged records of the paths they hold (`metadata.paths`).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).parents[1]
FORMS = ("step", "merged", "path", "tree")


def export_forms(results: str | None, out: Path) -> dict:
    """The four forms' files in `out` (step, merged and path records; tree lines) and the template's path."""
    sys.path.insert(0, str(REPO / "tests"))
    from gguf import GGUFReader
    from test_export_student import QWEN, SMOL, model, paths_of

    from sftree.dataset.export import export_task
    from sftree.dataset.student import load_student
    from sftree.dataset.tree_packed import pack_records
    from sftree.records.tree_packed import write_tree_lines

    smol, qwen = model(SMOL), model(QWEN)
    template = out / "qwen2.5.jinja"
    template.write_text(GGUFReader(str(qwen)).fields["tokenizer.chat_template"].contents())
    st = load_student(smol, 10**6, template)
    if results:
        paths = sorted(glob.glob(f"{results}/*/trees/*/paths.json"))
    else:
        from helpers.export import make_results

        paths = [str(paths_of(make_results(out / "results", reasoning=False)))]
    for form in FORMS[:3]:
        records, _ = export_task(paths, form, student=st)
        (out / f"{form}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        if form == "path":
            lines, _ = pack_records(records, st, 10**6)
            write_tree_lines(out / "tree.jsonl", lines)
    return {"model_dir": str(smol.parent), "gguf": smol.name, "template": str(template), "dir": str(out)}


def step_loss(model, form: str, r: dict):
    """The summed loss of one record (step, merged, path: its completion tokens; tree: `tree_loss`)."""
    import torch

    from sftree.dataset.tree_collator import collate
    from sftree.dataset.tree_loss import forward_loss

    if form == "tree":
        return forward_loss(model, collate([r]))[0]
    ids = torch.tensor([r["input_ids"]])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
    mask = torch.tensor(r["completion_mask"][1:], dtype=torch.float32)
    return -(logp.gather(-1, ids[0, 1:, None])[:, 0] * mask).sum()


def inner(cfg: dict, layers: int, repeat: int, threads: int, attn: str = "sdpa") -> dict:
    """In the trainer venv: one step per form (see the module). The forms take turns within each repeat, so
    that a change in the shared machine's load falls on all of them; CPU seconds (the process's, all threads)
    beside the wall time, which other work on the machine stretches."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sftree.dataset.trainer_labels import token_labels

    torch.manual_seed(0)
    if threads:
        torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(cfg["model_dir"], gguf_file=cfg["gguf"])
    tok.chat_template = open(cfg["template"]).read()
    model = AutoModelForCausalLM.from_pretrained(
        cfg["model_dir"], gguf_file=cfg["gguf"], dtype=torch.float32, attn_implementation=attn
    )
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the step's cost, weights unchanged between forms
    rows = {}
    for form in FORMS:
        rows[form] = [json.loads(x) for x in open(os.path.join(cfg["dir"], f"{form}.jsonl"))]
        if form != "tree":
            rows[form] = [token_labels(r, tok) for r in rows[form]]
    short = min(rows["step"], key=lambda r: len(r["input_ids"]))
    step_loss(model, "step", short).backward()  # warm-up: first-call allocations timed in no form
    opt.zero_grad()
    best: dict = {}
    for _ in range(repeat):
        for form in FORMS:
            t0, c0 = time.perf_counter(), time.process_time()
            for r in rows[form]:
                step_loss(model, form, r).backward()
            opt.step()
            opt.zero_grad()
            took = (time.perf_counter() - t0, time.process_time() - c0)
            # each the least of the repeats (wall and CPU apart: another process may stretch either)
            best[form] = took if form not in best else tuple(map(min, best[form], took))
            print(form, [round(x, 2) for x in took], file=sys.stderr, flush=True)
    out = {}
    for form in FORMS:
        rs = rows[form]
        # the terms of the step's loss: trained tokens (a token shared by paths once per path), the tree's weights
        terms = sum(sum(r["loss_weight"] if form == "tree" else r["completion_mask"][1:]) for r in rs)
        out[form] = {
            "records": len(rs),
            "tokens_processed": sum(len(r["input_ids"]) for r in rs),
            "loss_tokens": int(terms),
            "seconds": round(best[form][0], 2),
            "cpu_seconds": round(best[form][1], 2),
        }
    return out


def demo_rows(demo: Path, parts: int) -> tuple[list[dict], list[dict]]:
    """The merged records and tree lines of `demo`: the first `parts` lines (0: all) and the records of their paths."""
    tree = [json.loads(x) for x in open(demo / "sft.tree.jsonl")]
    merged = [json.loads(x) for x in open(demo / "sft.jsonl")]
    if parts:
        tree = tree[:parts]
        ids = {p["id"] for line in tree for p in line["metadata"]["paths"]}
        merged = [r for r in merged if r["metadata"]["steps"][-1] in ids]
        if len(merged) != len(ids):
            sys.exit(f"{len(ids)} paths in the first {parts} lines, {len(merged)} merged records of them")
    return merged, tree


def peak_reset() -> None:
    """The process's peak resident memory back to the current (Linux: 5 into clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def resident() -> dict:
    status = open("/proc/self/status").read()
    return {k: int(v) / 1024 for k, v in re.findall(r"(VmHWM|VmRSS):\s+(\d+) kB", status)}


def demo(
    path: str, tokenizer: str | None, template: str | None, parts: int, repeat: int, threads: int
) -> dict:
    """In the trainer venv: one step per form (merged, tree) over the demo's files (see the module)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from sftree.dataset.trainer_labels import token_labels
    from sftree.dataset.tree_collator import collate
    from sftree.dataset.tree_loss import forward_loss, tree_loss

    torch.manual_seed(0)
    if threads:
        torch.set_num_threads(threads)
    d = Path(path)
    student = json.loads((d / "sft.stats.json").read_text())["student"]
    gguf = Path(tokenizer or student["tokenizer"]["file"])
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.chat_template = Path(template or student["template"]).read_text()
    merged, tree = demo_rows(d, parts)
    merged = [token_labels(r, tok) for r in merged]
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=65536, tie_word_embeddings=False,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).float()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    head = model.get_output_embeddings()

    def merged_loss(r: dict) -> torch.Tensor:
        ids = torch.tensor([r["input_ids"]])
        chain = {
            "input_ids": ids,
            "tree_parent": torch.arange(-1, ids.shape[1] - 1)[None],
            "tree_weight": torch.tensor([r["completion_mask"]], dtype=torch.float32),
        }
        out = model(input_ids=ids, logits_to_keep=1, output_hidden_states=True, use_cache=False)
        return tree_loss(out.hidden_states[-1], head, chain)

    steps = {"merged": (merged, merged_loss), "tree": (tree, lambda r: forward_loss(model, collate([r]))[0])}
    best: dict = {}
    for _ in range(repeat):
        for form, (rows, loss_of) in steps.items():
            peak_reset()
            start = resident()["VmRSS"]
            t0, c0 = time.perf_counter(), time.process_time()
            for r in rows:
                loss_of(r).backward()
            opt.step()
            opt.zero_grad()
            took = (time.perf_counter() - t0, time.process_time() - c0, resident()["VmHWM"] - start)
            best[form] = took if form not in best else tuple(map(min, best[form], took))
            print(form, [round(x, 2) for x in took], file=sys.stderr, flush=True)
    out = {}
    for form, (rows, _) in steps.items():
        lengths = [len(r["input_ids"]) for r in rows]
        trained = [r["completion_mask"] for r in rows] if form == "merged" else None
        out[form] = {
            "records": len(rows),
            "tokens_processed": sum(lengths),
            "longest": max(lengths),
            "tokens_trained": int(sum(map(sum, trained)))
            if trained
            else sum(sum(w > 0 for w in r["loss_weight"]) for r in rows),
            "loss_tokens": int(sum(map(sum, trained)))
            if trained
            else int(sum(sum(r["loss_weight"]) for r in rows)),
            "seconds": round(best[form][0], 2),
            "cpu_seconds": round(best[form][1], 2),
            "peak_mib": round(best[form][2], 1),
        }
    out["vocab"] = len(tok)
    return out


def demo_table(forms: dict) -> str:
    """The markdown table of the demo's step: each form's figures and the ratio tree / merged."""
    lines = [
        "| form | records (tree: lines) | longest | tokens processed | tokens trained | tokens in the loss "
        "| wall s | CPU s | peak MiB above the start |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    m, t = forms["merged"], forms["tree"]
    for form, f in (("merged", m), ("tree", t)):
        lines.append(
            f"| {form} | {f['records']} | {f['longest']:,} | {f['tokens_processed']:,} | {f['tokens_trained']:,} "
            f"| {f['loss_tokens']:,} | {f['seconds']:.1f} | {f['cpu_seconds']:.1f} | {f['peak_mib']:,.0f} |"
        )
    keys = (
        "longest",
        "tokens_processed",
        "tokens_trained",
        "loss_tokens",
        "seconds",
        "cpu_seconds",
        "peak_mib",
    )
    lines.append("| tree / merged | | " + " | ".join(f"{t[k] / m[k]:.2f}" for k in keys) + " |")
    return "\n".join(lines)


def table(forms: dict) -> str:
    """The markdown table of docs/benchmarks.md: each form's figures and its ratios to the tree form's."""
    tree = forms["tree"]
    lines = [
        "| form | records (tree: lines) | tokens processed | tokens in the loss | wall s | CPU s "
        "| tokens / tree's | wall / tree's | CPU / tree's |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for form, f in forms.items():
        lines.append(
            f"| {form} | {f['records']} | {f['tokens_processed']:,} | {f['loss_tokens']:,} | {f['seconds']:.1f} "
            f"| {f['cpu_seconds']:.1f} | {f['tokens_processed'] / tree['tokens_processed']:.2f} "
            f"| {f['seconds'] / tree['seconds']:.2f} | {f['cpu_seconds'] / tree['cpu_seconds']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", help="a results folder (default: the test fixture's tree)")
    ap.add_argument("--layers", type=int, default=30, help="SmolLM2's first N decoder layers (30: all)")
    ap.add_argument("--repeat", type=int, default=2, help="steps per form, the best kept")
    ap.add_argument("--threads", type=int, default=0, help="torch's threads (0: torch's default)")
    ap.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"), help="the attention of every form")
    ap.add_argument(
        "--demo", help="an export's folder (sft.jsonl, sft.tree.jsonl): merged against tree, this venv"
    )
    ap.add_argument("--tokenizer", help="--demo: the Student's tokenizer GGUF (default: sft.stats.json's)")
    ap.add_argument("--template", help="--demo: the Student's chat template (default: sft.stats.json's)")
    ap.add_argument(
        "--parts", type=int, default=0, help="--demo: the first N tree lines and their paths (0: all)"
    )
    ap.add_argument("--json")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.demo:
        report = {"demo": args.demo, "parts": args.parts, "repeat": args.repeat, "threads": args.threads}
        report["forms"] = demo(
            args.demo, args.tokenizer, args.template, args.parts, args.repeat, args.threads
        )
        print(json.dumps(report, indent=1))
        print(demo_table(report["forms"]))
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
        return
    if args.inner:
        cfg = json.loads(Path(args.inner).read_text())
        print(json.dumps(inner(cfg, args.layers, args.repeat, args.threads, args.attn)))
        return
    cache = Path(os.environ.get("SFTREE_CACHE") or os.path.expanduser("~/.cache/sftree")) / "trainer"
    py = cache / "venv" / "bin" / "python"
    if not py.is_file():
        sys.exit(f"{py} absent: run scripts/install_trainer.sh")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = export_forms(args.results, Path(tmp))
        (Path(tmp) / "cfg.json").write_text(json.dumps(cfg))
        env = dict(os.environ, PYTHONPATH=str(REPO / "src"), CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
        argv = [str(py), __file__, "--inner", str(Path(tmp) / "cfg.json"), "--layers", str(args.layers)]
        argv += ["--repeat", str(args.repeat), "--threads", str(args.threads), "--attn", args.attn]
        res = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True)  # its progress on stderr
        if res.returncode:
            sys.exit(f"the trainer venv's step failed ({res.returncode})")
    report = {"layers": args.layers, "repeat": args.repeat, "threads": args.threads, "attn": args.attn}
    report["forms"] = json.loads(res.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    print(table(report["forms"]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
