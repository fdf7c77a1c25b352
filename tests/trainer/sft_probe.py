"""Run inside the trainer venv (scripts/install_trainer.sh): TRL's SFTTrainer on sftree's exports, on CPU.

Usage: python sft_probe.py CONFIG_JSON OUT_JSON, CONFIG = {"model_dir", "gguf", "template", "forms": {FORM: JSONL},
"train": N, "steps": S, "lr": LR, "loaders": [{"model_dir", "gguf", "tokens"}]}. Per form: the dataset as the docs
load it (step: TRL's conversational prompt-completion records; merged: `token_labels` rows with `completion_mask`;
pretokenized: sftree's own `input_ids` and `completion_mask`), every prepared row's input_ids and
the labels the collator gives the model; then S training steps on the N shortest records (one batch, repeated), run
RUNS[FORM] times from the same weights (`"runs": {FORM: 0, 1 or 2}`): the losses of each run. `loaders`: which of
sftree's added tokens transformers' GGUF loader splits (the known difference between the two tokenizers).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
import time

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from sftree.dataset.trainer_labels import token_labels  # PYTHONPATH=src: standard library only


def dataset(form: str, path: str, tok):
    ds = load_dataset("json", data_files=path, split="train")
    if form == "step":  # TRL masks the completion itself
        return ds.select_columns(["prompt", "completion", "tools"])
    if form == "pretokenized":  # sftree's own ids and mask (export.pretokenized): TRL reads them as they are
        return ds.select_columns(["input_ids", "completion_mask"])
    return ds.map(lambda r: token_labels(r, tok), remove_columns=ds.column_names)


def last_layer_only(model):
    """Train the last decoder layer and the final norm alone: the labels are what is under test, and on 2 CPU cores
    a backward through the whole model costs several times more."""
    for p in model.parameters():
        p.requires_grad_(False)
    for p in [*model.model.layers[-1].parameters(), *model.model.norm.parameters()]:
        p.requires_grad_(True)
    return model


def trainer(model, tok, ds, cfg: dict, out: str) -> SFTTrainer:
    args = SFTConfig(
        output_dir=out,
        max_steps=cfg["steps"],
        per_device_train_batch_size=cfg["train"],
        learning_rate=cfg["lr"],
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        data_seed=0,
        use_cpu=True,
        bf16=False,  # TRL's default on CPU autocasts to bfloat16, whose matmuls fall back to a slow loop without AMX
        gradient_checkpointing=False,  # TRL's default recomputes the whole model in every backward
        dataloader_num_workers=0,
        completion_only_loss=True,
        max_length=None,  # never cut: the export already dropped what is too long
        pad_token="<|endoftext|>",
        dataset_num_proc=None,
    )
    return SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)


def shortest(rows: list[dict], n: int) -> list[int]:
    """The indices of the `n` shortest prepared rows: what is trained only has to show that the loss falls and that
    two runs agree, and on 2 CPU cores a step's time grows with the batch's tokens."""
    return sorted(sorted(range(len(rows)), key=lambda i: (len(rows[i]["input_ids"]), i))[:n])


def loaders(checks: list[dict]) -> list[dict]:
    """How transformers' GGUF loader tokenizes each of sftree's added tokens (`{"model_dir", "gguf", "tokens"}`):
    a token it does not keep whole is split, and every count that holds it differs from sftree's."""
    out = []
    for check in checks:
        tok = AutoTokenizer.from_pretrained(check["model_dir"], gguf_file=check["gguf"])
        ids = {t: tok(t, add_special_tokens=False)["input_ids"] for t in check["tokens"]}
        out.append({"gguf": check["gguf"], "split": sorted(t for t, i in ids.items() if len(i) != 1)})
    return out


def main(cfg_file: str, out_file: str) -> None:
    cfg = json.loads(open(cfg_file).read())
    t0 = time.time()

    def note(what: str) -> None:  # where the time goes (the test prints it when it fails)
        print(f"{time.time() - t0:7.1f}s {what}", file=sys.stderr, flush=True)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(2)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(cfg["model_dir"], gguf_file=cfg["gguf"])
    tok.chat_template = open(cfg["template"]).read()
    base = AutoModelForCausalLM.from_pretrained(cfg["model_dir"], gguf_file=cfg["gguf"], dtype=torch.float32)
    note("model loaded")
    result = {}
    for form, path in cfg["forms"].items():
        ds = dataset(form, path, tok)
        with tempfile.TemporaryDirectory() as out:
            t = trainer(copy.deepcopy(base), tok, ds, cfg, out)
            rows = []
            for row in t.train_dataset:
                batch = t.data_collator([row])  # the labels the model is given
                rows.append({"input_ids": row["input_ids"], "labels": batch["labels"][0].tolist()})
            note(f"{form}: {len(rows)} rows prepared")
            losses = []
            for _ in range(cfg["runs"].get(form, 1)):  # two runs from the same weights: the same losses
                torch.manual_seed(0)
                model = last_layer_only(copy.deepcopy(base))
                t = trainer(model, tok, ds.select(shortest(rows, cfg["train"])), cfg, out)
                t.train()
                losses.append([h["loss"] for h in t.state.log_history if "loss" in h])
                note(f"{form}: trained {losses[-1]}")
        result[form] = {"rows": rows, "losses": losses}
    result["loaders"] = loaders(cfg.get("loaders") or [])
    with open(out_file, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(*sys.argv[1:3])
