"""The chain invariant (DESIGN.md, docs/security.md "Trained records"): a request OpenCode sends is trusted only as
an extension of the previous request of its session.

Every route the agent may find into OpenCode (its server's HTTP API, a config or instruction file, a plugin, its
session store) ends in what OpenCode sends to the model, and all of that passes the recording proxy. So the proxy
checks each request of an edge's session here, before it goes on to the Teacher:

- the tool list and the system prompt equal the pristine ones: those of the first request of a fresh session the
  host started itself for this run (`Pristine`), but for two parts that OpenCode itself varies and names: the
  date line of its `<env>` block and the `<available_skills>` block, which lists the skills of the shared
  knowledge (written by the agents, as in Coral: a knowledge action, not a change of OpenCode);
- the other messages are the previous request's, then the Teacher's reply to it as the proxy received it (not as
  OpenCode echoes it: content and reasoning as sent, tool calls by id, name and parsed arguments; a call whose
  arguments did not parse may come back as OpenCode's own `invalid` call under the same id), then one tool
  message per call of that reply, in order, then, where the host sent a prompt (a turn's start, a nudge),
  exactly that prompt as one user message; after a reply that failed (no reply, an HTTP error, a malformed or
  cut reply) OpenCode may resend the same request, and a cut reply may come back as what was received of it.
  The first request of an edge extends the session the node holds (`base`: the parent's last request, its reply
  and tool results, from the host's own session file) with the edge's first prompt.

Requests of OpenCode's helper agents (`title`, `compaction`, `summary`: agents/proxy.py `classify`) are outside
the session and never trained; they are recorded as they are. What the agent can still put into a trained record
is its own tool calls and their results (docs/security.md lists them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from sftree.jsontypes import JSONObject, JSONValue, obj

DATE_RX = re.compile(r"(Today's date: )[^\n]*")
# From the block's opening tag to the last closing tag of the prompt (greedy): a skill's description is the agents'
# text and OpenCode does not escape it, so an ancestor's skill described as "</available_skills> ..." would end a
# lazy match inside the block and break the chain of every honest descendant (issue #49). The block is the
# system prompt's last part, after the host's instructions.
SKILLS_RX = re.compile(r"<available_skills>.*</available_skills>", re.S)
SHOWN = 600  # characters of each side of a difference kept in the record


class ChainBreak(Exception):
    """A request that is not the extension of its session's previous one: `reason` and a short `diff`."""

    def __init__(self, reason: str, expected: object = None, got: object = None):
        super().__init__(reason)
        self.reason = reason
        self.diff = {"expected": _shown(expected), "got": _shown(got)}


