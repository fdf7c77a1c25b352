"""`teacher.logprobs: K`: the Teacher's sampled tokens, their log-probabilities and the top-K, asked for through
the one Teacher client, kept compactly where the server gives them, streamed or not; absent, refused or
misaligned ones never invented (teacher/logprobs.py). Against teacher-sim over HTTP (its toy distribution) and,
for shapes it does not make, a scripted server."""

from __future__ import annotations

import json

import pytest

from sftree.agents.nativetools import TOOL_SCHEMAS
from sftree.errors import InputError
from sftree.teacher.client import TeacherClient, TeacherError
from sftree.teacher.logprobs import Unusable, parse, read_logprobs, request_fields
from sftree.teacher.sim.server import start_teacher_sim
from sftree.teacher.stream import StreamAssembler

MSGS = [
    {"role": "system", "content": "You are a careful engineer. " * 20},
    {"role": "user", "content": "Go."},
]
HEADERS = {"X-Sftree-Edge": "e1", "X-Sftree-Turn": "1"}


@pytest.fixture
def sims():
    stops = []

    def start(**opts):
        url, stop = start_teacher_sim(port=0, **opts)
        stops.append(stop)
        return url

    yield start
    for stop in stops:
        stop()


def client(url, **kw):
    kw = {"retries": 1, "backoff_base": 0.01, "backoff_max": 0.02, "health_timeout": 5, **kw}
    return TeacherClient.from_config({"base_url": url, "model": "default", **kw})


def token(tid, text, lp, top=()):
    return {"id": tid, "token": text, "logprob": lp, "top_logprobs": [
        {"id": i, "token": t, "logprob": p} for i, t, p in top]}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_logprobs_are_kept_aligned_with_the_reply_streamed_or_not(sims, stream):
    url = sims(seed=3)
    comp = client(url, logprobs=5, stream=stream).chat(MSGS, TOOL_SCHEMAS, headers=HEADERS)
    lp = comp.logprobs
    assert lp is not None and lp["k"] == 5 and comp.logprobs_dropped is None
    n = comp.usage.completion_tokens
    assert len(lp["ids"]) == len(lp["logprobs"]) == len(lp["top_ids"]) == len(lp["top_logprobs"]) == n
    assert "tokens" not in lp  # the server gave ids: no text kept
    assert all(len(t) == 5 for t in lp["top_ids"]) and all(p <= 0 for p in lp["logprobs"])
    # the sampled token's logprob is its own entry among the alternatives wherever it is one of them
    found = [lp["top_logprobs"][i][t.index(lp["ids"][i])] == lp["logprobs"][i]
             for i, t in enumerate(lp["top_ids"]) if lp["ids"][i] in t]  # fmt: skip
    assert found and all(found)


def test_streamed_and_plain_logprobs_are_the_same(sims):
    url = sims(seed=3)
    a = client(url, logprobs=3, stream=False).chat(MSGS, TOOL_SCHEMAS, headers=HEADERS)
    b = client(url, logprobs=3, stream=True).chat(MSGS, TOOL_SCHEMAS, headers=HEADERS)
    assert a.logprobs == b.logprobs and a.message == b.message


def test_off_by_default_nothing_asked_nothing_kept(sims):
    url = sims()
    c = client(url)
    assert "logprobs" not in c.request_body(MSGS, TOOL_SCHEMAS) and request_fields(0) == {}
    assert c.chat(MSGS, TOOL_SCHEMAS, headers=HEADERS).logprobs is None
    body = client(url, logprobs=4).request_body(MSGS, None)
    assert (body["logprobs"], body["top_logprobs"]) == (True, 4)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_server_without_ids_keeps_token_text_instead(sims, stream):
    url = sims(fault_rate={"logprobs_text": 1.0})
    lp = client(url, logprobs=2, stream=stream).chat(MSGS, TOOL_SCHEMAS, headers=HEADERS).logprobs
    assert lp is not None and "ids" not in lp and "top_ids" not in lp
    assert len(lp["tokens"]) == len(lp["logprobs"]) and all(len(t) == 2 for t in lp["top_tokens"])


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_misaligned_logprobs_are_dropped_with_a_named_note(sims, stream):
    url = sims(fault_rate={"logprobs_misaligned": 1.0})
    comp = client(url, logprobs=2, stream=stream).chat(MSGS, TOOL_SCHEMAS, headers=HEADERS)
    assert comp.logprobs is None
    assert (
        comp.logprobs_dropped.startswith("misaligned:") and "usage.completion_tokens" in comp.logprobs_dropped
    )
    assert not comp.notes  # not a normalisation note: the reply stays trainable


