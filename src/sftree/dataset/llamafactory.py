"""The LLaMA-Factory form of the merged dataset: `sft_llamafactory.jsonl` (each record reshaped for its `openai`
converter without loss: `llamafactory_record`) and its `dataset_info.json` entry (`dataset_info`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sftree.records.sft import Message, SftRecord

DATASET_NAME = "sftree"
LLAMAFACTORY_TAGS = {
    "role_tag": "role",
    "content_tag": "content",
    "user_tag": "user",
    "assistant_tag": "assistant",
    "observation_tag": "tool",
    "function_tag": "function_call",
    "system_tag": "system",
}
THINK_WORDS = ("<think>\n", "\n</think>\n\n")  # LLaMA-Factory's default thought words (qwen3 and others)
TOOL_CALL_WORDS = ("<tool_call>", "</tool_call>")  # its default tool-call words
# How its `openai` converter joins consecutive tool results into one observation (whatever the template).
TOOL_RESPONSE_WORDS = ("<tool_response>\n", "\n</tool_response>")


def _lf_assistant(m: Message) -> dict[str, str]:
    """An assistant message as one LLaMA-Factory turn whose content keeps the text beside the calls.

    Its `openai` converter would replace the content of a message with `tool_calls` by the calls alone, so calls
    are written the way its FunctionFormatter reads them back: `[thought]text<tool_call>[calls]</tool_call>`,
    role `function_call`. The calls' JSON sits inside a string, so Arrow never unifies `arguments` across tools.
    """
    text = m["content"]
    if m.get("reasoning_content"):
        text = f"{THINK_WORDS[0]}{m['reasoning_content']}{THINK_WORDS[1]}{text}"
    if not m.get("tool_calls"):
        return {"role": "assistant", "content": text}
    calls = [
        {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]} for tc in m["tool_calls"]
    ]
    body = json.dumps(calls, ensure_ascii=False)
    return {"role": "function_call", "content": f"{text}{TOOL_CALL_WORDS[0]}{body}{TOOL_CALL_WORDS[1]}"}


def llamafactory_record(rec: SftRecord) -> dict[str, object]:
    """A record in the shape LLaMA-Factory's `openai` converter takes without loss.

    Its converter requires strictly alternating turns (user or observation, then assistant or function), so the
    OpenCode order `tool` -> `user` (a rollout turn ends on the tool results of its `coral eval`, the next turn's
    prompt follows) has no place in it: an observation cannot be followed by a user turn. **Choice**: the prompt
    keeps its role: the tool results that end a rollout turn move into the user turn that follows, ahead of the
    prompt, each wrapped as LLaMA-Factory's converter wraps observations (`<tool_response>\n...\n</tool_response>`,
    joined by a newline), then a blank line, then the prompt. With the `qwen` templates the text differs from what
    the Student sees under OpenCode only in `</tool_response><|im_end|>\n<|im_start|>user\n` becoming
    `</tool_response>\n\n` at each such boundary (docs/outputs.md; tests/test_export_consumers.py checks it).

    - trailing tool results are dropped (LLaMA-Factory drops them too), so the record ends on the trained turn;
    - `tools` is a JSON string (its converter accepts one), so tool schemas are not unified across records;
    - a tool message keeps only `role` and `content`: the converter reads nothing else of it (no `name`).
    """
    out: list[dict[str, str]] = []
    for m in rec.messages:
        if m["role"] == "user" and out and out[-1]["role"] == "tool":
            results = []
            while out and out[-1]["role"] == "tool":
                results.insert(0, out.pop()["content"])
            moved = "\n".join(f"{TOOL_RESPONSE_WORDS[0]}{r}{TOOL_RESPONSE_WORDS[1]}" for r in results)
            out.append({"role": "user", "content": f"{moved}\n\n{m['content']}"})
        elif m["role"] == "assistant":
            out.append(_lf_assistant(m))
        else:
            out.append({"role": m["role"], "content": m["content"]})
    while out and out[-1]["role"] == "tool":
        out.pop()
    return {
        "messages": out,
        "tools": json.dumps(list(rec.tools), ensure_ascii=False),
        "id": rec.metadata.id,
    }


def turn_boundaries(rec: SftRecord) -> int:
    """How many times a user message follows a tool message in the record (the layout LLaMA-Factory cannot
    keep: `llamafactory_record`)."""
    msgs = rec.messages
    return sum(a["role"] == "tool" and b["role"] == "user" for a, b in zip(msgs, msgs[1:], strict=False))


def dataset_info(sft_file: str | Path, info_file: str | Path) -> dict:
    """LLaMA-Factory `dataset_info.json` entry for the merged file (file_name relative to the info file)."""
    rel = os.path.relpath(Path(sft_file).resolve(), Path(info_file).resolve().parent)
    return {
        DATASET_NAME: {
            "file_name": rel,
            "formatting": "openai",
            "columns": {"messages": "messages", "tools": "tools"},
            "tags": dict(LLAMAFACTORY_TAGS),
        }
    }
