"""The Student that will be trained on the export: its tokenizer, chat template and context length (`export.student`).

Read offline from either
- a local HF model folder: `tokenizer.json` (the `tokenizers` library reads it exactly as transformers does) and
  `tokenizer_config.json`'s `chat_template` (or `chat_template.jinja` beside it), or
- a GGUF file: `tokenizer.ggml.*` (a byte-level BPE vocabulary, rebuilt as a `tokenizers` BPE with the
  pre-tokenizer its `tokenizer.ggml.pre` names) and `tokenizer.chat_template`,
optionally with `chat_template` (a Jinja file) replacing the model's own template.

The template is rendered as transformers' `apply_chat_template` renders it (a sandboxed Jinja environment with
`trim_blocks`, `lstrip_blocks`, `tojson`, `raise_exception`), so a record measured here is what a trainer sees.
`measure` renders one record the way TRL does (prompt with the generation prompt, then prompt + completion; the
trained text is what the completion adds) and refuses a template whose rendering leaves out a tool call, the text
or the reasoning the record trains.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from sftree.dataset import fit as fitting
from sftree.dataset.vocab import GGUF_PRE, PreTokenizer, pre_tokenizer
from sftree.errors import InputError

# GGUF token types matched as whole tokens in text (llama.cpp's CONTROL and USER_DEFINED), as HF's added tokens.
_CONTROL, _USER_DEFINED = 3, 4


class StudentError(InputError):
    """The Student cannot be read, or its template cannot render what a record trains."""


class Unfit(StudentError):
    """One record the Student's template cannot hold, with its `reason` (counted): excluded, unless
    `export.student.fit: strict`, where it refuses the export as any StudentError does."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


# Why a record is excluded under the Student's template (`Unfit.reason`, counted in `student.dropped`).
UNFIT_REASONS = {
    "template_error": "the template raises on the record (its own raise_exception, or a sandbox refusal such "
    "as `list.append`, which transformers' chat-template environment refuses too)",
    "drops_tool_call": "the rendered completion leaves out a tool call or its arguments",
    "drops_text": "the rendered completion leaves out the text the record trains",
    "drops_reasoning": "the rendered completion leaves out the reasoning the record trains",
    "span_undefined": "the prompt rendered with the generation prompt and the whole differ in more than the "
    "last turn's form, so the trained tokens are not defined",
}


