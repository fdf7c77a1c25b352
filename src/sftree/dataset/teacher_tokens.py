"""The same-tokenizer export (`export.teacher_tokens`): a pre-tokenized record trains the Teacher's own sampled ids,
with their log-probabilities and top-K, where its Student shares the Teacher's vocabulary (docs/outputs.md,
"Same-tokenizer export").

The prompt is the Student's render, as in every pre-tokenized record (`pretokenize.trained_spans`): it is what the
Student sees at run time, where the server renders the history through the template. Each trained message's span
`R` (the render's trained tokens) is compared with the reply's sampled ids `S` (`sampled_of`, from the step
record's `logprobs`):

- the render's **turn end** is the tail of `R` from the first added (special) token of its trailing run of added
  and whitespace-only tokens (`</tool_call><|im_end|>\n` after a Qwen call). The Teacher's span is `S` closed as
  the template closes it: when `S` ends in an added token of the turn end (its stop `<|im_end|>`, or
  `</tool_call>` where the server does not list the stop), `S` + what follows that token in the turn end; when it
  ends in another added token (a stop the template does not write), `S` less it + the turn end; else (no stop
  listed) `S` + the turn end. The Teacher's columns are on the sampled tokens, none on the template's own.
- `same`: the Teacher's span is `R`. The ids are the render's, the Teacher's logprobs aligned with them.
- `substituted`: it is not, and no trained span follows in the sequence: the record trains the Teacher's span
  (what follows it, tool results, is context for nothing trained; the step form's completion is always last, and
  a merged run ends at such a step: dataset/merged.py).
- `rendered`: it is not, but later trained turns follow in the same sequence (a path, the tree form), whose
  context must stay the template's render; or the Student's fit changed the reply (`call_only`, `no_reasoning`:
  the sampled ids hold what the record leaves out; `merge_roles` joined two trained replies): the render is
  trained, marked, never silently re-tokenized.
- `no_tokens` (the step kept no logprobs: `teacher.logprobs: 0`, or dropped), `no_ids` (the server gave token
  text, not ids: SGLang's and OpenAI's chat API), `misaligned` (an id outside the Student's vocabulary, or ids
  that do not decode to text holding the reply's content, reasoning, tool names and argument strings): the
  render is trained, marked.
- a substitution that would take the record past the Student's `max_length` keeps the render (`rendered`).

The columns (`TeacherTokens`) are aligned with the record's trained tokens in order (`completion_mask`'s ones):
`teacher_logprobs` (None where the Teacher sampled no such token: a render kept, the template's own tail),
`teacher_top_ids` and `teacher_top_logprobs` (empty there); `metadata.teacher_tokens` lists each trained
message's outcome.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sftree.dataset.pretokenize import trained_spans
from sftree.dataset.rendering import Student
from sftree.dataset.trainer_labels import trained_indices

if TYPE_CHECKING:
    from sftree.records.sft import Message
    from sftree.records.steplog import TokenLogprobs
    from sftree.records.tree import SchemaDoc


@dataclass(frozen=True)
class Sampled:
    """One trained reply's sampled tokens as the export can use them, or why not (`tokens` None)."""

    tokens: TokenLogprobs | None
    why: str | None = None  # no_tokens | no_ids | misaligned | rendered
    refitted: bool = False  # the Student's fit changed the reply's text (call_only, no_reasoning)


@dataclass(frozen=True)
class TeacherTokens:
    """A record under `export.teacher_tokens`: its ids and mask, the Teacher's columns over its trained tokens, and
    each trained message's outcome."""

    input_ids: list[int]
    mask: list[int]
    logprobs: list[float | None]
    top_ids: list[Sequence[int]]
    top_logprobs: list[Sequence[float]]
    outcomes: list[str]

    def columns(self) -> tuple[tuple[float | None, Sequence[int], Sequence[float]], ...]:
        """The Teacher's column of each trained token (the tree form's `PathTokens.teacher`)."""
        return tuple(zip(self.logprobs, self.top_ids, self.top_logprobs, strict=True))

    def row(self) -> dict[str, object]:
        return {
            "input_ids": self.input_ids,
            "completion_mask": self.mask,
            "teacher_logprobs": self.logprobs,
            "teacher_top_ids": [list(x) for x in self.top_ids],
            "teacher_top_logprobs": [list(x) for x in self.top_logprobs],
        }


