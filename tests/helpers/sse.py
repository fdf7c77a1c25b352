"""How the tests' Teachers stream a reply: OpenAI chat-completion chunks as server-sent events, the way
llama-server and SGLang send them (a role/content chunk, one chunk per tool call, the finish, the usage)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


def reply_chunks(
    message: dict, finish: str, usage: dict | None, rid: str = "chatcmpl-x", model: str = "test"
) -> list:
    base = {"id": rid, "object": "chat.completion.chunk", "created": 0, "model": model}
    deltas = []
    if message.get("reasoning_content"):
        deltas.append({"role": "assistant", "reasoning_content": message["reasoning_content"]})
    deltas.append({"role": "assistant", "content": message.get("content") or ""})
    deltas += [{"tool_calls": [{"index": i, **c}]} for i, c in enumerate(message.get("tool_calls") or [])]
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if usage is not None:
        chunks.append({**base, "choices": [], "usage": usage})
    return chunks


def send_sse_headers(handler: BaseHTTPRequestHandler) -> None:
    """A 200 with SSE headers, flushed; the connection closes after the stream."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.close_connection = True
    handler.wfile.flush()


def send_sse(handler: BaseHTTPRequestHandler, chunks: list) -> None:
    send_sse_headers(handler)
    handler.wfile.write(b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks))
    handler.wfile.write(b"data: [DONE]\n\n")
    handler.wfile.flush()
