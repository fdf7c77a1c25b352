"""OpenAI chat-completion SSE chunks folded into the one non-streaming completion they stand for.

One assembler for both readers of a stream: `TeacherClient` (`teacher.stream: true`, docs/failures.md, "Stalled
and dying servers") and the OpenCode recording proxy (`agents/proxy.py`). `completion()` is what a server would
have answered without `stream: true` (the assistant message with `content`, `reasoning_content`, `tool_calls`
with their arguments joined, the legacy `function_call`, `finish_reason`, `usage`), so it goes through
`teacher.response.normalize` like any reply. What it does not know it keeps as sent: `tool_calls` deltas that
are not a list of call objects, a lone surrogate (normalize refuses both the same way).

Also kept for the client: whether `data: [DONE]` arrived (`done`), the first `error` object a chunk carried
(some servers report a failure mid-stream that way), the per-chunk `logprobs.content` pieces joined in order
(`logprobs`: None when no chunk carried any, so a reply without them stays without), and how many `data:` lines were not JSON objects
(`bad_lines`).
"""

from __future__ import annotations

import json
from typing import TypedDict

from sftree.jsontypes import WireObject


class _CallSlot(TypedDict):
    """One tool call as its deltas come: the id as sent, the name and the argument pieces joined."""

    id: object
    name: str
    args: list[str]


class StreamAssembler:
    """Folds OpenAI chat-completion SSE chunks into one assistant message, finish reason and usage."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, _CallSlot] = {}
        self.finish_reason: object = None  # as sent (normalize checks it is a string)
        self.usage: object = None  # as sent (normalize checks it)
        self.function_call: dict[str, str] | None = None  # the legacy field, joined like a tool call
        self.bad_tool_calls: object = None  # `tool_calls` that is not a list of call objects, kept as sent
        self.id: str | None = None
        self.done = False  # `data: [DONE]` seen
        self.error: object = None  # the first `error` a chunk carried
        self.logprobs: list[object] | None = None  # the chunks' `logprobs.content` entries, joined
        self.chunks = 0  # data lines that were JSON objects
        self.choices = 0  # choice objects the chunks carried (none: the reply had no `choices[0]`)
        self.bad_lines = 0  # data lines that were not
        self._buf = b""

    def feed(self, data: bytes) -> None:
        self._buf += data
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            self._line(line.strip())

    def close(self) -> None:
        if self._buf.strip():
            self._line(self._buf.strip())
        self._buf = b""

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if not payload:
            return
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            self.bad_lines += 1
            return
        if not isinstance(chunk, dict):
            self.bad_lines += 1
            return
        self.chunks += 1
        if chunk.get("error") is not None and self.error is None:
            self.error = chunk["error"]
        self.id = self.id or (chunk.get("id") if isinstance(chunk.get("id"), str) else None)
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            self.choices += isinstance(choice, dict)
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            if delta.get("content"):
                self.content.append(str(delta["content"]))
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                self.reasoning.append(str(reasoning))
            fc = delta.get("function_call")
            if isinstance(fc, dict):
                self.function_call = self.function_call or {"name": "", "arguments": ""}
                self.function_call["name"] += str(fc.get("name") or "")
                self.function_call["arguments"] += str(fc.get("arguments") or "")
            tcs = delta.get("tool_calls")
            if tcs is not None and not (isinstance(tcs, list) and all(isinstance(t, dict) for t in tcs)):
                self.bad_tool_calls = tcs if self.bad_tool_calls is None else self.bad_tool_calls
                tcs = None
            for tc in tcs or []:
                slot = self.calls.setdefault(
                    int(tc.get("index", len(self.calls))), {"id": None, "name": "", "args": []}
                )
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
                if fn.get("name"):
                    slot["name"] += str(fn["name"])
                if fn.get("arguments"):
                    slot["args"].append(str(fn["arguments"]))
            lp = choice.get("logprobs")
            if isinstance(lp, dict) and lp.get("content") is not None:
                piece = lp["content"]  # not a list: kept as sent, read_logprobs names it
                self.logprobs = (self.logprobs or []) + (piece if isinstance(piece, list) else [piece])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def message(self, *, fill_ids: bool = True) -> WireObject:
        """The assistant message. A call the server sent without an id gets `call_<index>` with `fill_ids`
        (the proxy's records, as before), else none, so `normalize` derives one exactly as it does for the
        same call in a non-streamed reply (the client)."""
        msg: WireObject = {"role": "assistant", "content": "".join(self.content)}
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        calls = []
        for i, slot in sorted(self.calls.items()):
            call: WireObject = {
                "type": "function",
                "function": {"name": slot["name"], "arguments": "".join(slot["args"])},
            }
            if slot["id"] or fill_ids:
                call = {"id": slot["id"] or f"call_{i}", **call}
            calls.append(call)
        if calls:
            msg["tool_calls"] = calls
        return msg

    def completion(self, *, fill_ids: bool = True) -> WireObject:
        """The stream as one non-streaming completion (what `teacher.response.normalize` reads)."""
        msg = self.message(fill_ids=fill_ids)
        if self.bad_tool_calls is not None:
            msg["tool_calls"] = self.bad_tool_calls
        if self.function_call is not None and not self.calls:
            msg["function_call"] = self.function_call
        # A stream whose chunks carried no choice at all (`"choices": []` throughout) answered nothing: it stays
        # without `choices[0]`, so normalize refuses it as malformed (retried) instead of an empty message.
        choice: WireObject = {"index": 0, "message": msg, "finish_reason": self.finish_reason}
        if self.logprobs is not None:
            choice["logprobs"] = {"content": self.logprobs}
        out: WireObject = {"id": self.id, "choices": [choice] if self.choices else []}
        if self.usage is not None:
            out["usage"] = self.usage
        return out