class _Vocab:
    """What the comparison needs of the Student's tokenizer: its added tokens, whitespace-only tokens, decoding."""

    def __init__(self, student: Student):
        tok = student.tokenizer
        self.tokenizer = tok
        self.size = tok.get_vocab_size(with_added_tokens=True)
        self.added = frozenset(tok.get_added_tokens_decoder())
        self._blank: dict[int, bool] = {}

    def closing(self, i: int) -> bool:
        """An added token or one whose text is whitespace only: what a turn end is made of."""
        if i in self.added:
            return True
        if i not in self._blank:
            self._blank[i] = not self.tokenizer.decode([i], skip_special_tokens=False).strip()
        return self._blank[i]


_vocabs: dict[int, _Vocab] = {}


def _vocab(student: Student) -> _Vocab:
    key = id(student.tokenizer)
    if key not in _vocabs:
        _vocabs[key] = _Vocab(student)
    return _vocabs[key]


def sampled_of(student: Student, message: Message, lp: TokenLogprobs | None) -> Sampled:
    """The reply `message`'s sampled tokens (its step record's `logprobs`) checked against it under the Student's
    tokenizer: every id in the vocabulary, and the ids' text holding the reply's content, reasoning and tool
    names (a different vocabulary decodes to other text)."""
    if lp is None:
        return Sampled(None, "no_tokens")
    ids = lp.get("ids")
    if ids is None:
        return Sampled(None, "no_ids")
    v = _vocab(student)
    if any(i >= v.size for i in ids) or any(i >= v.size for alts in lp.get("top_ids") or [] for i in alts):
        return Sampled(None, "misaligned")
    text = v.tokenizer.decode(ids, skip_special_tokens=False)
    wanted = [str(message.get(k) or "").strip() for k in ("content", "reasoning_content")]
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") or {}
        wanted += [str(fn.get("name") or ""), *_strings(fn.get("arguments"))]
    if any(w and not _written(w, text) for w in wanted):
        return Sampled(None, "misaligned")
    return Sampled(lp)


def _strings(value: object) -> list[str]:
    """The string leaves of a tool call's arguments (keys too)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (str(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _written(s: str, text: str) -> bool:
    """`s` in the sampled text as it is, or as a JSON string writes it (escaped, with or without non-ASCII)."""
    return s in text or any(json.dumps(s, ensure_ascii=a)[1:-1] in text for a in (False, True))


def refit(unfitted: SchemaDoc, fitted: SchemaDoc, sampled: list[Sampled]) -> list[Sampled]:
    """`sampled` (looked up on the record as recorded) for the record as the Student's fit wrote it: a trained reply
    whose text or reasoning the fit changed (`call_only`, `no_reasoning`) is `refitted`."""
    before, was = trained_indices(unfitted)
    after, now = trained_indices(fitted)
    if len(was) != len(now) or len(was) != len(sampled):
        return sampled  # the fit merged trained replies: `teacher_tokens` keeps every render
    out = []
    for s, i, j in zip(sampled, was, now, strict=True):
        a, b = before[i], after[j]
        changed = any(str(a.get(f) or "").strip() != str(b.get(f) or "").strip() for f in _TEXTS)
        out.append(replace(s, refitted=True) if changed else s)
    return out


_TEXTS = ("content", "reasoning_content")


def _tail_start(rendered: list[int], v: _Vocab) -> int:
    """Where the render's turn end starts (the module): the first added token of its trailing closing run."""
    j = len(rendered)
    while j > 0 and v.closing(rendered[j - 1]):
        j -= 1
    return next((i for i in range(j, len(rendered)) if rendered[i] in v.added), len(rendered))


