"""A real llama-server reply streamed equals the same reply not streamed (`teacher.stream`), with both models.

Qwen2.5-Coder-0.5B-Instruct with its own chat template and `tool_choice: auto` (unconstrained sampling) writes
its calls as JSON in a ```json fence, which `normalize` reads as calls (llama.cpp's Hermes parser never sees the
`<tool_call>` it waits for: docs/real_teacher.md); SmolLM2-135M under `constrain: tool_call_required` answers
one JSON call as content. Each request is sent three times with its
seed: not streamed (the server's cache is cold), not streamed again and streamed (both warm; llama-server's
sampling depends on the cache state, docs/real_teacher.md), and the last two must agree on the message (tool
calls with their arguments), finish_reason and usage. Only llama-server's random tool-call ids differ.
"""

from __future__ import annotations

import copy

import pytest

from sftree.agents.nativetools import TOOL_SCHEMAS
from sftree.teacher.client import TeacherClient
from sftree.teacher.llm_server import LaunchSpec, start_llm_server

QWEN = ".tools/llama.cpp/models/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"
SYSTEM = {"role": "system", "content": "You are a coding agent. Work only through the tools you are given."}
TASK = {"role": "user", "content": 'Read solution.py, then improve the score and run `coral eval -m "..."`.'}
CASES = {
    "qwen-own-template": ({"model": QWEN, "chat_template_file": None}, {"tool_choice": "auto"}),
    "smollm-constrained": ({}, {"tool_choice": "required", "constrain": "tool_call_required"}),
}
pytestmark = [pytest.mark.llm, pytest.mark.slow]


def without_ids(message: dict) -> dict:
    m = copy.deepcopy(message)
    for tc in m.get("tool_calls", []):
        tc.pop("id", None)
    return m


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_streamed_real_reply_is_the_non_streamed_reply(tmp_path, case):
    launch, teacher = CASES[case]
    spec = LaunchSpec.from_config({**launch, "log_file": str(tmp_path / "server.log")})
    if spec.missing():
        pytest.skip(f"no real model: {spec.missing()}")
    url, stop = start_llm_server(spec)
    try:
        opts = {"max_tokens": 96, "temperature": 0.7, "seed": 3, "health_timeout": 60, "request_timeout": 600,
                "first_chunk_timeout": 600, **teacher}  # fmt: skip
        plain, streamed = (
            TeacherClient.from_config({"base_url": url, "stream": False, **opts}),
            TeacherClient.from_config({"base_url": url, "stream": True, **opts}),
        )
        headers = {"X-Sftree-Edge": "e1", "X-Sftree-Turn": "1"}
        cold = plain.chat([SYSTEM, TASK], TOOL_SCHEMAS, headers=headers)
        warm = plain.chat([SYSTEM, TASK], TOOL_SCHEMAS, headers=headers)
        live = streamed.chat([SYSTEM, TASK], TOOL_SCHEMAS, headers=headers)
    finally:
        stop()
    assert warm.usage.cached_tokens > 0 and cold.usage.prompt_tokens == warm.usage.prompt_tokens
    assert without_ids(live.message) == without_ids(warm.message)
    assert live.finish_reason == warm.finish_reason and live.notes == warm.notes
    assert live.usage == warm.usage
    if live.message.get("tool_calls"):  # the calls, with their arguments, were assembled from the chunks
        assert {tc["function"]["name"] for tc in live.message["tool_calls"]} <= {
            t["function"]["name"] for t in TOOL_SCHEMAS
        }
    print(case, live.finish_reason, live.usage, live.message)
