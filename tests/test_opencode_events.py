"""Pure parts of the opencode backend: event parsing, knowledge/eval detection, record enrichment, config."""

from __future__ import annotations

import json

import pytest

from sftree.agents.opencode import (
    DENIED,
    ENV_FLAGS,
    TurnEvents,
    apply_event,
    enrich_records,
    find_binary,
    is_eval,
    is_knowledge,
    opencode_config,
    session_messages,
    split_model,
)
from sftree.errors import InputError


def tool_event(call_id, tool, status, inp, out):
    state = {"status": status, "input": inp}
    state["output" if status == "completed" else "error"] = out
    return {
        "type": "tool_use",
        "sessionID": "ses_1",
        "part": {"type": "tool", "tool": tool, "callID": call_id, "state": state},
    }


def step_finish(total):
    return {
        "type": "step_finish",
        "sessionID": "ses_1",
        "part": {"type": "step-finish", "tokens": {"total": total, "input": total - 10, "output": 10}},
    }


def test_event_stream_counts_steps_tokens_errors_knowledge_and_eval():
    acc = TurnEvents()
    events = [
        {"type": "step_start", "sessionID": "ses_1", "part": {"type": "step-start"}},
        tool_event("c1", "glob", "completed", {"pattern": "**/*.md", "path": ".opencode/notes"}, "a.md"),
        step_finish(7686),
        tool_event("c2", "read", "error", {"filePath": "missing_2.py"}, "File not found: /w/missing_2.py"),
        step_finish(7753),
        tool_event("c3", "bash", "completed", {"command": 'coral eval -m "x"'}, "CORAL Eval (#6): 1.2\n"),
        step_finish(7817),
    ]
    for ev in events:
        apply_event(ev, acc)
    assert acc.session_id == "ses_1" and acc.steps == 3 and acc.tokens == 7817
    assert [(t.call_id, t.status, t.knowledge) for t in acc.tools] == [
        ("c1", "completed", True),
        ("c2", "error", False),
        ("c3", "completed", False),  # coral eval itself is not a knowledge action
    ]
    assert acc.tools[1].output == "File not found: /w/missing_2.py"
    assert acc.eval_call == "c3"


def test_a_call_opencode_could_not_parse_is_a_tool_error():
    """OpenCode answers a call with arguments that are not JSON (e.g. cut by `finish_reason: length`) through
    its `invalid` tool, which completes: by DESIGN.md it is a tool error (bad arguments)."""
    acc = TurnEvents()
    bad = "The arguments provided to the tool are invalid: Invalid input for tool bash: JSON parsing failed"
    apply_event(tool_event("c1", "invalid", "completed", {"tool": "bash", "error": "x"}, bad), acc)
    apply_event(tool_event("c2", "bash", "completed", {"command": "false"}, "exit 1"), acc)
    assert [(t.call_id, t.status) for t in acc.tools] == [("c1", "error"), ("c2", "completed")]
    assert acc.tools[0].output == bad


def test_knowledge_and_eval_detection():
    yes = [
        ("bash", {"command": "coral log -n 10"}),
        ("bash", {"command": "cd . && coral notes"}),
        ("bash", {"command": "ls .opencode/notes .opencode/attempts | head"}),
        ("bash", {"command": "cat .opencode/skills/fast/SKILL.md"}),
        ("write", {"filePath": "/tmp/sftree/workspace/.opencode/notes/a.md", "content": "x"}),
        ("grep", {"pattern": "ROWS", "path": ".opencode/attempts"}),
        ("skill", {"name": "fast"}),
        ("read", {"filePath": "/k/notes/a.md"}),  # under the knowledge folder given by absolute path
    ]
    no = [
        ("bash", {"command": 'coral eval -m "tune ROWS"'}),
        ("bash", {"command": "python3 solution.py"}),
        ("read", {"filePath": "solution.py"}),
        ("edit", {"filePath": "opencode_notes.py", "oldString": "a", "newString": "b"}),
    ]
    assert [is_knowledge(t, i, "/w/agents/a", "/k") for t, i in yes] == [True] * len(yes)
    assert [is_knowledge(t, i, "/w/agents/a", "/k") for t, i in no] == [False] * len(no)
    assert is_eval("bash", {"command": 'cd x && coral eval -m "m"'})
    assert not is_eval("bash", {"command": "coral evaluate"}) and not is_eval(
        "read", {"command": "coral eval"}
    )


