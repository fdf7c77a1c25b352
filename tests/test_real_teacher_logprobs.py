"""`teacher.logprobs` against a real server: llama-server (b11434) with SmolLM2-135M answers `logprobs: true,
top_logprobs: K` with token ids, streamed and not; the client keeps them aligned with the server's own usage
(`usage.completion_tokens` tokens, or one less), each with its top-K, and the sampled token is among its top-K
wherever its logprob is at least the K-th's; streamed and non-streamed keep the same ids for the same reply (both
sent with a warm cache: llama-server's sampling depends on the cache state, docs/real_teacher.md)."""

from __future__ import annotations

import pytest

from sftree.agents.nativetools import TOOL_SCHEMAS
from sftree.teacher.client import TeacherClient
from sftree.teacher.llm_server import LaunchSpec, start_llm_server

pytestmark = [pytest.mark.llm]
SYSTEM = {"role": "system", "content": "You are a coding agent. Work only through the tools you are given."}
TASK = {"role": "user", "content": 'Read solution.py, then improve the score and run `coral eval -m "..."`.'}
K = 5


def test_a_real_server_gives_ids_and_top_k_aligned_with_its_usage(tmp_path):
    spec = LaunchSpec.from_config({"log_file": str(tmp_path / "server.log")})
    if spec.missing():
        pytest.skip(f"no real model: {spec.missing()}")
    url, stop = start_llm_server(spec)
    try:
        opts = {"max_tokens": 48, "temperature": 0.7, "seed": 3, "health_timeout": 60, "request_timeout": 300,
                "first_chunk_timeout": 300, "tool_choice": "required", "constrain": "tool_call_required",
                "logprobs": K}  # fmt: skip
        plain = TeacherClient.from_config({"base_url": url, "stream": False, **opts})
        streamed = TeacherClient.from_config({"base_url": url, "stream": True, **opts})
        headers = {"X-Sftree-Edge": "e1", "X-Sftree-Turn": "1"}
        plain.chat([SYSTEM, TASK], TOOL_SCHEMAS, headers=headers)  # warms the cache
        warm = plain.chat([SYSTEM, TASK], TOOL_SCHEMAS, headers=headers)
        live = streamed.chat([SYSTEM, TASK], TOOL_SCHEMAS, headers=headers)
    finally:
        stop()
    for comp in (warm, live):
        lp = comp.logprobs
        assert lp is not None and comp.logprobs_dropped is None, comp.logprobs_dropped
        n = len(lp["ids"])
        assert n in (comp.usage.completion_tokens, comp.usage.completion_tokens - 1)
        assert len(lp["logprobs"]) == len(lp["top_ids"]) == len(lp["top_logprobs"]) == n
        assert all(len(t) == K for t in lp["top_ids"]) and all(p <= 0 for p in lp["logprobs"])
        for i, tid in enumerate(lp["ids"]):
            tops = lp["top_logprobs"][i]
            assert tops == sorted(tops, reverse=True)
            if lp["logprobs"][i] > tops[-1] + 1e-4:  # above the K-th: it is one of the top-K
                assert tid in lp["top_ids"][i]
    assert live.logprobs["ids"] == warm.logprobs["ids"]
