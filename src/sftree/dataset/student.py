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

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from sftree.dataset import fit as fitting
from sftree.dataset.pretokenize import encode_messages, encode_span

# the Student, its errors and its spans: rendering.py's (pretokenize stands on them too)
from sftree.dataset.rendering import Student, StudentError, Turn, Unfit, text_span
from sftree.dataset.vocab import GGUF_PRE, PreTokenizer, pre_tokenizer
from sftree.dataset.vocab_spm import SPM_MODELS, spm_from_gguf
from sftree.errors import InputError
from sftree.records.sft import Message
from sftree.records.tree import SchemaDoc

if TYPE_CHECKING:  # imported where used (loading a Student), to keep this module's import light
    from jinja2 import Environment, Template
    from jinja2.ext import Extension
    from jinja2.nodes import EvalContext, Node
    from jinja2.parser import Parser
    from tokenizers import Tokenizer

# GGUF token types matched as whole tokens in text (llama.cpp's CONTROL and USER_DEFINED), as HF's added tokens.
_CONTROL, _USER_DEFINED = 3, 4


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
class Measure:
    """One record under the Student: tokens processed (the whole rendered record), tokens trained."""

    processed: int
    trained: int
    as_steps: int = 0  # tokens the step form processes for the same trained messages (one record per step)


# --- loading --------------------------------------------------------------------------------------------


class _Model(NamedTuple):
    """What a model folder or GGUF file gives the Student: its tokenizer, the chat template it holds as
    read (a string when it holds one: `_load` checks), the template's name in errors, its BOS and EOS token
    texts."""

    tokenizer: Tokenizer
    template: object
    template_name: str
    bos: str
    eos: str


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


def _from_folder(folder: Path) -> _Model:
    from tokenizers import Tokenizer

    tj, cfg_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
    if not tj.is_file():
        raise StudentError(f"export.student.path {folder}: no tokenizer.json")
    tok = Tokenizer.from_file(str(tj))
    cfg: dict[str, Any] = {}  # tokenizer_config.json as the model wrote it
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

    return _Model(tok, template, name, token("bos_token"), token("eos_token"))


def gguf_tokenizer(path: str | Path) -> Tokenizer:
    """The `tokenizers` tokenizer of a GGUF's `tokenizer.ggml.*`, as the Student reads it (no template needed)."""
    return _from_gguf(Path(path)).tokenizer


