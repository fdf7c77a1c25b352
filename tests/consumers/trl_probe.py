"""Run inside .venv-consumers-trl: load an SFT file with `datasets`, render each record with TRL's own
`apply_chat_template` and tokenize it the way TRL's SFTTrainer does for prompt-completion data.

Usage: python trl_probe.py SFT_JSONL OUT_JSON. Writes, per record, what datasets gave back, the texts, and the
roles (and tool names) the chat template was given.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import datasets  # noqa: E402
import trl  # noqa: E402
from common import byte_tokenizer  # noqa: E402
from trl.data_utils import apply_chat_template, is_conversational  # noqa: E402


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# What the chat template is given, one line per message: its role and, for a tool result, the tool's name and the
# call it answers (rendered through TRL's own apply_chat_template, so this is what any template would receive).
ROLES_TEMPLATE = (
    "{%- for m in messages -%}{{ m.role }}{% if m.role == 'tool' %} {{ m.name }} {{ m.tool_call_id }}{% endif %}{{ '\\n' }}"
    "{% endfor -%}"
)


def main(src: str, out: str) -> None:
    tok = byte_tokenizer()
    roles_tok = byte_tokenizer()
    roles_tok.chat_template = ROLES_TEMPLATE
    ds = datasets.load_dataset("json", data_files=src, split="train")
    rows = []
    for row in ds:
        example = {k: row[k] for k in ("prompt", "completion", "messages") if k in row}
        tools = row.get("tools")
        texts = apply_chat_template(example, tok, tools=tools)
        got = {"loaded": {k: row[k] for k in ("prompt", "completion", "messages", "tools") if k in row}}
        got["conversational"] = is_conversational(example)
        got.update(texts)
        got["roles"] = apply_chat_template(example, roles_tok, tools=tools)
        if "prompt" in example:
            # SFTTrainer's tokenize_fn: prompt with the generation prompt, then prompt + completion; the completion
            # mask starts where the two token lists diverge.
            def ids(messages, tools=tools, **kw):
                text = tok.apply_chat_template(messages, tools=tools, tokenize=False, **kw)
                return tok(text, add_special_tokens=False)["input_ids"]

            prompt_ids = ids(example["prompt"], add_generation_prompt=True)
            full_ids = ids(example["prompt"] + example["completion"])
            n = common_prefix_length(prompt_ids, full_ids)
            got["prompt_is_prefix"] = n == len(prompt_ids)
            got["trained_text"] = tok.decode(full_ids[n:])
        rows.append(got)
    versions = {"datasets": datasets.__version__, "trl": trl.__version__}
    Path(out).write_text(json.dumps({"versions": versions, "rows": rows}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
