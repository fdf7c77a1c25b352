"""`teacher.logprobs` against a real server: llama-server (b11434) with SmolLM2-135M answers `logprobs: true,
top_logprobs: K` with token ids. The client keeps them aligned with the server's own usage (`usage.
completion_tokens` tokens, or one less), each with its top-K in order, the sampled token among its top-K wherever
its logprob is above the K-th's. Streamed, the server refuses logprobs for a request with tools ("logprobs is not
supported with tools + stream"): the client says which setting to change. Without tools it streams them, and the
assembler's ids are the non-streamed reply's (both sent with a warm cache: llama-server's sampling depends on the
cache state, docs/real_teacher.md)."""

from __future__ import annotations

import pytest

from sftree.agents.nativetools import TOOL_SCHEMAS
from sftree.teacher.client import TeacherClient, TeacherError
from sftree.teacher.llm_server import LaunchSpec, start_llm_server

pytestmark = [pytest.mark.llm]
SYSTEM = {"role": "system", "content": "You are a coding agent. Work only through the tools you are given."}
TASK = {"role": "user", "content": 'Read solution.py, then improve the score and run `coral eval -m "..."`.'}
K = 5
HEADERS = {"X-Sftree-Edge": "e1", "X-Sftree-Turn": "1"}


def check_aligned(comp) -> None:
    lp = comp.logprobs
    assert lp is not None and comp.logprobs_dropped is None, comp.logprobs_dropped
    n = len(lp["ids"])
    assert n > 0 and n in (comp.usage.completion_tokens, comp.usage.completion_tokens - 1)
    assert len(lp["logprobs"]) == len(lp["top_ids"]) == len(lp["top_logprobs"]) == n
    assert all(len(t) == K for t in lp["top_ids"]) and all(p <= 0 for p in lp["logprobs"])
    for i, tid in enumerate(lp["ids"]):
        tops = lp["top_logprobs"][i]
        assert tops == sorted(tops, reverse=True)
        if lp["logprobs"][i] > tops[-1] + 1e-4:  # above the K-th: it is one of the top-K
            assert tid in lp["top_ids"][i]


def test_a_real_server_gives_ids_and_top_k_aligned_with_its_usage(tmp_path):
    spec = LaunchSpec.from_config({"log_file": str(tmp_path / "server.log")})
    if spec.missing():
        pytest.skip(f"no real model: {spec.missing()}")
    url, stop = start_llm_server(spec)
    try:
        opts = {"max_tokens": 48, "temperature": 0.7, "seed": 3, "health_timeout": 60, "request_timeout": 300,
                "first_chunk_timeout": 300, "logprobs": K}  # fmt: skip
        calls = {"tool_choice": "required", "constrain": "tool_call_required"}
        plain = TeacherClient.from_config({"base_url": url, "stream": False, **opts, **calls})
        plain.chat([SYSTEM, TASK], TOOL_SCHEMAS, headers=HEADERS)  # warms the cache
        with_tools = plain.chat([SYSTEM, TASK], TOOL_SCHEMAS, headers=HEADERS)
        streamed = TeacherClient.from_config({"base_url": url, "stream": True, **opts, **calls})
        with pytest.raises(TeacherError, match=r"refused .*tools \+ stream.*set teacher.stream: false"):
            streamed.chat([SYSTEM, TASK], TOOL_SCHEMAS, headers=HEADERS)
        text_plain = TeacherClient.from_config({"base_url": url, "stream": False, **opts})
        text_streamed = TeacherClient.from_config({"base_url": url, "stream": True, **opts})
        text_plain.chat([SYSTEM, TASK], headers=HEADERS)
        warm = text_plain.chat([SYSTEM, TASK], headers=HEADERS)
        live = text_streamed.chat([SYSTEM, TASK], headers=HEADERS)
    finally:
        stop()
    for comp in (with_tools, warm, live):
        check_aligned(comp)
    assert live.logprobs == warm.logprobs and live.message == warm.message
