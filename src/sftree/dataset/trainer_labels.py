"""The tokens a trainer trains for an sftree record, with the trainer's own tokenizer (standard library only: import
it where the trainer runs, or copy this file).

`token_labels(record, tokenizer)` returns `{"input_ids", "completion_mask"}`: the whole record rendered with the
tokenizer's chat template, and 1 on exactly the trained tokens. Each trained assistant message k is marked by TRL's
prompt-completion rule: render messages[:k] with the generation prompt and messages[:k+1] without; its tokens
start where the two diverge and end with the latter. Trained messages: a step record's `completion`, a merged
record's `metadata.trained`, every assistant message of a path record. TRL's SFTTrainer takes such rows as a
pre-tokenized dataset (`completion_mask` becomes its labels); LLaMA-Factory takes them as `labels` through its
`tokenized_path` (docs/outputs.md, "Training").

A record whose messages[:k+1] the template renders differently once later messages follow (one that rewrites earlier
turns) raises ValueError: that message's context would differ from the one it was trained in. The export cuts runs
there when `export.student` names this Student; without it, only the messages were compared.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Protocol

Record = dict[str, Any]  # a JSON line of an sftree SFT file, as the trainer's dataset holds it
Message = dict[str, Any]


class ChatTokenizer(Protocol):
    """What is used of a transformers tokenizer: its chat template, and its tokenizing call."""

    def apply_chat_template(
        self,
        conversation: list[Message],
        *,
        tools: list[Message] | None,
        tokenize: bool,
        add_generation_prompt: bool,
    ) -> str: ...

    def __call__(self, text: str, *, add_special_tokens: bool) -> Mapping[str, list[int]]: ...


def trained_indices(record: Record) -> tuple[list[Message], list[int]]:
    """(all the record's messages, the indices of those trained)."""
    if "prompt" in record:
        return [*record["prompt"], *record["completion"]], [len(record["prompt"])]
    messages = record["messages"]
    meta = record.get("metadata") or {}
    if meta.get("granularity") == "merged":
        return messages, list(meta["trained"])
    return messages, [i for i, m in enumerate(messages) if m["role"] == "assistant"]


def token_labels(record: Record, tokenizer: ChatTokenizer) -> dict[str, list[int]]:
    """`input_ids` of the whole rendered record and `completion_mask` (1: trained) under `tokenizer` (a transformers
    tokenizer with a chat template)."""
    tools = record.get("tools")
    tools = json.loads(tools) if isinstance(tools, str) else tools

    def ids(messages: list[Message], generation: bool) -> list[int]:
        text = tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    messages, trained = trained_indices(record)
    full = ids(messages, False)
    mask = [0] * len(full)
    for k in trained:
        prompt, whole = ids(messages[:k], True), ids(messages[: k + 1], False)
        if full[: len(whole)] != whole:
            rid = (record.get("metadata") or {}).get("id", "?")
            raise ValueError(
                f"record {rid}: the chat template renders message {k} and its context differently once later "
                "messages follow, so it would be trained in a context it was not in; export with export.student "
                "set to this Student (the merged form is then cut there) or use the step form"
            )
        for i in range(len(os.path.commonprefix([prompt, whole])), len(whole)):
            mask[i] = 1
    return {"input_ids": full, "completion_mask": mask}


IGNORE_INDEX = -100  # the label of a token left out of the loss (transformers, TRL, LLaMA-Factory)


def label_row(record: Record, tokenizer: ChatTokenizer) -> dict[str, list[int]]:
    """`token_labels` as a trainer's tokenized row: `input_ids`, `attention_mask`, `labels` (IGNORE_INDEX off the
    trained tokens): what LLaMA-Factory reads from its `tokenized_path`."""
    out = token_labels(record, tokenizer)
    ids = out["input_ids"]
    labels = [t if m else IGNORE_INDEX for t, m in zip(ids, out["completion_mask"], strict=True)]
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}