@dataclass(frozen=True)
class _Span:
    """What one trained span becomes: its ids (None: the render's, no Teacher columns) and the columns, which refer
    to the step record's own lists (not copies: the tree form holds a reply once however many paths train it)."""

    ids: list[int] | None
    logprobs: list[float | None]
    top_ids: list[Sequence[int]]
    top_logprobs: list[Sequence[float]]


_EMPTY: tuple[()] = ()


def teacher_span(rendered: list[int], lp: TokenLogprobs, v: _Vocab) -> _Span:
    """The Teacher's span for a trained message rendered as `rendered` (the module): its sampled ids closed as the
    render's turn end closes them, with the Teacher's columns on the sampled ids."""
    ids = list(lp.get("ids") or [])
    tail = rendered[_tail_start(rendered, v) :]
    n = len(ids)
    last = ids[-1] if ids else None
    if (
        last is not None and last in v.added and last in tail
    ):  # its stop (or closing tag) is the turn end's own
        rest = tail[tail.index(last) + 1 :]
    elif (
        last is not None and last in v.added
    ):  # a stop token the template does not write: its turn end instead
        n, rest = n - 1, tail
    else:  # no stop listed: the whole turn end follows
        rest = tail
    top_ids, top_lps = lp.get("top_ids") or [], lp.get("top_logprobs") or []
    m = len(rest)
    return _Span(
        ids[:n] + rest,
        [*lp["logprobs"][:n], *[None] * m],
        [*top_ids[:n], *[_EMPTY] * m],
        [*top_lps[:n], *[_EMPTY] * m],
    )


def _none(n: int) -> _Span:
    return _Span(None, [None] * n, [_EMPTY] * n, [_EMPTY] * n)


def teacher_tokens(student: Student, record: SchemaDoc, sampled: list[Sampled]) -> TeacherTokens:
    """The record's ids, mask and Teacher columns under `export.teacher_tokens` (the module); `sampled`: each
    trained message's, in order (`sampled_of`; `Sampled.refitted`: the Student's fit changed the reply, so only
    a render that is the sampled ids takes them). When their number is not the record's trained messages (the fit
    merged two), every span keeps its render (`rendered`)."""
    full, spans = trained_spans(student, record)
    if len(sampled) != len(spans):
        sampled = [Sampled(None, "rendered")] * len(spans)
    v = _vocab(student)
    pieces: list[tuple[int, int, _Span, str]] = []  # (start, end, what the span becomes, outcome)
    for n, ((start, end), s) in enumerate(zip(spans, sampled, strict=True)):
        rendered = full[start:end]
        if s.tokens is None:
            pieces.append((start, end, _none(end - start), s.why or "no_tokens"))
            continue
        span = teacher_span(rendered, s.tokens, v)
        if span.ids == rendered:
            pieces.append((start, end, span, "same"))
        elif (
            n == len(spans) - 1
            and not s.refitted
            and span.ids
            and len(full) - (end - start) + len(span.ids) <= student.max_length
        ):
            pieces.append((start, end, span, "substituted"))
        else:
            pieces.append((start, end, _none(end - start), "rendered"))
    ids: list[int] = []
    mask: list[int] = []
    out = TeacherTokens(ids, mask, [], [], [], [p[3] for p in pieces])
    at = 0
    for start, end, span, _ in pieces:
        ids += full[at:start]
        mask += [0] * (start - at)
        trained = full[start:end] if span.ids is None else span.ids
        ids += trained
        mask += [1] * len(trained)
        out.logprobs.extend(span.logprobs)
        out.top_ids.extend(span.top_ids)
        out.top_logprobs.extend(span.top_logprobs)
        at = end
    ids += full[at:]
    mask += [0] * (len(full) - at)
    return out