@dataclass
class Student:
    """A tokenizer, a chat template and a context length; `source` and `template_name` name them in errors."""

    source: str
    template_name: str
    template: Any  # a compiled jinja2 Template
    tokenizer: Any  # a tokenizers.Tokenizer
    max_length: int
    bos_token: str = ""
    eos_token: str = ""
    # `export.special_text: split`: data text tokenized as plain text (dataset/pretokenize.py), so the figures are
    # those of the pre-tokenized rows; otherwise the rendered text is tokenized whole, as a trainer does
    plain_data: bool = False
    kind: str = (
        ""  # where the tokenizer came from: `tokenizer.json` (an HF folder) or `gguf` (tokenizer.ggml.*)
    )
    tokenizer_sha256: str = ""  # of the tokenizer as sftree reads it (`tokenizers` JSON): names it exactly
    fit: fitting.Fit = fitting.Fit()  # the adaptations the template needs (dataset/fit.py), probed at load
    strict: bool = False  # `export.student.fit: strict`: a record the template cannot hold refuses the export
    generation: bool = False  # the template marks the trained text with `{% generation %}`

    def render(self, messages: list[dict], tools: list | None, generation: bool) -> str:
        return self.render_spans(messages, tools, generation)[0]

    def render_spans(
        self, messages: list[dict], tools: list | None, generation: bool
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendering of `messages` fitted to the template, and its `{% generation %}` spans (character
        offsets, as transformers' `return_assistant_tokens_mask` tracks them; none when the template has none)."""
        fitted = self.fit.apply(messages)[0]
        kwargs = dict(
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
            with self.template.environment.activate_tracker(blocks, spans):
                for block in self.template.generate(**kwargs):
                    blocks.append(block)
            return "".join(blocks), spans
        except Exception as exc:  # a template's raise_exception, a sandbox refusal, or an error inside it
            raise Unfit(f"chat template {self.template_name}: {exc}", "template_error") from exc

    def count(self, text: str) -> int:
        # The rendered text already holds the template's special tokens (apply_chat_template tokenizes it so).
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def describe(self) -> dict:
        return {"source": self.source, "template": self.template_name, "max_length": self.max_length}

    def tokenizer_info(self) -> dict:
        """The tokenizer the figures come from: file, kind, hash (the card names it)."""
        return {"file": self.source, "kind": self.kind, "sha256": self.tokenizer_sha256}


@dataclass
class Measure:
    """One record under the Student: tokens processed (the whole rendered record), tokens trained."""

    processed: int
    trained: int
    as_steps: int = 0  # tokens the step form processes for the same trained messages (one record per step)


# --- loading --------------------------------------------------------------------------------------------


def load_student(
    path: str | Path, max_length: int, chat_template: str | Path | None = None, strict: bool = False
) -> Student:
    """The Student at `path` (an HF model folder or a .gguf file), with `chat_template` replacing its own;
    `strict` (`export.student.fit: strict`): a record the template cannot render as it is refuses the export,
    else the records are fitted to the template (dataset/fit.py)."""
    if not isinstance(max_length, int) or max_length < 1:
        raise StudentError(f"export.student.max_length: {max_length!r} is not a positive integer")
    return _load(str(path), max_length, str(chat_template) if chat_template else None, strict)


@lru_cache(maxsize=4)
def _load(path: str, max_length: int, chat_template: str | None, strict: bool) -> Student:
    p = Path(path)
    if p.is_dir():
        tok, template, template_name, bos, eos = _from_folder(p)
    elif p.is_file() and p.suffix == ".gguf":
        tok, template, template_name, bos, eos = _from_gguf(p)
    else:
        raise StudentError(f"export.student.path {path}: neither an HF model folder nor a .gguf file")
    if chat_template:
        try:
            template = Path(chat_template).read_text(encoding="utf-8")
        except OSError as exc:
            raise StudentError(f"export.student.chat_template {chat_template}: {exc}") from exc
        template_name = chat_template
    if not isinstance(template, str) or not template.strip():
        raise StudentError(f"{template_name}: no chat template (set export.student.chat_template)")
    kind = "gguf" if p.suffix == ".gguf" else "tokenizer.json"
    digest = hashlib.sha256(tok.to_str().encode("utf-8")).hexdigest()
    compiled = compile_template(template, template_name)
    student = Student(
        path,
        template_name,
        compiled,
        tok,
        max_length,
        bos,
        eos,
        kind=kind,
        tokenizer_sha256=digest,
        strict=strict,
        generation=fitting.is_generation_template(template),
    )
    return probe(student)


def with_template(student: Student, chat_template: str | Path) -> Student:
    """The same Student (its tokenizer shared, not read again) under another chat template file."""
    import dataclasses

    try:
        source = Path(chat_template).read_text(encoding="utf-8")
    except OSError as exc:
        raise StudentError(f"export.student.chat_template {chat_template}: {exc}") from exc
    name = str(chat_template)
    changed = dataclasses.replace(
        student,
        template_name=name,
        template=compile_template(source, name),
        generation=fitting.is_generation_template(source),
        fit=fitting.Fit(),
    )
    return probe(changed)


def probe(student: Student) -> Student:
    """The Student with the fit its template needs: the fewest adaptations under which the probe conversation's
    trained messages render whole (dataset/fit.py), and the template's family as the probe's rendering shows."""
    import dataclasses

    def works(fit: fitting.Fit) -> list[str | None]:
        s = dataclasses.replace(student, fit=fit)
        out: list[str | None] = []
        for k in fitting.PROBE_TRAINED:
            try:
                render_turn(
                    s, fitting.PROBE[:k], fitting.PROBE[k], fitting.PROBE_TOOLS, "probe", ids_too=False
                )
                out.append(None)
            except Unfit as exc:
                out.append(exc.reason)
        return out

    chosen = fitting.choose(works, student.strict)
    try:
        shown = dataclasses.replace(student, fit=chosen).render(fitting.PROBE, fitting.PROBE_TOOLS, False)
    except StudentError:
        shown = ""
    return dataclasses.replace(student, fit=dataclasses.replace(chosen, family=fitting.family(shown)))


def _from_folder(folder: Path) -> tuple:
    from tokenizers import Tokenizer

    tj, cfg_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
    if not tj.is_file():
        raise StudentError(f"export.student.path {folder}: no tokenizer.json")
    tok = Tokenizer.from_file(str(tj))
    cfg: dict = {}
    if cfg_file.is_file():
        try:
            cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise StudentError(f"{cfg_file}: {exc}") from exc
    template, name = cfg.get("chat_template"), f"{cfg_file} chat_template"
    if isinstance(template, list):  # the named-templates form: the `default` one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    jinja = folder / "chat_template.jinja"  # newer transformers save the template beside the config
    if not template and jinja.is_file():
        template, name = jinja.read_text(encoding="utf-8"), str(jinja)

    def token(key: str) -> str:
        v = cfg.get(key)
        return (v.get("content") if isinstance(v, dict) else v) or ""

    return tok, template, name, token("bos_token"), token("eos_token")


def gguf_tokenizer(path: str | Path) -> Any:
    """The `tokenizers` tokenizer of a GGUF's `tokenizer.ggml.*`, as the Student reads it (no template needed)."""
    return _from_gguf(Path(path))[0]


def _from_gguf(path: Path) -> tuple:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # not a GGUF file, or a damaged one
        raise StudentError(f"export.student.path {path}: not a readable GGUF file: {exc}") from exc

    def field(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    model, pre = field("tokenizer.ggml.model"), field("tokenizer.ggml.pre", "default")
    if model != "gpt2":
        raise StudentError(
            f"{path}: tokenizer.ggml.model {model!r} is not a byte-level BPE (gpt2); give the Student's HF folder"
        )
    if pre not in GGUF_PRE:
        raise StudentError(
            f"{path}: tokenizer.ggml.pre {pre!r} is not one of {sorted(GGUF_PRE)}; give the Student's HF folder"
        )
    tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges") or []]
    tok = _bpe(tokens, types, merges, GGUF_PRE[pre])

    def special(key: str) -> str:
        i = field(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""

    template = field("tokenizer.chat_template")
    return (
        tok,
        template,
        f"{path} tokenizer.chat_template",
        special("tokenizer.ggml.bos_token_id"),
        special("tokenizer.ggml.eos_token_id"),
    )


def _bpe(tokens: list[str], types: list[int], merges: list[tuple], pre: PreTokenizer) -> Any:
    """A `tokenizers` byte-level BPE that gives llama.cpp's ids for the vocabulary (dataset/vocab.py)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(
        models.BPE(
            vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=pre.ignore_merges
        )
    )
    tok.pre_tokenizer = pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    added = [
        AddedToken(t, special=ty == _CONTROL, normalized=False)
        for t, ty in zip(tokens, types, strict=False)
        if ty in (_CONTROL, _USER_DEFINED)
    ]
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])
    return tok


def _generation_tracker() -> Any:
    """transformers' `AssistantTracker` (chat_template_utils.py): `{% generation %}...{% endgeneration %}` renders
    its body and, while a tracker is active, records the body's character span in the rendering so far."""
    from contextlib import contextmanager

    import jinja2
    from jinja2.ext import Extension

    class GenerationTracker(Extension):
        tags = {"generation"}

        def __init__(self, environment: Any):
            super().__init__(environment)
            environment.extend(activate_tracker=self.activate_tracker)
            self._blocks: list[str] | None = None
            self._spans: list[tuple[int, int]] | None = None

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_support"), [], [], body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _support(self, context: Any, caller: Any) -> str:
            rv = caller()
            if self._blocks is not None and self._spans is not None:
                start = len("".join(self._blocks))
                self._spans.append((start, start + len(rv)))
            return str(rv)

        @contextmanager
        def activate_tracker(self, blocks: list[str], spans: list[tuple[int, int]]) -> Any:
            try:
                self._blocks, self._spans = blocks, spans
                yield
            finally:
                self._blocks = self._spans = None

    return GenerationTracker


def compile_template(source: str, name: str) -> Any:
    """The template in transformers' environment (`_compile_jinja_template`): sandboxed, trim/lstrip blocks."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys=False
    ):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_generation_tracker(), loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise StudentError(f"chat template {name}: {exc}") from exc


# --- measuring a record ---------------------------------------------------------------------------------


def _forms(value: Any) -> list[str]:
    """How a template may write a value: as is, JSON-escaped (with or without ASCII escapes), as JSON."""
    if isinstance(value, str):
        return [value, json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]]
    return [json.dumps(value), str(value)]


def _leaves(value: Any) -> list[Any]:
    """The keys and scalar values of a JSON value: what a rendering of it must show."""
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in [k, *_leaves(v)]]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [value]


def missing(text: str, message: dict) -> str | None:
    """What of the trained assistant `message` its rendered `text` leaves out, or None."""
    reasoning = (message.get("reasoning_content") or "").strip()
    if reasoning and reasoning not in text:
        return "the reasoning (`reasoning_content`)"
    content = (message.get("content") or "").strip()
    if content and content not in text:
        return "the text (`content`)"
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") or {}
        name = fn.get("name") or ""
        if name not in text:
            return f"the tool call `{name}`"
        for leaf in _leaves(fn.get("arguments")):
            if leaf != "" and not any(f in text for f in _forms(leaf)):
                return f"the tool call `{name}`'s arguments ({json.dumps(leaf, ensure_ascii=False)[:60]})"
    return None


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


def text_span(student: Student, before: list[dict], message: dict, tools: list, rid: str) -> Span:
    """Where the trained text of `message` after `before` lies in their rendering:
    - a template with `{% generation %}`: the last generation span of the whole (as transformers marks it);
    - else TRL's split: the context rendered with the generation prompt is the start of the whole, and what the
      message adds is trained;
    - else, where the two differ only by the template's last-turn form (the generation prompt opens a reasoning
      block or a think prefix the history form does not hold; at most LAST_TURN_FORM characters of it), the
      whole's own tokens from where the two part;
    - else Unfit `span_undefined`."""
    whole, spans = student.render_spans([*before, message], tools, generation=False)
    if student.generation and spans:
        start, end = spans[-1]
        return Span(whole, start, end)
    prompt = student.render(before, tools, generation=True)
    if whole.startswith(prompt):
        return Span(whole, len(prompt), len(whole))
    start = _last_turn_start(student, before, tools, prompt, whole) if not student.strict else None
    if start is not None:
        return Span(whole, start, len(whole))
    raise Unfit(
        f"chat template {student.template_name}: record {rid}: the prompt rendered with the generation prompt is "
        "not the start of the prompt and completion rendered together, and they differ in more than the last "
        "turn's form, so the trained tokens are not defined",
        "span_undefined",
    )


def _last_turn_start(
    student: Student, before: list[dict], tools: list, prompt: str, whole: str
) -> int | None:
    """Where the trained message's own text starts in `whole` when the prompt (`before` with the generation
    prompt) is not its start but differs only in the last turn's form, else None. Two forms: the generation
    prompt opens more than the whole holds (a think prefix: the message starts where the two part), or the last
    context message ends differently when it is last (a turn end written only before another turn: the message
    starts after the generation prompt's text, found in the whole within LAST_TURN_FORM characters)."""
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


def trained_text(
    student: Student, before: list[dict], message: dict, tools: list, rid: str
) -> tuple[str, str]:
    """(the prompt, the trained text) of `message` after `before` (text_span)."""
    span = text_span(student, before, message, tools, rid)
    return span.prompt, span.text


def ids(student: Student, text: str) -> list[int]:
    """The token ids of rendered text (it already holds the template's special tokens)."""
    return student.tokenizer.encode(text, add_special_tokens=False).ids


@dataclass
class Turn:
    """One trained assistant message under the Student: the token ids of its context rendered with the generation
    prompt and of context + message; its trained tokens are `whole[start:]`, where `start` is where the two first
    differ (TRL's rule: the completion starts where the tokenized prompt and prompt + completion diverge)."""

    prompt: list[int]
    whole: list[int]
    stop: int | None = None  # the trained tokens end here (a `{% generation %}` span); None: at the end

    @property
    def start(self) -> int:
        return len(os.path.commonprefix([self.prompt, self.whole]))

    @property
    def trained(self) -> int:
        return (len(self.whole) if self.stop is None else self.stop) - self.start


def _gap_reason(gap: str) -> str:
    if gap.startswith("the tool call"):
        return "drops_tool_call"
    return "drops_reasoning" if "reasoning" in gap else "drops_text"


def render_turn(
    student: Student, before: list[dict], message: dict, tools: list, rid: str, ids_too: bool = True
) -> Turn:
    """Render one trained assistant `message` after `before`; an Unfit naming the template, the record and the
    reason when the rendering leaves out what is trained (`ids_too=False`: the check alone, no tokens)."""
    span = text_span(student, before, message, tools, rid)
    gap = missing(span.text, student.fit.apply([message])[0][0])
    if gap:
        raise Unfit(
            f"chat template {student.template_name} leaves out {gap} of the message record {rid} trains "
            f"(rendered completion: {span.text[:200]!r})",
            _gap_reason(gap),
        )
    if not ids_too:
        return Turn([], [])
    if student.plain_data:
        from sftree.dataset.pretokenize import encode_span

        return encode_span(student, before, message, tools, rid)
    stop = None if span.end == len(span.whole) else len(ids(student, span.whole[: span.end]))
    return Turn(ids(student, span.prompt), ids(student, span.whole), stop)


def measure(student: Student, rec: dict) -> Measure:
    """Render one record (step: `prompt` + `completion`; path: `messages`, every assistant turn trained) and count
    its tokens; a StudentError naming the template and the record when the rendering leaves out what is trained."""
    rid = (rec.get("metadata") or {}).get("id", "?")
    tools = rec.get("tools") or []
    if "prompt" in rec:
        msgs, trained_at = [*rec["prompt"], *rec["completion"]], [len(rec["prompt"])]
    else:
        msgs = rec["messages"]
        trained_at = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    turns = [render_turn(student, msgs[:i], msgs[i], tools, rid) for i in trained_at]
    trained = sum(t.trained for t in turns)
    if student.plain_data:
        from sftree.dataset.pretokenize import encode_messages

        processed = len(encode_messages(student, msgs, tools, generation=False))
    else:
        processed = student.count(student.render(msgs, tools, generation=False))
    return Measure(processed, trained, processed if "prompt" in rec else 0)


# Length distribution buckets, as fractions of max_length (the last: over it, dropped).
LENGTH_BUCKETS = (0.25, 0.5, 0.75, 1.0)


def length_bucket(tokens: int, max_length: int) -> str:
    for b in LENGTH_BUCKETS:
        if tokens <= b * max_length:
            return f"<={int(b * 100)}%"
    return ">100%"


def bucket_names() -> list[str]:
    return [f"<={int(b * 100)}%" for b in LENGTH_BUCKETS] + [">100%"]


# Why a measured record is left out (counted by reason in the stats and the card).
DROP_TOO_LONG = (
    "too_long"  # the whole rendered record is longer than max_length: a trainer would cut or drop it
)


@dataclass
class StudentStats:
    """The export's figures under the Student (`sft.stats.json` `student`; summed at merge)."""

    source: str
    template: str
    max_length: int
    records: int = 0  # records measured and written
    processed: int = 0  # tokens a trainer processes (whole rendered records written)
    trained: int = 0  # tokens with a label (rendered completions of the records written)
    longest: int = 0  # the longest record measured, written or not
    lengths: dict | None = None  # records measured by length_bucket (dropped ones in `>100%`)
    dropped: dict | None = None  # records left out, by reason
    as_steps: int = (
        0  # tokens the step form would process for the records written (merged: the sum over steps)
    )
    tokenizer: dict | None = None  # Student.tokenizer_info(): file, kind, sha256
    family: str = ""  # the template's family, as its rendering shows it (dataset/fit.py)
    fit: list | None = None  # the adaptations the template's fit applies (dataset/fit.py)
    adaptations: dict | None = None  # records each adaptation touched

    def __post_init__(self) -> None:
        self.lengths = {k: int((self.lengths or {}).get(k, 0)) for k in bucket_names()}
        self.dropped = {k: int(v) for k, v in (self.dropped or {}).items()}
        self.adaptations = {k: int(v) for k, v in (self.adaptations or {}).items()}
        self.fit = [str(a) for a in self.fit or []]

    @classmethod
    def of(cls, student: Student) -> StudentStats:
        return cls(
            student.source,
            student.template_name,
            student.max_length,
            tokenizer=student.tokenizer_info(),
            family=student.fit.family,
            fit=list(student.fit.names()),
        )

    def exclude(self, reason: str) -> None:
        """A record the template cannot hold (Unfit), counted by its reason with the records dropped."""
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def count(self, m: Measure) -> str | None:
        """Count one measured record; the reason it is dropped, or None when it is kept."""
        self.lengths[length_bucket(m.processed, self.max_length)] += 1
        self.longest = max(self.longest, m.processed)
        if m.processed > self.max_length:
            self.dropped[DROP_TOO_LONG] = self.dropped.get(DROP_TOO_LONG, 0) + 1
            return DROP_TOO_LONG
        self.records += 1
        self.processed += m.processed
        self.trained += m.trained
        self.as_steps += m.as_steps
        return None

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "template": self.template,
            "max_length": self.max_length,
            "records": self.records,
            "tokens_processed": self.processed,
            "tokens_trained": self.trained,
            "longest": self.longest,
            "tokens_processed_as_steps": self.as_steps,
            "lengths": dict(self.lengths),
            "dropped": dict(sorted(self.dropped.items())),
            "tokenizer": self.tokenizer,
            "family": self.family,
            "fit": list(self.fit),
            "adaptations": dict(sorted(self.adaptations.items())),
        }

    @classmethod
    def from_dict(cls, d: dict) -> StudentStats:
        return cls(
            str(d.get("source")),
            str(d.get("template")),
            int(d.get("max_length") or 0),
            int(d.get("records") or 0),
            int(d.get("tokens_processed") or 0),
            int(d.get("tokens_trained") or 0),
            int(d.get("longest") or 0),
            d.get("lengths"),
            d.get("dropped"),
            int(d.get("tokens_processed_as_steps") or 0),
            d.get("tokenizer") if isinstance(d.get("tokenizer"), dict) else None,
            str(d.get("family") or ""),
            d.get("fit") if isinstance(d.get("fit"), list) else None,
            d.get("adaptations") if isinstance(d.get("adaptations"), dict) else None,
        )

    def add(self, other: StudentStats) -> None:
        mine = (self.source, self.template, self.max_length, (self.tokenizer or {}).get("sha256"))
        if mine != (other.source, other.template, other.max_length, (other.tokenizer or {}).get("sha256")):
            raise InputError(
                f"export stats measured under different Students: {self.source} ({self.template}, "
                f"max_length {self.max_length}) and {other.source} ({other.template}, max_length {other.max_length})"
            )
        self.records += other.records
        self.processed += other.processed
        self.trained += other.trained
        self.longest = max(self.longest, other.longest)
        self.as_steps += other.as_steps
        for k, v in other.lengths.items():
            self.lengths[k] = self.lengths.get(k, 0) + v
        for k, v in other.dropped.items():
            self.dropped[k] = self.dropped.get(k, 0) + v
        for k, v in other.adaptations.items():
            self.adaptations[k] = self.adaptations.get(k, 0) + v