def _from_gguf(path: Path) -> _Model:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # not a GGUF file, or a damaged one
        raise StudentError(f"export.student.path {path}: not a readable GGUF file: {exc}") from exc

    def field(key: str, default: object = None) -> Any:  # gguf's contents() is untyped: what the file holds
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    model, pre = field("tokenizer.ggml.model"), field("tokenizer.ggml.pre", "default")
    tokens = field("tokenizer.ggml.tokens")
    if model in SPM_MODELS:  # SentencePiece-style: Llama 2, Mistral, Phi-3, Gemma (dataset/vocab_spm.py)
        tok = spm_from_gguf(field)
    else:
        if model != "gpt2":
            raise StudentError(
                f"{path}: tokenizer.ggml.model {model!r} is not one llama.cpp's vocabularies read here "
                f"(gpt2, {', '.join(sorted(SPM_MODELS))}); give the Student's HF folder"
            )
        if pre not in GGUF_PRE:
            raise StudentError(
                f"{path}: tokenizer.ggml.pre {pre!r} is not one of {sorted(GGUF_PRE)}; give the Student's HF folder"
            )
        types = field("tokenizer.ggml.token_type")
        merges = [(a, b) for a, b in (m.split(" ", 1) for m in field("tokenizer.ggml.merges") or [])]
        tok = _bpe(tokens, types, merges, GGUF_PRE[pre])

    def special(key: str) -> str:
        i = field(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""

    template = field("tokenizer.chat_template")
    return _Model(
        tok,
        template,
        f"{path} tokenizer.chat_template",
        special("tokenizer.ggml.bos_token_id"),
        special("tokenizer.ggml.eos_token_id"),
    )


def _bpe(tokens: list[str], types: list[int], merges: list[tuple[str, str]], pre: PreTokenizer) -> Tokenizer:
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


def _generation_tracker() -> type[Extension]:
    """transformers' `AssistantTracker` (chat_template_utils.py): `{% generation %}...{% endgeneration %}` renders
    its body and, while a tracker is active, records the body's character span in the rendering so far."""
    from contextlib import contextmanager

    import jinja2
    from jinja2.ext import Extension

    class GenerationTracker(Extension):
        tags = {"generation"}

        def __init__(self, environment: Environment) -> None:
            super().__init__(environment)
            environment.extend(activate_tracker=self.activate_tracker)
            self._blocks: list[str] | None = None
            self._spans: list[tuple[int, int]] | None = None

        def parse(self, parser: Parser) -> Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_support"), [], [], body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _support(self, context: EvalContext, caller: Callable[[], str]) -> str:
            rv = caller()
            if self._blocks is not None and self._spans is not None:
                start = len("".join(self._blocks))
                self._spans.append((start, start + len(rv)))
            return str(rv)

        @contextmanager
        def activate_tracker(self, blocks: list[str], spans: list[tuple[int, int]]) -> Iterator[None]:
            try:
                self._blocks, self._spans = blocks, spans
                yield
            finally:
                self._blocks = self._spans = None

    return GenerationTracker


def compile_template(source: str, name: str) -> Template:
    """The template in transformers' environment (`_compile_jinja_template`): sandboxed, trim/lstrip blocks."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> NoReturn:
        raise TemplateError(message)

    def tojson(
        x: object,
        ensure_ascii: bool = False,
        indent: int | str | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
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


def _forms(value: object) -> list[str]:
    """How a template may write a value: as is, JSON-escaped (with or without ASCII escapes), as JSON."""
    if isinstance(value, str):
        return [value, json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]]
    return [json.dumps(value), str(value)]


def _leaves(value: object) -> list[object]:
    """The keys and scalar values of a JSON value: what a rendering of it must show."""
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in [k, *_leaves(v)]]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [value]


def missing(text: str, message: Message) -> str | None:
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


def trained_text(
    student: Student, before: list[Message], message: Message, tools: list[Message], rid: str
) -> tuple[str, str]:
    """(the prompt, the trained text) of `message` after `before` (text_span)."""
    span = text_span(student, before, message, tools, rid)
    return span.prompt, span.text


def ids(student: Student, text: str) -> list[int]:
    """The token ids of rendered text (it already holds the template's special tokens)."""
    return student.tokenizer.encode(text, add_special_tokens=False).ids


def _gap_reason(gap: str) -> str:
    if gap.startswith("the tool call"):
        return "drops_tool_call"
    return "drops_reasoning" if "reasoning" in gap else "drops_text"


def render_turn(
    student: Student,
    before: list[Message],
    message: Message,
    tools: list[Message],
    rid: str,
    ids_too: bool = True,
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
        return encode_span(student, before, message, tools, rid)
    stop = None if span.end == len(span.whole) else len(ids(student, span.whole[: span.end]))
    return Turn(ids(student, span.prompt), ids(student, span.whole), stop)


def measure(student: Student, rec: SchemaDoc) -> Measure:
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
    # the counts below, read back from JSON (from_dict), are made ints, every bucket present, in __post_init__
    # records measured by length_bucket (dropped ones in `>100%`)
    lengths: dict[str, int] = dataclasses.field(default_factory=dict)
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)  # records left out, by reason
    as_steps: int = (
        0  # tokens the step form would process for the records written (merged: the sum over steps)
    )
    tokenizer: dict[str, str] | None = None  # Student.tokenizer_info(): file, kind, sha256
    family: str = ""  # the template's family, as its rendering shows it (dataset/fit.py)
    # the adaptations the template's fit applies (dataset/fit.py)
    fit: list[str] = dataclasses.field(default_factory=list)
    adaptations: dict[str, int] = dataclasses.field(default_factory=dict)  # records each adaptation touched

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

    def to_dict(self) -> SchemaDoc:
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
    def from_dict(cls, d: SchemaDoc) -> StudentStats:
        """The figures as `to_dict` wrote them (`sft.stats.json`); a count missing reads as none."""
        fit, adaptations = d.get("fit"), d.get("adaptations")
        return cls(
            str(d.get("source")),
            str(d.get("template")),
            int(d.get("max_length") or 0),
            int(d.get("records") or 0),
            int(d.get("tokens_processed") or 0),
            int(d.get("tokens_trained") or 0),
            int(d.get("longest") or 0),
            d.get("lengths") or {},
            d.get("dropped") or {},
            int(d.get("tokens_processed_as_steps") or 0),
            d.get("tokenizer") if isinstance(d.get("tokenizer"), dict) else None,
            str(d.get("family") or ""),
            fit if isinstance(fit, list) else [],
            adaptations if isinstance(adaptations, dict) else {},
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
