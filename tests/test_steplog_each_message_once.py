"""Step records store each message once (sftree.records.steplog): exact rebuild, unchanged export, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.export import make_results, paths_file

from sftree.dataset.export import export_task
from sftree.errors import InputError
from sftree.records import steplog

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def session_records(steps: int, out_len=lambda i: 50 * i) -> list[dict]:
    """A growing session: each request = the previous one + its answer + the tool result; a title call and a
    compaction (a request sharing nothing) interleaved, and a failed last call."""
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    out = []
    for i in range(1, steps + 1):
        resp = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
            ],
        }
        out.append(
            {"turn": 1, "step": i, "kind": "agent", "request": {"model": "m", "messages": list(msgs), "tools": TOOLS},
             "response": resp, "tool_results": [{"tool_call_id": f"c{i}", "content": "x" * out_len(i)}],
             "usage": {"prompt_tokens": 10 * i, "completion_tokens": 3}, "latency_s": 0.5}
        )  # fmt: skip
        msgs += [resp, {"role": "tool", "tool_call_id": f"c{i}", "content": "x" * out_len(i)}]
        if i == 3:
            out.append({"turn": 1, "kind": "title", "request": {"model": "m", "messages": [{"role": "user", "content": "title?"}]},
                        "response": {"role": "assistant", "content": "T"}})  # fmt: skip
        if i == 6:  # compaction: the session is replaced by a summary
            msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "summary"}]
    out.append({"turn": 2, "step": 1, "kind": "agent", "request": {"model": "m", "messages": list(msgs), "tools": TOOLS},
                "response": None, "tool_results": [], "error": "teacher down"})  # fmt: skip
    return out


def write(path: Path, records: list[dict]) -> None:
    w = steplog.StepWriter(path)
    for r in records:
        w.write(r)
    w.close()


def test_rebuild_is_exact_and_each_message_stored_once(tmp_path):
    records = session_records(10)
    path = tmp_path / "e1" / "steps.jsonl"
    write(path, records)
    back = steplog.read_steps(path)
    assert back == records
    assert [json.dumps(r) for r in back] == [json.dumps(r) for r in records]  # key order too
    stored = [json.loads(x) for x in (path.parent / "messages.jsonl").read_text().splitlines()]
    distinct = {
        json.dumps(v)
        for r in records
        for v in [*r["request"]["messages"], r["request"].get("tools"), r["response"]]
        if v is not None
    }
    assert len(stored) == len(distinct) == len({s["id"] for s in stored})
    enc = [json.loads(x) for x in path.read_text().splitlines()]
    assert all("x" * 50 not in json.dumps(e["request"]) for e in enc)  # requests hold ids, not messages
    # step 5 reuses step 4's whole request and adds step 4's answer and tool message; the title call shares nothing
    assert enc[5]["request"]["messages"]["keep"] == len(records[4]["request"]["messages"])
    assert len(enc[5]["request"]["messages"]["add"]) == 2 and enc[5]["request"]["messages"]["base"] == 4
    assert enc[3]["kind"] == "title" and enc[3]["request"]["messages"]["keep"] == 0
    assert enc[4]["request"]["messages"]["base"] == 2  # the line before the title call


def test_storage_grows_linearly_with_steps(tmp_path):
    """Doubling a session's steps about doubles the stored bytes (inline requests would about quadruple them)."""

    def size(n: int) -> tuple[int, int]:
        recs = [r for r in session_records(n, out_len=lambda i: 200) if r["kind"] == "agent"]
        d = tmp_path / f"s{n}"
        write(d / "steps.jsonl", recs)
        encoded = sum(f.stat().st_size for f in d.iterdir())
        return encoded, sum(len(json.dumps(r)) for r in recs)

    (e40, i40), (e80, i80) = size(40), size(80)
    assert i80 / i40 > 3.5  # inline: quadratic
    assert e80 / e40 < 2.6  # stored once: linear (ids of the new messages only)


def test_export_unchanged_when_transcripts_are_reencoded(tmp_path):
    tree = make_results(tmp_path / "results")
    pf = paths_file(tree)
    before_step, _ = export_task([pf], "step")
    before_path, _ = export_task([pf], "path")
    edges = sorted((tree / "edges").glob("*/steps.jsonl"))
    assert edges
    for f in edges:  # the fixture is written inline (the older format); rewrite it the way edges write it now
        recs = [json.loads(x) for x in f.read_text().splitlines()]
        write(f, recs)
        assert '"enc": 1' in f.read_text()
    after_step, _ = export_task([pf], "step")
    after_path, _ = export_task([pf], "path")
    assert json.dumps(after_step) == json.dumps(before_step) and len(before_step) == 11
    assert json.dumps(after_path) == json.dumps(before_path) and before_path


@pytest.mark.parametrize(
    "damage, expect",
    [
        (
            lambda enc: enc[1]["request"]["messages"].update(add=["feedfeed"]),
            "feedfeed is not in messages.jsonl",
        ),
        (lambda enc: enc[1]["request"]["messages"].update(base=7), "base 7 is not an earlier record"),
        (lambda enc: enc[1]["request"]["messages"].update(keep=99), "keep 99 exceeds record 0"),
        (lambda enc: enc[1].update(enc=2), "unknown encoding 2"),
        (lambda enc: enc[1].update(response="hi"), 'record 2 response: expected {"$ref": id}'),
    ],
)
def test_damaged_transcript_is_a_clear_error(tmp_path, damage, expect):
    path = tmp_path / "steps.jsonl"
    write(path, session_records(3))
    enc = [json.loads(x) for x in path.read_text().splitlines()]
    damage(enc)
    path.write_text("".join(json.dumps(x) + "\n" for x in enc))
    with pytest.raises(InputError) as err:
        steplog.read_steps(path)
    assert str(path) in str(err.value) and expect in str(err.value)
