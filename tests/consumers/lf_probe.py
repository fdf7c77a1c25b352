"""Run inside .venv-consumers-lf: read an SFT file the way LLaMA-Factory does (its dataset_info.json parser, its
`openai` converter, `datasets` 4.0), then encode each record with its `qwen` template and supervised processor
with `mask_history: true`, and report the rendered text and which part of it carries labels.

Usage: python lf_probe.py DATASET_DIR OUT_JSON.

Only LLaMA-Factory's data modules are imported: its package `__init__`s pull in torch, so the packages are
created empty here and three modules that need torch or peft only for things text data never touches are
replaced: `peft.utils` (two file-name constants), `llamafactory.extras.misc` (hub switches: off) and
`llamafactory.data.mm_plugin` (the text-only plugin: messages and token ids pass through unchanged, which is
what its base plugin does without images, videos or audio).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def _package(name: str, path: Path) -> None:
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    sys.modules[name] = mod


def _module(name: str, **attrs) -> None:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod


class TextOnlyPlugin:
    def process_messages(self, messages, images, videos, audios, processor):
        return messages

    def process_token_ids(self, input_ids, labels, images, videos, audios, tokenizer, processor):
        return input_ids, labels


def load_llamafactory() -> None:
    import transformers.utils  # noqa: F401  (before the peft stand-in: transformers probes for peft at import)

    root = Path(importlib.util.find_spec("llamafactory").submodule_search_locations[0])
    for sub in ("", ".data", ".data.processor", ".extras", ".hparams"):
        _package("llamafactory" + sub, root / sub.replace(".", "/").lstrip("/"))
    _package("peft", root)
    _module(
        "peft.utils", SAFETENSORS_WEIGHTS_NAME="adapter_model.safetensors", WEIGHTS_NAME="adapter_model.bin"
    )
    _module("llamafactory.extras.misc", use_modelscope=lambda: False, use_openmind=lambda: False)
    _module("llamafactory.data.mm_plugin", get_mm_plugin=lambda *a, **k: TextOnlyPlugin())


def main(dataset_dir: str, out: str) -> None:
    load_llamafactory()
    import datasets
    from common import byte_tokenizer
    from llamafactory.data.converter import get_dataset_converter
    from llamafactory.data.parser import get_dataset_list
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.data.tool_utils import QwenToolUtils
    from llamafactory.extras.constants import IGNORE_INDEX
    from llamafactory.hparams.data_args import DataArguments

    (attr,) = get_dataset_list(["sftree"], dataset_dir)
    data_args = DataArguments(
        dataset_dir=dataset_dir, template="qwen", mask_history=True, cutoff_len=1_000_000
    )
    converter = get_dataset_converter(attr.formatting, attr, data_args)
    tok = byte_tokenizer()
    template = get_template_and_fix_tokenizer(tok, data_args)
    processor = SupervisedDatasetProcessor(
        template=template, tokenizer=tok, processor=None, data_args=data_args
    )
    ds = datasets.load_dataset("json", data_files=str(Path(dataset_dir) / attr.dataset_name), split="train")
    rows = []
    for row in ds:
        conv = converter(row)
        got = {
            "loaded": dict(row),
            "converted": {k: conv[k] for k in ("_prompt", "_response", "_system", "_tools")},
        }
        if conv["_response"]:
            ids, labels = processor._encode_data_example(
                conv["_prompt"], conv["_response"], conv["_system"], conv["_tools"], [], [], []
            )
            trained = [i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE_INDEX]
            # labelled tokens must form one span (the last turn), not pieces of several turns
            first = next((k for k, lab in enumerate(labels) if lab != IGNORE_INDEX), len(labels))
            got["trained_contiguous"] = all(
                lab != IGNORE_INDEX for lab in labels[first : first + len(trained)]
            )
            got["trained_text"] = tok.decode(trained)
            got["text"] = tok.decode(ids)  # the whole rendered record, history included
            calls = QwenToolUtils.tool_extractor(got["trained_text"].rsplit("<|im_end|>", 1)[0])
            got["trained_calls"] = (
                [{"name": c.name, "arguments": json.loads(c.arguments)} for c in calls]
                if isinstance(calls, list)
                else None
            )
        rows.append(got)
    versions = {"datasets": datasets.__version__, "llamafactory": importlib.metadata.version("llamafactory")}
    Path(out).write_text(json.dumps({"versions": versions, "rows": rows}))


if __name__ == "__main__":
    import importlib.metadata

    main(*sys.argv[1:3])