def test_enrich_fills_results_from_next_request_and_cuts_after_eval():
    def rec(msgs, calls):
        return {
            "kind": "agent",
            "request": {"messages": msgs, "tools": []},
            "response": {"role": "assistant", "content": "", "tool_calls": calls},
            "tool_results": [],
        }

    def call(cid, name, args):
        return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}

    c1 = call("c1", "read", {"filePath": "missing.py"})
    c2 = call("c2", "bash", {"command": 'coral eval -m "m"'})
    base = [{"role": "user", "content": "go"}]
    r1 = rec(base, [c1])
    sent_error = "File not found: /w/missing.py"
    msgs2 = base + [r1["response"], {"role": "tool", "tool_call_id": "c1", "content": sent_error}]
    r2 = rec(msgs2, [c2])
    r3 = rec(
        msgs2 + [r2["response"], {"role": "tool", "tool_call_id": "c2", "content": "CORAL"}], []
    )  # slipped out
    acc = TurnEvents()
    apply_event(tool_event("c1", "read", "error", {"filePath": "missing.py"}, "File not found"), acc)
    apply_event(
        tool_event("c2", "bash", "completed", {"command": 'coral eval -m "m"'}, "CORAL Eval (#3): 2\n"), acc
    )
    out = enrich_records([r1, r2, r3], acc, acc.eval_call)
    assert len(out) == 2  # the request sent after the eval is not part of the turn
    assert out[0]["tool_results"] == [
        {"tool_call_id": "c1", "name": "read", "content": sent_error, "error": True, "knowledge": False}
    ]
    assert out[1]["tool_results"][0]["content"] == "CORAL Eval (#3): 2\n"  # from the event: no next request
    msgs = session_messages(out)
    assert msgs[-1] == {"role": "tool", "tool_call_id": "c2", "content": "CORAL Eval (#3): 2\n"}
    assert msgs[-2]["tool_calls"][0]["function"]["arguments"] == '{"command":"coral eval -m \\"m\\""}'


def test_config_points_at_the_proxy_with_the_students_model_id_and_turns_compaction_off():
    cfg = opencode_config(
        "http://127.0.0.1:5/c/e1/v1",
        "sglang/Qwen3-8B",
        context_limit=400000,
        output_limit=4096,
        temperature=0.7,
        hidden=["/srv/task"],
        worktree="/workspace/agents/agent-1",
    )
    prov = cfg["provider"][
        "sglang"
    ]  # the Student's provider and model id: OpenCode's prompt is built for them
    assert (
        prov["npm"] == "@ai-sdk/openai-compatible"
        and prov["options"]["baseURL"] == "http://127.0.0.1:5/c/e1/v1"
    )
    assert prov["models"]["Qwen3-8B"]["limit"] == {"context": 400000, "output": 4096}
    assert prov["models"]["Qwen3-8B"]["temperature"] is True and cfg["agent"]["build"]["temperature"] == 0.7
    assert cfg["compaction"] == {"auto": False, "prune": False} and cfg["model"] == "sglang/Qwen3-8B"
    assert cfg["permission"]["external_directory"]["/srv/task/**"] == "deny"
    # the project is no configuration (OPENCODE_DISABLE_PROJECT_CONFIG): the host names what Coral puts there
    assert ENV_FLAGS["OPENCODE_DISABLE_PROJECT_CONFIG"] == "1"
    assert cfg["instructions"] == ["/workspace/agents/agent-1/AGENTS.md"]
    assert cfg["skills"] == {"paths": ["/workspace/agents/agent-1/.opencode/skills"]}
    # the tools that cannot work in an edge are denied where OpenCode merges last (OPENCODE_CONFIG_CONTENT)
    assert DENIED == {"task": "deny", "webfetch": "deny", "websearch": "deny", "question": "deny"}


def test_the_students_model_must_be_provider_slash_model():
    assert split_model("minimax/MiniMax-M2.5") == ("minimax", "MiniMax-M2.5")
    assert split_model("openrouter/qwen/qwen3-coder") == ("openrouter", "qwen/qwen3-coder")
    for bad in ("sonnet", "/x", "x/"):
        with pytest.raises(InputError, match=r"agent.student_model: .* `provider/model`"):
            split_model(bad)


def test_missing_binary_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("SFTREE_OPENCODE_BIN", raising=False)
    with pytest.raises(InputError, match=r"agent.opencode.binary: .*not an executable.*install_opencode.sh"):
        find_binary(str(tmp_path / "opencode"))
    monkeypatch.setenv("SFTREE_OPENCODE_BIN", str(tmp_path / "nope"))
    with pytest.raises(InputError, match=r"SFTREE_OPENCODE_BIN"):
        find_binary("opencode")
