#!/usr/bin/env python3
"""Wall time of one training step per form (step, merged, path, tree) on the small model, on CPU.

    PYTHONPATH=src python3 benchmarks/tree_train_time.py [--results results] [--layers 30] [--json OUT]

Exports the selected paths of `--results` (default: the test fixture's tree, tests/helpers/export.py) in each form
under SmolLM2-135M's tokenizer with Qwen2.5's template (as tests/test_tree_trainer.py), then, in the trainer venv
(scripts/install_trainer.sh), one training step per form over all of that form's records: every record (step,
merged, path: `token_labels` rows; tree: its lines through `tree_collator`) forward and backward one at a time on
SmolLM2-135M (its first `--layers` decoder layers, float32, eager attention, every parameter trained), then one
optimizer step; best of `--repeat`. The same trained tokens in every form: only what is processed differs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
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
            (out / "tree.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return {"model_dir": str(smol.parent), "gguf": smol.name, "template": str(template), "dir": str(out)}


def inner(cfg: dict, layers: int, repeat: int) -> dict:
    """In the trainer venv: one step per form (see the module)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sftree.dataset.trainer_labels import token_labels
    from sftree.dataset.tree_collator import collate, tree_loss

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(cfg["model_dir"], gguf_file=cfg["gguf"])
    tok.chat_template = open(cfg["template"]).read()
    model = AutoModelForCausalLM.from_pretrained(
        cfg["model_dir"], gguf_file=cfg["gguf"], dtype=torch.float32, attn_implementation="eager"
    )
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the step's cost, weights unchanged between forms
    out = {}
    for form in FORMS:
        rows = [json.loads(x) for x in open(os.path.join(cfg["dir"], f"{form}.jsonl"))]
        if form != "tree":
            rows = [token_labels(r, tok) for r in rows]
        tokens = sum(len(r["input_ids"]) for r in rows)
        best = None
        for _ in range(repeat):
            t0 = time.perf_counter()
            for r in rows:
                if form == "tree":
                    b = collate([r])
                    logits = model(
                        input_ids=b["input_ids"],
                        attention_mask=b["attention_mask"],
                        position_ids=b["position_ids"],
                    ).logits
                    loss = tree_loss(logits, b)
                else:
                    ids = torch.tensor([r["input_ids"]])
                    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
                    mask = torch.tensor(r["completion_mask"][1:], dtype=torch.float32)
                    loss = -(logp.gather(-1, ids[0, 1:, None])[:, 0] * mask).sum()
                loss.backward()
            opt.step()
            opt.zero_grad()
            took = time.perf_counter() - t0
            best = took if best is None else min(best, took)
        out[form] = {"records": len(rows), "tokens_processed": tokens, "seconds": round(best, 2)}
        print(form, out[form], file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", help="a results folder (default: the test fixture's tree)")
    ap.add_argument("--layers", type=int, default=30, help="SmolLM2's first N decoder layers (30: all)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        print(json.dumps(inner(json.loads(Path(args.inner).read_text()), args.layers, args.repeat)))
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
        res = subprocess.run([*argv, "--repeat", str(args.repeat)], env=env, capture_output=True, text=True)
        if res.returncode:
            sys.exit(res.stderr[-3000:])
    report = {"layers": args.layers, "forms": json.loads(res.stdout.strip().splitlines()[-1])}
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
