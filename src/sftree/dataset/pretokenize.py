"""A record as the Student's tokens: `pretokenize(student, record) -> Pretokenized(input_ids, mask)`.

The template's own scaffolding (role headers, turn ends, `<tool_call>` around a call) is tokenized as the Student's
tokenizer tokenizes it; every string that comes from the data (message content, reasoning, names, tool-call
arguments, tool schemas) is tokenized as plain text: a control-token string inside it (`<|im_end|>` in a file the
Teacher read) becomes the ordinary tokens of its characters, never the control token (`export.special_text:
split`, dataset/special_text.py). For a record whose data holds no such string the ids are exactly those of the
rendered text tokenized whole (what `apply_chat_template` + the tokenizer give).

How: every occurrence of a special or added token's text inside a data string is replaced by one private-use
character (U+F0000 + its index) before rendering; after rendering, what is left of the special strings is the
template's own and is split out as its token; the rest, the private-use characters restored, is encoded by the
same tokenizer without its added tokens. The rendering with the characters restored must equal the plain
rendering (a template that escapes or rewrites the data otherwise: StudentError).

`mask` marks the trained tokens by TRL's prompt-completion rule, per trained message k (`trainer_labels.
trained_indices`: a step record's completion, a merged record's `metadata.trained`, every assistant message of a
path record): render messages[:k] with the generation prompt and messages[:k+1] without; the tokens after their
common prefix, up to the end of the latter, are trained (or the template's `{% generation %}` span, or the last
turn's own form: `rendering.text_span`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

from sftree.dataset.rendering import Student, StudentError, Turn, text_span
from sftree.dataset.trainer_labels import trained_indices

if TYPE_CHECKING:  # imported where used, to keep this module's import light
    from tokenizers import Tokenizer

    from sftree.records.sft import Message
    from sftree.records.tree import SchemaDoc

_BASE = 0xF0000  # Supplementary Private Use Area-A: one character per special string
_LIMIT = 0xFFFFD


@dataclass(frozen=True)
class Pretokenized:
    input_ids: list[int]
    mask: list[int]  # 1 on each trained token, 0 elsewhere; len(mask) == len(input_ids)

    @property
    def trained(self) -> int:
        return sum(self.mask)

    def row(self) -> dict[str, list[int]]:
        """The pre-tokenized columns TRL's SFTTrainer reads as they are (`completion_mask`: the trained tokens)."""
        return {"input_ids": list(self.input_ids), "completion_mask": list(self.mask)}


