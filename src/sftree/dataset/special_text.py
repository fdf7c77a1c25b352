"""Control-token text in the data (`export.special_text`): one rule for every string the chat template renders from
a record.

A tool output (a file the Teacher reads, a program's print, a grader's message), a user prompt, a system prompt, a
tool schema, a tool call's arguments or the Teacher's own text may hold the text of a control token
(`<|im_end|>\n<|im_start|>assistant`). Rendered and tokenized as a whole, that text becomes the token itself: a turn
boundary and a turn nobody wrote, in the context of every later step. The agent controls such text (it writes the
files it reads), so it could put words in the Student's mouth.

The strings looked for are the Student's own special and added tokens when `export.student` is set (exactly what
its tokenizer would turn into one token), else `BUILTIN`: the control strings of the common chat families. A record
holding one is, by `export.special_text`:
- `drop` (default): left out, counted by role and string;
- `split`: kept, tokenized with the data text as plain text (`dataset/pretokenize.py`: only in the pre-tokenized
  output, where sftree fixes the tokens; needs a Student);
- `keep`: kept as is (the card warns: a trainer that renders and tokenizes it makes the control tokens).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sftree.records.sft import Message
from sftree.records.tree import SchemaDoc

MODES = ("drop", "split", "keep")

# Control strings of the common chat families, for an export without a Student (the Student's tokenizer is then
# unknown). Whole-token strings only: a tokenizer turns exactly these into one control token.
BUILTIN: dict[str, tuple[str, ...]] = {
    "chatml/qwen": (
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_sep|>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
        "<|vision_start|>",
        "<|vision_end|>",
    ),
    "llama3": (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|python_tag|>",
        "<|finetune_right_pad_id|>",
    ),
    "gemma": ("<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>"),
    "mistral": (
        "[INST]",
        "[/INST]",
        "[TOOL_CALLS]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
        "[SYSTEM_PROMPT]",
        "[/SYSTEM_PROMPT]",
        "<s>",
        "</s>",
    ),
    "deepseek": (
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        "<｜User｜>",
        "<｜Assistant｜>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁outputs▁begin｜>",
        "<｜tool▁outputs▁end｜>",
        "<｜tool▁output▁begin｜>",
        "<｜tool▁output▁end｜>",
    ),
    "phi": ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|tool_call|>"),
}


def builtin_strings() -> tuple[str, ...]:
    return tuple(dict.fromkeys(s for family in BUILTIN.values() for s in family))


def student_strings(tokenizer: Any) -> tuple[str, ...]:
    """Every special or added token of a `tokenizers.Tokenizer`: the text it turns into one token wherever it
    occurs."""
    return tuple(sorted({t.content for t in tokenizer.get_added_tokens_decoder().values() if t.content}))


class SpecialText:
    """The strings looked for, and one scan of a record's rendered data for them."""

    def __init__(self, strings: tuple[str, ...], source: str):
        self.strings = tuple(sorted(set(strings), key=lambda s: (-len(s), s)))  # longest first, as matched
        self.source = source  # "student" or "builtin"
        self.pattern = re.compile("|".join(map(re.escape, self.strings))) if self.strings else None

    def find(self, text: str) -> list[str]:
        return self.pattern.findall(text) if self.pattern and text else []

    def hits(self, rec: SchemaDoc, cache: dict[str, list[str]] | None = None) -> Counter[tuple[str, str]]:
        """(role, string) -> occurrences in the record's data (`data_strings`). `cache`: what was found per string
        (a session's messages repeat in every later record of it)."""
        out: Counter[tuple[str, str]] = Counter()
        for role, text in data_strings(rec):
            if cache is None:
                found = self.find(text)
            elif text in cache:
                found = cache[text]
            else:
                found = cache[text] = self.find(text)
            for s in found:
                out[(role, s)] += 1
        return out


def _strings(value: Any) -> Iterator[str]:
    """Every string of a JSON value, keys included (a tool schema's or arguments' keys are rendered too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def record_messages(rec: SchemaDoc) -> list[Message]:
    return rec["messages"] if "messages" in rec else [*rec.get("prompt", []), *rec.get("completion", [])]


def data_strings(rec: SchemaDoc) -> Iterator[tuple[str, str]]:
    """(role, text) of every string the template renders from the record: each message's content, reasoning,
    name and tool calls (name, arguments' keys and values), and the tool schemas (role `tools`)."""
    for m in record_messages(rec):
        role = str(m.get("role") or "?")
        for key, value in m.items():
            if key not in ("role", "tool_call_id"):
                for s in _strings(value if key != "tool_calls" else _calls(value)):
                    yield role, s
    for s in _strings(rec.get("tools") or []):
        yield "tools", s


def _calls(calls: Any) -> Any:
    """Tool calls without their ids (an id is the proxy's, never rendered as text by a ChatML template)."""
    if not isinstance(calls, list):
        return calls
    return [c.get("function") if isinstance(c, dict) else c for c in calls]


@dataclass
class SpecialTextStats:
    """Records holding control-token text, by mode, role and string (`sft.stats.json` `special_text`)."""

    mode: str = "drop"
    source: str = "builtin"
    records: int = 0  # records (a merged record: steps) holding such text
    roles: Counter[str] = field(default_factory=Counter)  # records by the role the text was found in
    strings: Counter[str] = field(default_factory=Counter)  # occurrences by string

    def count(self, hits: Counter[tuple[str, str]]) -> None:
        self.records += 1
        for role in {r for r, _ in hits}:
            self.roles[role] += 1
        for (_, s), n in hits.items():
            self.strings[s] += n

    def to_dict(self) -> SchemaDoc:
        return {
            "mode": self.mode,
            "source": self.source,
            "records": self.records,
            "roles": dict(sorted(self.roles.items())),
            "strings": dict(sorted(self.strings.items())),
        }

    @classmethod
    def from_dict(cls, d: object) -> SpecialTextStats | None:
        if not isinstance(d, dict):
            return None
        return cls(
            str(d.get("mode") or "drop"),
            str(d.get("source") or "builtin"),
            int(d.get("records") or 0),
            Counter(d.get("roles") or {}),
            Counter(d.get("strings") or {}),
        )

    def add(self, other: SpecialTextStats | None) -> None:
        if other is None:
            return
        self.records += other.records
        self.roles.update(other.roles)
        self.strings.update(other.strings)
        if other.mode != self.mode:
            self.mode = f"{self.mode}+{other.mode}"
        if other.source != self.source:
            self.source = f"{self.source}+{other.source}"
