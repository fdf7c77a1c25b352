"""Fitting the records to the Student's chat template (`export.student.fit`): what a template cannot render as the
records hold it becomes a documented, counted adaptation, chosen per template by what it renders (probed on a small
conversation shaped like the records, never by the template's name).

The adaptations (each one rewrites the messages the template renders, and the record written holds them so, so that
a trainer rendering it with the same template sees what was measured):
- `call_ids`: tool-call ids (and the tool results' `tool_call_id`) remapped to 9 alphanumeric characters (Mistral's
  rule), the same original id always to the same new one, so a record stays consistent;
- `arguments_string`: tool-call arguments passed as a JSON string instead of an object;
- `content_null`: a tool call without text beside it gets `content: null` instead of `""` (the records' form),
  for templates that render the calls only of a message whose content is none;
- `system_in_user`: a leading system message's text moved to the start of the first user message, for templates
  that render the system message only beside the last user message (its place would move with each turn);
- `merge_roles`: consecutive messages of one role (user, system, text-only assistant) merged into one, joined by a
  blank line, for templates whose roles must alternate;
- `call_only`: the text beside a tool call dropped, where the template renders only the call (a Student trained on
  that template cannot produce both: its rendering would train the call and silently lose the text; counted);
- `no_reasoning`: the reasoning (`reasoning_content`) of a trained message dropped, where the template renders none.

`export.student.fit: strict` keeps none: a record the template cannot render as it is then refuses the export.
The trained span itself (`{% generation %}`, a last turn rendered differently) is dataset/student.py's.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the trainer venv (no jsonschema) imports this module's chain
    from sftree.records.sft import Message
    from sftree.records.tree import SchemaDoc


FIT_MODES = ("fit", "strict")
SHAPING = ("call_ids", "arguments_string", "content_null", "merge_roles", "system_in_user")
LOSSY = ("no_reasoning", "call_only")  # these leave out text: kept only where the probe needs them
# The Unfit reasons each lossy adaptation meets (a template that renders a message's text or its call, not both,
# drops either).
LOSSY_FIXES = {"no_reasoning": ("drops_reasoning",), "call_only": ("drops_text", "drops_tool_call")}
ADAPTATIONS = (*SHAPING, *LOSSY)
_ALNUM = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_MERGED_ROLES = ("user", "system", "assistant")

# The rendered control strings that name a template's family (the first found in a probe's rendering).
FAMILIES = (
    ("<|start_header_id|>", "llama3"),
    ("<|im_start|>", "chatml"),
    ("[INST]", "mistral"),
    ("<start_of_turn>", "gemma"),
    ("<|turn>", "gemma4"),
    ("<｜Assistant｜>", "deepseek"),
    ("<|START_OF_TURN_TOKEN|>", "cohere"),
    ("<|start|>", "harmony"),
    ("<|start_of_role|>", "granite"),
    ("<|im_assistant|>", "kimi"),
    ("]~b]", "minimax"),
    ("<|assistant|>", "phi-glm"),
    ("<|role_start|>", "ling"),
    ("<seed:bos>", "seed"),
    ("<|begin_of_text|>", "llama"),
)


def new_id(old: str) -> str:
    """A tool-call id as 9 alphanumeric characters, a pure function of the original (consistent in a record); an
    id of that form already is kept (so fitting a fitted record changes nothing)."""
    if len(old) == 9 and old.isascii() and old.isalnum():
        return old
    n = int.from_bytes(hashlib.sha256(old.encode("utf-8")).digest()[:8], "big")
    out = ""
    for _ in range(9):
        n, r = divmod(n, len(_ALNUM))
        out += _ALNUM[r]
    return out


@dataclass(frozen=True)
class Fit:
    """The adaptations one template needs (see the module), and its family as its rendering shows it."""

    call_ids: bool = False
    arguments_string: bool = False
    content_null: bool = False
    merge_roles: bool = False
    system_in_user: bool = False
    call_only: bool = False
    no_reasoning: bool = False
    family: str = ""

    @classmethod
    def of(cls, names: Collection[str]) -> Fit:
        """The fit that keeps exactly the adaptations `names` (each one of ADAPTATIONS), no family."""
        return cls(
            call_ids="call_ids" in names,
            arguments_string="arguments_string" in names,
            content_null="content_null" in names,
            merge_roles="merge_roles" in names,
            system_in_user="system_in_user" in names,
            call_only="call_only" in names,
            no_reasoning="no_reasoning" in names,
        )

    def names(self) -> tuple[str, ...]:
        return tuple(a for a in ADAPTATIONS if getattr(self, a))

    def apply(self, messages: list[Message]) -> tuple[list[Message], frozenset[str]]:
        """The messages as the template needs them, and the adaptations that changed something in them."""
        if not self.names():
            return messages, frozenset()
        touched: set[str] = set()
        out = [self._message(m, touched) for m in messages]
        if self.system_in_user:
            out = _system_in_user(out, touched)
        if self.merge_roles:
            out = _merge(out, touched)
        return out, frozenset(touched)

    def _message(self, m: Message, touched: set[str]) -> Message:
        m = dict(m)
        old = m.get("tool_call_id")
        if self.call_ids and m.get("role") == "tool" and isinstance(old, str) and new_id(old) != old:
            m["tool_call_id"] = new_id(old)
            touched.add("call_ids")
        if self.no_reasoning and m.get("role") == "assistant" and m.get("reasoning_content"):
            m.pop("reasoning_content")
            touched.add("no_reasoning")
        calls = m.get("tool_calls")
        if calls and self.call_only and (m.get("content") or "").strip():
            m["content"] = ""
            touched.add("call_only")
        if calls and self.content_null and m.get("content") == "":
            m["content"] = None
            touched.add("content_null")
        if not calls:
            return m
        m["tool_calls"] = [self._call(tc, touched) for tc in calls]
        return m

    def _call(self, tc: SchemaDoc, touched: set[str]) -> SchemaDoc:
        tc = dict(tc)
        if self.call_ids and isinstance(tc.get("id"), str) and new_id(tc["id"]) != tc["id"]:
            tc["id"] = new_id(tc["id"])
            touched.add("call_ids")
        fn = tc.get("function")
        if self.arguments_string and isinstance(fn, dict) and not isinstance(fn.get("arguments"), str):
            tc["function"] = dict(fn, arguments=json.dumps(fn.get("arguments"), ensure_ascii=False))
            touched.add("arguments_string")
        return tc


def _system_in_user(messages: list[Message], touched: set[str]) -> list[Message]:
    if not messages or messages[0].get("role") != "system" or not isinstance(messages[0].get("content"), str):
        return messages
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    if first_user is None or not isinstance(messages[first_user].get("content") or "", str):
        return messages
    out = list(messages)
    user = out[first_user]
    text = "\n\n".join(x for x in (messages[0]["content"], user.get("content")) if x)
    out[first_user] = dict(user, content=text)
    touched.add("system_in_user")
    return out[1:]


def _merge(messages: list[Message], touched: set[str]) -> list[Message]:
    out: list[Message] = []
    for m in messages:
        prev = out[-1] if out else None
        if (
            prev is not None
            and m.get("role") == prev.get("role")
            and m.get("role") in _MERGED_ROLES
            and not prev.get("tool_calls")
            and isinstance(prev.get("content") or "", str)
            and isinstance(m.get("content") or "", str)
        ):
            text = "\n\n".join(x for x in (prev.get("content"), m.get("content")) if x)
            out[-1] = dict(prev, **{k: v for k, v in m.items() if k != "content"}, content=text)
            touched.add("merge_roles")
        else:
            out.append(m)
    return out


# The probe: a conversation shaped like the records (a system prompt, a call beside text, its result, a user turn
# after a tool result, a call alone, a final answer), with the tools they carry.
PROBE_TOOLS: list[Message] = [
    {
        "type": "function",
        "function": {
            "name": "probe_tool",
            "description": "a probe",
            "parameters": {
                "type": "object",
                "properties": {"probe_key": {"type": "string"}},
                "required": ["probe_key"],
            },
        },
    }
]


def _call(i: int) -> SchemaDoc:
    return {
        "id": f"call_probe_{i}",
        "type": "function",
        "function": {"name": "probe_tool", "arguments": {"probe_key": f"probe value {i}"}},
    }


PROBE: list[Message] = [
    {"role": "system", "content": "probe system"},
    {"role": "user", "content": "probe question"},
    {
        "role": "assistant",
        "content": "probe text",
        "reasoning_content": "probe thought",
        "tool_calls": [_call(1)],
    },
    {"role": "tool", "tool_call_id": "call_probe_1", "name": "probe_tool", "content": "probe result 1"},
    {"role": "user", "content": "probe again"},
    {"role": "assistant", "content": "", "tool_calls": [_call(2)]},
    {"role": "tool", "tool_call_id": "call_probe_2", "name": "probe_tool", "content": "probe result 2"},
    {"role": "assistant", "content": "probe answer"},
]
PROBE_TRAINED = (2, 5, 7)  # the assistant messages trained in the probe


def choose(works: Callable[[Fit], list[str | None]], strict: bool) -> Fit:
    """The fit under which most of the probe's trained messages render whole (`works(fit)`: per trained message,
    None or why it does not): the fewest shaping adaptations (every combination, fewest first, the lossy ones
    allowed), then each lossy one kept only where the probe, without it, leaves out what it drops; no adaptation
    at all under `strict` or when none helps (the records are then excluded one by one)."""
    if strict:
        return Fit()

    def score(fit: Fit) -> int:
        return sum(r is None for r in works(fit))

    full = len(PROBE_TRAINED)
    best, top = Fit(), score(Fit())
    for n in range(len(SHAPING) + 1):
        if top == full:
            break
        for combo in itertools.combinations(SHAPING, n):
            fit = Fit.of({*combo, *LOSSY})
            got = score(fit)
            if got > top:
                best, top = fit, got
            if top == full:
                break
    for a in LOSSY:
        without = Fit.of(set(best.names()) - {a})  # `best` less `a` (it has no family yet)
        if getattr(best, a) and not set(LOSSY_FIXES[a]) & set(works(without)):
            best = without
    return best


def fit_record(fit: Fit, rec: SchemaDoc) -> tuple[SchemaDoc, frozenset[str]]:
    """The record (any form: step `prompt` + `completion`, path or merged `messages` with `metadata.trained`) as
    the template needs it, and the adaptations that changed it."""
    if "prompt" in rec:
        n = len(rec["prompt"])
        messages, touched = fit.apply([*rec["prompt"], *rec["completion"]])
        cut = len(fit.apply(rec["prompt"])[0])
        if not touched:
            return rec, touched
        return dict(rec, prompt=messages[:cut], completion=messages[cut:]) if cut <= n else rec, touched
    messages, touched = fit.apply(rec["messages"])
    if not touched:
        return rec, touched
    out = dict(rec, messages=messages)
    trained = (rec.get("metadata") or {}).get("trained")
    if len(messages) != len(rec["messages"]) and isinstance(
        trained, list
    ):  # indices into the fitted messages
        out["metadata"] = dict(
            rec["metadata"], trained=[len(fit.apply(rec["messages"][:k])[0]) for k in trained]
        )
    return out, touched


def family(rendered: str) -> str:
    return next((name for marker, name in FAMILIES if marker in rendered), "other")


def count(adaptations: dict[str, int], touched: frozenset[str] | set[str]) -> None:
    for a in touched:
        adaptations[a] = adaptations.get(a, 0) + 1


def is_generation_template(source: object) -> bool:
    return isinstance(source, str) and "generation" in source and "endgeneration" in source