class _Plain:
    """One Student's special strings, their ids, and its tokenizer without added tokens (data as plain text)."""

    def __init__(self, tokenizer: Tokenizer):
        from tokenizers import Tokenizer

        added = tokenizer.get_added_tokens_decoder()
        self.ids = {t.content: i for i, t in sorted(added.items()) if t.content}
        self.strings = sorted(self.ids, key=lambda s: (-len(s), s))  # leftmost-longest, as tokenizers matches
        if _BASE + len(self.strings) > _LIMIT:
            raise StudentError(
                f"the Student's tokenizer has {len(self.strings)} added tokens: too many to mark"
            )
        self.mark = {s: chr(_BASE + i) for i, s in enumerate(self.strings)}
        self.restore = {ord(c): s for s, c in self.mark.items()}
        self.find: re.Pattern[str] | None = (
            re.compile("|".join(map(re.escape, self.strings))) if self.strings else None
        )
        doc = json.loads(tokenizer.to_str())
        doc["added_tokens"] = []
        self.tokenizer = Tokenizer.from_str(json.dumps(doc))
        self.source = tokenizer  # kept alive: the cache is keyed by its id

    def plain(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids if text else []

    @overload
    def marked(self, value: list[Message]) -> list[Message]: ...
    @overload
    def marked(self, value: Message) -> Message: ...
    @overload
    def marked(self, value: object) -> object: ...

    def marked(self, value: object) -> object:
        """`value` (a message, a tool schema) with every special string in its strings replaced by its mark."""
        if isinstance(value, str):
            if any(_BASE <= ord(c) <= _LIMIT for c in value):
                raise StudentError(
                    "a record's text holds characters of U+F0000..U+FFFFD, which pretokenize uses"
                )
            return self.find.sub(lambda m: self.mark[m.group()], value) if self.find else value
        if isinstance(value, dict):
            return {self.marked(k): (v if k == "role" else self.marked(v)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.marked(v) for v in value]
        return value

    def encode(self, text: str) -> list[int]:
        """Rendered text with marks: the template's special strings as their tokens, the rest as plain text."""
        out: list[int] = []
        pos = 0
        for m in self.find.finditer(text) if self.find else ():
            out += self.plain(text[pos : m.start()].translate(self.restore))
            out.append(self.ids[m.group()])
            pos = m.end()
        return out + self.plain(text[pos:].translate(self.restore))


_cache: dict[int, _Plain] = {}


def _plain_of(student: Student) -> _Plain:
    key = id(student.tokenizer)
    if key not in _cache:
        _cache[key] = _Plain(student.tokenizer)
    return _cache[key]


def encode_messages(
    student: Student, messages: list[Message], tools: list[Message] | None, generation: bool
) -> list[int]:
    """The token ids of `messages` rendered with the Student's template, data text as plain text (the module)."""
    p = _plain_of(student)
    marked_messages, marked_tools = p.marked(messages), p.marked(tools or [])
    text = student.render(marked_messages, marked_tools, generation)
    if marked_messages != messages or marked_tools != (tools or []):
        if text.translate(p.restore) != student.render(messages, tools, generation):
            raise StudentError(
                f"chat template {student.template_name}: the data text does not render as it is (the template "
                "escapes or rewrites it), so its special-token text cannot be tokenized as plain text"
            )
    return p.encode(text)


def encode_span(
    student: Student, before: list[Message], message: Message, tools: list[Message], rid: str
) -> Turn:
    """One trained message's Turn (rendering.text_span) in tokens, data text tokenized as plain text."""
    p = _plain_of(student)
    marked_before, marked_tools = p.marked(before), p.marked(tools or [])
    span = text_span(student, marked_before, p.marked(message), marked_tools, rid)
    whole = p.encode(span.whole)
    if span.end != len(span.whole):
        return Turn(p.encode(span.prompt), whole, len(p.encode(span.whole[: span.end])))
    return Turn(p.encode(span.prompt), whole)


def trained_spans(student: Student, record: SchemaDoc) -> tuple[list[int], list[tuple[int, int]]]:
    """`record` (any sftree form: step, path, merged) as the Student's ids, data text tokenized as plain text, and
    each trained message's tokens as `(start, end)` in them, in message order. A StudentError when a trained
    message's context renders differently once later messages follow (its trained span would not be the one of
    its own step)."""
    messages, trained = trained_indices(record)
    tools = record.get("tools") or []
    full = encode_messages(student, messages, tools, generation=False)
    rid = (record.get("metadata") or {}).get("id", "?")
    spans: list[tuple[int, int]] = []
    for k in trained:
        turn = encode_span(student, messages[:k], messages[k], tools, rid)
        if full[: len(turn.whole)] != turn.whole:
            raise StudentError(
                f"chat template {student.template_name}: record {rid}: message {k} and its context render "
                "differently once later messages follow"
            )
        spans.append((turn.start, turn.start + turn.trained))
    return full, spans


def pretokenize(student: Student, record: SchemaDoc) -> Pretokenized:
    """`record` (any sftree form: step, path, merged) as the Student's `input_ids` and trained-token `mask`, data
    text tokenized as plain text (`trained_spans`)."""
    full, spans = trained_spans(student, record)
    mask = [0] * len(full)
    for start, end in spans:
        for i in range(start, end):
            mask[i] = 1
    return Pretokenized(full, mask)
