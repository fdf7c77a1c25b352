"""The Student as it renders chat messages (its tokenizer, compiled chat template and fit), its errors, and
where one trained message lies in its rendering (`text_span`, `Turn`).

What dataset/student.py (loading a Student, measuring a record) and dataset/pretokenize.py (a record as
tokens, data text as plain text) both stand on, so that neither imports the other: student.py tokenizes a
plain-data Student's turns with pretokenize, and pretokenize renders through the Student and its spans here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sftree.dataset import fit as fitting
from sftree.errors import InputError

if TYPE_CHECKING:  # imported where used at run time (dataset/student.py), to keep this module's import light
    from jinja2 import Template
    from tokenizers import Tokenizer

    from sftree.records.sft import Message


class StudentError(InputError):
    """The Student cannot be read, or its template cannot render what a record trains."""


class Unfit(StudentError):
    """One record the Student's template cannot hold, with its `reason` (counted): excluded, unless
    `export.student.fit: strict`, where it refuses the export as any StudentError does."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Student:
    """A tokenizer, a chat template and a context length; `source` and `template_name` name them in errors."""

    source: str
    template_name: str
    template: Template  # compiled in transformers' environment (student.compile_template)
    tokenizer: Tokenizer
    max_length: int
    bos_token: str = ""
    eos_token: str = ""
    # `export.special_text: split`: data text tokenized as plain text (dataset/pretokenize.py), so the figures
    # are those of the pre-tokenized rows; otherwise the rendered text is tokenized whole, as a trainer does
    plain_data: bool = False
    kind: str = (
        ""  # where the tokenizer came from: `tokenizer.json` (an HF folder) or `gguf` (tokenizer.ggml.*)
    )
    tokenizer_sha256: str = ""  # of the tokenizer as sftree reads it (`tokenizers` JSON): names it exactly
    fit: fitting.Fit = fitting.Fit()  # the adaptations the template needs (dataset/fit.py), probed at load
    strict: bool = False  # `export.student.fit: strict`: a record the template cannot hold refuses the export
    generation: bool = False  # the template marks the trained text with `{% generation %}`

    def render(self, messages: list[Message], tools: list[Message] | None, generation: bool) -> str:
        return self.render_spans(messages, tools, generation)[0]

    def render_spans(
        self, messages: list[Message], tools: list[Message] | None, generation: bool
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendering of `messages` fitted to the template, and its `{% generation %}` spans (character
        offsets, as transformers' `return_assistant_tokens_mask` tracks them; none when the template has
        none)."""
        fitted = self.fit.apply(messages)[0]
        kwargs: dict[str, object] = dict(
            messages=fitted,
            tools=tools or None,
            add_generation_prompt=generation,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        try:
            if not self.generation:
                return self.template.render(**kwargs), []
            blocks: list[str] = []
            spans: list[tuple[int, int]] = []
            # `activate_tracker` is the generation tracker's (student._generation_tracker), set on the
            # environment by Environment.extend: an attribute jinja2's types cannot know
            environment: Any = self.template.environment
            with environment.activate_tracker(blocks, spans):
                for block in self.template.generate(**kwargs):
                    blocks.append(block)
            return "".join(blocks), spans
        except Exception as exc:  # a template's raise_exception, a sandbox refusal, or an error inside it
            raise Unfit(f"chat template {self.template_name}: {exc}", "template_error") from exc

    def count(self, text: str) -> int:
        # The rendered text already holds the template's special tokens (apply_chat_template tokenizes it so).
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def describe(self) -> dict[str, str | int]:
        return {"source": self.source, "template": self.template_name, "max_length": self.max_length}

    def tokenizer_info(self) -> dict[str, str]:
        """The tokenizer the figures come from: file, kind, hash (the card names it)."""
        return {"file": self.source, "kind": self.kind, "sha256": self.tokenizer_sha256}


# How much longer than the whole's the prompt's own last-turn form may be (a think prefix, an opened reasoning
# block, a turn header written differently): beyond it, the two differ in more than the last turn's form.
LAST_TURN_FORM = 256


@dataclass(frozen=True)
class Span:
    """One trained message in the text: `whole` (context + message rendered), `start` (the trained text begins
    there: the end of the prompt), `end` (it ends there)."""

    whole: str
    start: int
    end: int

    @property
    def prompt(self) -> str:
        return self.whole[: self.start]

    @property
    def text(self) -> str:
        return self.whole[self.start : self.end]


def text_span(
    student: Student, before: list[Message], message: Message, tools: list[Message], rid: str
) -> Span:
    """Where the trained text of `message` after `before` lies in their rendering:
    - a template with `{% generation %}`: the last generation span of the whole (as transformers marks it);
    - else TRL's split: the context rendered with the generation prompt is the start of the whole, and what
      the message adds is trained;
    - else, where the two differ only by the template's last-turn form (the generation prompt opens a
      reasoning block or a think prefix the history form does not hold; at most LAST_TURN_FORM characters of
      it), the whole's own tokens from where the two part;
    - else Unfit `span_undefined`."""
    whole, spans = student.render_spans([*before, message], tools, generation=False)
    if student.generation and spans:
        return Span(whole, *spans[-1])
    prompt = student.render(before, tools, generation=True)
    if whole.startswith(prompt):
        return Span(whole, len(prompt), len(whole))
    start = _last_turn_start(student, before, tools, prompt, whole) if not student.strict else None
    if start is not None:
        return Span(whole, start, len(whole))
    raise Unfit(
        f"chat template {student.template_name}: record {rid}: the prompt rendered with the generation "
        "prompt is not the start of the prompt and completion rendered together, and they differ in more "
        "than the last turn's form, so the trained tokens are not defined",
        "span_undefined",
    )


def _last_turn_start(
    student: Student, before: list[Message], tools: list[Message], prompt: str, whole: str
) -> int | None:
    """Where the trained message's own text starts in `whole` when the prompt (`before` with the generation
    prompt) is not its start but differs only in the last turn's form, else None. Two forms: the generation
    prompt opens more than the whole holds (a think prefix: the message starts where the two part), or the
    last context message ends differently when it is last (a turn end written only before another turn: the
    message starts after the generation prompt's text, found in the whole within LAST_TURN_FORM
    characters)."""
    if not before:
        return None
    context = student.render(before, tools, generation=False)
    parted = len(os.path.commonprefix([prompt, whole]))
    if not prompt.startswith(context) or len(context) - parted > LAST_TURN_FORM:
        return None
    header = prompt[len(context) :]
    if parted >= len(context) or not header.strip():  # within the generation prompt (or one always rendered)
        return parted if len(prompt) - parted <= LAST_TURN_FORM else None
    found = whole.find(header, parted)
    return found + len(header) if 0 <= found - parted <= LAST_TURN_FORM else None


@dataclass
class Turn:
    """One trained assistant message under the Student: the token ids of its context rendered with the
    generation prompt and of context + message; its trained tokens are `whole[start:]`, where `start` is where
    the two first differ (TRL's rule: the completion starts where the tokenized prompt and prompt + completion
    diverge)."""

    prompt: list[int]
    whole: list[int]
    stop: int | None = None  # the trained tokens end here (a `{% generation %}` span); None: at the end

    @property
    def start(self) -> int:
        return len(os.path.commonprefix([self.prompt, self.whole]))

    @property
    def trained(self) -> int:
        return (len(self.whole) if self.stop is None else self.stop) - self.start