def test_a_top_k_the_server_refuses_is_a_clear_error(sims):
    url = sims()
    with pytest.raises(TeacherError, match=r"teacher.logprobs: 21 refused .*HTTP 400.*top_logprobs"):
        client(url, logprobs=21).chat(MSGS, TOOL_SCHEMAS, headers=HEADERS)


def test_the_schema_bounds_k():
    from sftree.config import load_config

    with pytest.raises(InputError, match="teacher.logprobs"):
        load_config(overrides={"teacher": {"logprobs": 21}, "agent": {"backend": "native"}})
    # both backends ask for them: the OpenCode backend's recording proxy adds them on the way out
    assert load_config(overrides={"teacher": {"logprobs": 5}, "agent": {"backend": "opencode"}})


def test_a_server_that_sends_none_is_recorded_absent():
    assert read_logprobs({"message": {}}, 5, max_tokens=10, completion_tokens=3) == (None, "absent")
    assert read_logprobs({"message": {}}, 0, max_tokens=10, completion_tokens=3) == (None, None)


@pytest.mark.parametrize(
    "content, why",
    [
        ("nope", "malformed:content is a str"),
        ([token(1, "a", 0.5)], "malformed:content[0].logprob is not a finite number <= 0"),
        ([token(1, "a", float("nan"))], "malformed:content[0].logprob"),
        ([{"logprob": -1.0}], "malformed:content[0] has neither id nor token"),
        ([token(-3, "a", -1.0)], "malformed:content[0].id is not a token id"),
        (["x"], "malformed:content[0] is not an object"),
        ([token(1, "a" * 300, -1.0)], "malformed:content[0].token is longer than 256"),
        (
            [token(1, "a", -1.0, [(1, "a", -1.0), (2, "b", -2.0), (3, "c", -3.0)])],
            "misaligned:content[0] has 3",
        ),
        ([token(i, "a", -1.0) for i in range(11)], "misaligned:11 tokens for max_tokens 10"),
        ([token(i, "a", -1.0) for i in range(5)], "misaligned:5 tokens for usage.completion_tokens 3"),
    ],
)
def test_bad_logprobs_are_named(content, why):
    with pytest.raises(Unusable, match=why.replace("[", r"\[").replace("]", r"\]")):
        parse(content, 2, max_tokens=10, completion_tokens=3 if "usage" in why else None)


def test_a_token_count_one_under_the_usage_is_aligned():
    """Servers that count the end-of-turn token in the usage without listing it."""
    lp = parse(
        [token(7, "a", -0.25, [(7, "a", -0.25)]), token(8, "b", -1.0)], 1, max_tokens=9, completion_tokens=3
    )
    assert lp == {"k": 1, "logprobs": [-0.25, -1.0], "top_logprobs": [[-0.25], []], "ids": [7, 8],
                  "top_ids": [[7], []]}  # fmt: skip


def test_the_stream_assembler_joins_the_chunks_logprobs():
    asm = StreamAssembler()
    for piece in ([token(1, "He", -0.1)], [token(2, "llo", -0.2)]):
        chunk = {
            "choices": [{"index": 0, "delta": {"content": piece[0]["token"]}, "logprobs": {"content": piece}}]
        }
        asm.feed(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    asm.feed(b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
    choice = asm.completion()["choices"][0]
    assert [t["id"] for t in choice["logprobs"]["content"]] == [1, 2]
    plain = StreamAssembler()
    plain.feed(
        b'data: {"choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": "stop"}]}\n\n'
    )
    assert "logprobs" not in plain.completion()["choices"][0]  # none sent: none made up
