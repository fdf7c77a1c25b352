"""Run inside the trainer venv (scripts/install_trainer.sh): the labels TRL's SFTTrainer gives sftree's exports, with
a tokenizer given as a `tokenizers` JSON file (no model weights: the labels are what is under test, so the model is
a tiny random Llama of the tokenizer's vocabulary size).

Usage: python sft_labels_probe.py CONFIG_JSON OUT_JSON, CONFIG = {"tokenizer_file", "bos_token", "eos_token",
"pad_token", "template", "forms": {FORM: JSONL}}. Per form (step: TRL's conversational prompt-completion records;
merged: `token_labels` rows with `completion_mask`, as sft_probe.py loads them), every prepared row's input_ids and
the labels the collator gives the model: OUT = {FORM: {"rows": [{"input_ids", "labels"}]}}.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
from datasets import load_dataset
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from sftree.dataset.trainer_labels import token_labels  # PYTHONPATH=src: standard library only


def dataset(form: str, path: str, tok):
    ds = load_dataset("json", data_files=path, split="train")
    if form == "step":  # TRL masks the completion itself
        return ds.select_columns(["prompt", "completion", "tools"])
    return ds.map(lambda r: token_labels(r, tok), remove_columns=ds.column_names)


def main(cfg_file: str, out_file: str) -> None:
    cfg = json.loads(open(cfg_file).read())
    torch.manual_seed(0)
    tok = PreTrainedTokenizerFast(
        tokenizer_file=cfg["tokenizer_file"], bos_token=cfg["bos_token"], eos_token=cfg["eos_token"]
    )
    tok.chat_template = open(cfg["template"]).read()
    small = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32768,
    )
    model = LlamaForCausalLM(small)
    result = {}
    for form, path in cfg["forms"].items():
        with tempfile.TemporaryDirectory() as out:
            args = SFTConfig(
                output_dir=out,
                report_to=[],
                use_cpu=True,
                bf16=False,
                completion_only_loss=True,
                max_length=None,  # never cut: the export already dropped what is too long
                pad_token=cfg["pad_token"],
                dataset_num_proc=None,
            )
            t = SFTTrainer(
                model=model, args=args, train_dataset=dataset(form, path, tok), processing_class=tok
            )
            rows = []
            for row in t.train_dataset:
                batch = t.data_collator([row])  # the labels the model is given
                rows.append({"input_ids": row["input_ids"], "labels": batch["labels"][0].tolist()})
        result[form] = {"rows": rows}
    with open(out_file, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(*sys.argv[1:3])