def _shown(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= SHOWN else text[:SHOWN] + f"... ({len(text)} characters)"


def text_of(content: object) -> str:
    """A message's content as text (OpenAI content may be a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def masked_system(text: str, workdir: str = "") -> str:
    """The system prompt with the parts OpenCode varies by itself masked: the date, the shared skills, and the
    working directory (the same path for every edge in the sandbox; each edge's own without one)."""
    text = SKILLS_RX.sub("<available_skills/>", DATE_RX.sub(r"\1<date>", text))
    return text.replace(workdir, "<workdir>") if workdir else text


def split(body: JSONObject) -> tuple[list[str], list[JSONValue]]:
    """(the leading system messages' texts, the rest of the messages) of a request body."""
    messages = body.get("messages")
    msgs = messages if isinstance(messages, list) else []
    n = 0
    while n < len(msgs) and obj(msgs[n]).get("role") == "system":
        n += 1
    return [text_of(obj(m).get("content")) for m in msgs[:n]], list(msgs[n:])


CACHE_KEY = (
    "cache_control"  # OpenCode's prompt-caching marks (Claude-family ids): on the newest messages only
)


def plain(value: JSONValue) -> JSONValue:
    """A message (or tool list) without OpenCode's own caching marks, its text parts joined: the marks move to the
    newest messages as a session grows, and a marked message's content may be a list of text parts."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: plain(v) for k, v in value.items() if k != CACHE_KEY}
    content = out.get("content")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        out["content"] = "".join(str(obj(p).get("text", "")) for p in content)
    return out


def canonical(value: JSONValue) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Pristine:
    """The system prompt (masked) and tool list of a fresh OpenCode session for the Student's model id."""

    system: tuple[str, ...]
    tools: str

    @classmethod
    def of(cls, body: JSONObject, workdir: str = "") -> Pristine:
        system, _rest = split(body)
        return cls(
            tuple(masked_system(s, workdir) for s in system), canonical(plain(body.get("tools") or []))
        )


def _args(raw: JSONValue) -> JSONValue:
    if isinstance(raw, dict):
        return raw
    try:
        parsed: JSONValue = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None  # did not parse
    return parsed


def _calls(msg: JSONObject) -> list[JSONObject]:
    calls = msg.get("tool_calls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def _same_call(echo: JSONObject, sent: JSONObject) -> bool:
    """`echo` is the Teacher's call `sent` as OpenCode resends it: same id; the same name (or its lower case,
    OpenCode's repair of a misspelt tool) and arguments equal as parsed JSON; or OpenCode's own `invalid` call
    naming it (a call it could not run: arguments that did not parse, an unknown tool)."""
    fe, fs = obj(echo.get("function")), obj(sent.get("function"))
    if echo.get("id") != sent.get("id"):
        return False
    got, parsed = _args(fe.get("arguments")), _args(fs.get("arguments"))
    if fe.get("name") == "invalid" and isinstance(got, dict) and got.get("tool") == fs.get("name"):
        return True
    name_ok = fe.get("name") in (fs.get("name"), str(fs.get("name") or "").lower())
    return name_ok and (got == parsed or parsed is None)


def check_echo(echo: JSONValue, reply: JSONObject, cut: bool = False) -> None:
    """`echo` (the assistant message of the next request) is `reply` as the Teacher sent it; with `cut` (the
    reply was cut, or the host interrupted the session while it came) also a beginning of it: its text a prefix
    of the reply's, its calls the first of the reply's calls."""
    if not isinstance(echo, dict) or echo.get("role") != "assistant":
        raise ChainBreak("the Teacher's reply is not the next message", reply, echo)
    # Compared without leading and trailing blanks: OpenCode may leave out a blank text part; no word can change.
    got, sent = text_of(echo.get("content")).strip(), text_of(reply.get("content")).strip()
    if got != sent and not (cut and sent.startswith(got)):
        raise ChainBreak("the assistant message's text is not the Teacher's", sent, got)
    reasoning = echo.get("reasoning_content")  # OpenCode may leave it out, never change it
    if reasoning and reasoning != reply.get("reasoning_content") and not cut:
        raise ChainBreak(
            "the assistant message's reasoning is not the Teacher's",
            reply.get("reasoning_content"),
            reasoning,
        )
    if reasoning and cut and not str(reply.get("reasoning_content") or "").startswith(str(reasoning)):
        raise ChainBreak(
            "the assistant message's reasoning is not the Teacher's",
            reply.get("reasoning_content"),
            reasoning,
        )
    ce, cs = _calls(echo), _calls(reply)
    if cut:
        cs = cs[: len(ce)]
    if len(ce) != len(cs) or not all(_same_call(e, s) for e, s in zip(ce, cs, strict=True)):
        raise ChainBreak("the assistant message's tool calls are not the Teacher's", cs, ce)


@dataclass
class SessionChain:
    """One edge's session as the proxy has seen it; `check` takes each agent request in turn."""

    pristine: Pristine | None
    base: list[JSONValue] = field(default_factory=list)  # the node's session (no system messages)
    history: list[JSONValue] | None = None  # the last accepted request's messages (no system messages)
    reply: JSONObject | None = None  # the Teacher's reply to it, as received; None: none came, or it failed
    reply_cut: bool = False  # the reply was cut or refused: OpenCode may resend the request or keep what came
    prompt: str | None = None  # the prompt the host sent and OpenCode has not carried yet
    workdir: str = ""  # the edge's working directory as OpenCode sees it (masked in the system prompt)
    interrupted_at_last: bool = False  # the host interrupted the session since the last accepted request

    def expect_prompt(self, text: str) -> None:
        self.prompt = text

    def state(self) -> JSONObject:
        """What a child's session goes on from (kept beside the node's session store): the last accepted request,
        the reply to it, and whether OpenCode may have kept that reply only in part or not at all."""
        return {
            "history": self.history,
            "reply": self.reply,
            "cut": self.reply_cut or self.interrupted_at_last,
        }

    @classmethod
    def resume(cls, pristine: Pristine | None, state: JSONObject, workdir: str = "") -> SessionChain:
        """A child edge's chain: its session is its parent's as the parent's chain last saw it (`state`, which
        the host kept beside the parent's session store)."""
        history, reply = state.get("history"), state.get("reply")
        return cls(
            pristine, history=history if isinstance(history, list) else None,
            reply=reply if isinstance(reply, dict) else None, reply_cut=bool(state.get("cut")),
            interrupted_at_last=bool(state.get("cut")), workdir=workdir,
        )  # fmt: skip

    def check(self, body: JSONObject) -> None:
        """Raise ChainBreak unless `body` extends the session; on success it becomes the previous request."""
        system, sent = split(body)
        rest = [plain(m) for m in sent]  # compared without OpenCode's caching marks (and kept so)
        if self.pristine is not None:
            if canonical(plain(body.get("tools") or [])) != self.pristine.tools:
                raise ChainBreak(
                    "the tool list is not OpenCode's", self.pristine.tools, canonical(body.get("tools") or [])
                )
            if tuple(masked_system(s, self.workdir) for s in system) != self.pristine.system:
                raise ChainBreak("the system prompt is not OpenCode's", self.pristine.system, system)
        if any(isinstance(m, dict) and m.get("role") == "system" for m in rest):
            raise ChainBreak("a system message after the first user message", None, rest)
        prev = [plain(m) for m in self.base] if self.history is None else self.history
        options = [self._extended(prev, rest)]
        if self.history is not None and (self.reply is None or self.reply_cut):
            options.append(self._tail(prev, rest, len(prev)))  # the same request again (a retry)
        errors = []
        for attempt in options:
            try:
                attempt()
            except ChainBreak as exc:
                errors.append(exc)
                continue
            self.history, self.reply, self.reply_cut, self.interrupted_at_last = rest, None, False, False
            return
        raise errors[0]

    def answered(self, reply: JSONObject | None, cut: bool) -> None:
        """The Teacher's reply to the last accepted request (None: none came), as the proxy received it."""
        # A reply that ends after the host's interrupt may have been dropped by OpenCode all the same.
        self.reply, self.reply_cut = reply, cut or reply is None or self.interrupted_at_last

    def interrupted(self) -> None:
        """The host interrupted the session (a turn's end): OpenCode may keep the last reply whole, in part, or
        not at all."""
        self.reply_cut = self.interrupted_at_last = True

    def _extended(self, prev: list[JSONValue], rest: list[JSONValue]) -> Callable[[], None]:
        def run() -> None:
            if rest[: len(prev)] != prev:
                i = next(
                    (k for k, (a, b) in enumerate(zip(prev, rest, strict=False)) if a != b),
                    min(len(prev), len(rest)),
                )
                raise ChainBreak(
                    f"message {i} is not the session's", prev[i] if i < len(prev) else None,
                    rest[i] if i < len(rest) else None,
                )  # fmt: skip
            at = len(prev)
            reply = self.reply if self.history is not None else None
            if reply is not None:
                empty = not text_of(reply.get("content")).strip() and not _calls(reply)
                echo = rest[at] if at < len(rest) else None
                kept: JSONValue = reply
                if not (empty and obj(echo).get("role") != "assistant"):  # no echo of an empty reply
                    try:
                        check_echo(echo, reply, self.reply_cut)
                    except ChainBreak:
                        if not self.reply_cut or (isinstance(echo, dict) and echo.get("role") == "assistant"):
                            raise
                        kept = None  # a cut reply OpenCode did not keep
                    else:
                        at += 1
                        kept = echo  # its calls (all, or the first of a cut reply) have results next
                for call in _calls(obj(kept)):
                    m = rest[at] if at < len(rest) else None
                    if not (
                        isinstance(m, dict)
                        and m.get("role") == "tool"
                        and m.get("tool_call_id") == call.get("id")
                    ):
                        raise ChainBreak(
                            "the tool results are not those of the Teacher's calls", call.get("id"), m
                        )
                    at += 1
            self._tail(prev, rest, at)()

        return run

    def _tail(self, prev: list[JSONValue], rest: list[JSONValue], at: int) -> Callable[[], None]:
        def run() -> None:
            if rest[: min(at, len(prev))] != prev[: min(at, len(prev))]:
                raise ChainBreak("the request does not repeat the session", prev, rest)
            tail = rest[at:]
            if self.prompt is None and not tail:
                return
            if (
                self.prompt is not None
                and len(tail) == 1
                and isinstance(tail[0], dict)
                and tail[0].get("role") == "user"
                and text_of(tail[0].get("content")) == self.prompt
            ):
                self.prompt = None
                return
            raise ChainBreak(
                "messages the host did not send" if tail else "the host's prompt is missing",
                self.prompt, tail,
            )  # fmt: skip

        return run
