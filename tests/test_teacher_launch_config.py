"""`teacher.launch` and `teacher.tool_choice` without a model: config, request bodies, launcher failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sftree.agents.nativetools import TOOL_SCHEMAS
from sftree.config import REPO_ROOT, load_config
from sftree.errors import InputError, TeacherUnavailable
from sftree.teacher.client import TeacherClient
from sftree.teacher.llm_server import DEFAULT_BINARY, LaunchSpec, start_llm_server

MSGS = [{"role": "user", "content": "hi"}]


def body(**kw) -> dict:
    c = TeacherClient.from_config({"base_url": "http://127.0.0.1:1/v1", **kw})
    return c.request_body(MSGS, TOOL_SCHEMAS)


def test_tool_choice_required_is_sent_and_auto_is_left_out():
    assert body(tool_choice="required")["tool_choice"] == "required"
    assert "tool_choice" not in body(tool_choice="auto") and "tool_choice" not in body()
    # no tools in the request (a title call): nothing to choose from, so no tool_choice either
    c = TeacherClient.from_config({"tool_choice": "required"})
    assert "tool_choice" not in c.request_body(MSGS, None)


def test_constrain_tool_call_sends_a_response_format_built_from_the_tools_only():
    """`teacher.constrain: tool_call`: a `response_format` JSON schema that is one call of one offered tool, with
    that tool's own parameter schema (nothing else: no commands, no paths); left out without tools or by default."""
    b = body(constrain="tool_call", tool_choice="required")
    rf = b["response_format"]
    assert rf["type"] == "json_schema" and b["tool_choice"] == "required"
    alts = rf["json_schema"]["schema"]["anyOf"]
    assert [a["properties"]["name"] for a in alts] == [{"const": t["function"]["name"]} for t in TOOL_SCHEMAS]
    assert [a["properties"]["arguments"] for a in alts] == [t["function"]["parameters"] for t in TOOL_SCHEMAS]
    assert all(a["required"] == ["name", "arguments"] and a["additionalProperties"] is False for a in alts)
    assert "response_format" not in body() and "response_format" not in body(constrain="none")
    c = TeacherClient.from_config({"constrain": "tool_call"})
    assert "response_format" not in c.request_body(MSGS, None)  # a title call: no tools, no constraint
    with pytest.raises(ValueError, match="constrain"):
        TeacherClient.from_config({"constrain": "grammar"})


def test_constrain_tool_call_required_keeps_only_required_arguments():
    """`teacher.constrain: tool_call_required`: each tool's arguments cut to its required properties (bash: command
    and description, no `workdir`/`timeout`), no other property allowed; the `tools` sent are unchanged."""
    b = body(constrain="tool_call_required", tool_choice="required")
    assert b["tools"] == TOOL_SCHEMAS
    args = {a["properties"]["name"]["const"]: a["properties"]["arguments"]
            for a in b["response_format"]["json_schema"]["schema"]["anyOf"]}  # fmt: skip
    assert list(args) == [t["function"]["name"] for t in TOOL_SCHEMAS]
    assert list(args["bash"]["properties"]) == ["command", "description"]
    assert args["bash"]["required"] == ["command", "description"]
    assert list(args["read"]["properties"]) == ["filePath"] and list(args["glob"]["properties"]) == [
        "pattern"
    ]
    assert list(args["edit"]["properties"]) == ["filePath", "oldString", "newString"]
    assert all(a["additionalProperties"] is False for a in args.values())
    for t in TOOL_SCHEMAS:  # each kept property is the tool's own schema for it
        p = t["function"]["parameters"]
        kept = args[t["function"]["name"]]["properties"]
        assert kept == {k: p["properties"][k] for k in p["required"]}


def test_required_only_leaves_odd_schemas_as_they_are():
    from sftree.teacher.params import required_only

    assert required_only({"type": "object"}) == {"type": "object"}  # no properties: nothing to cut
    assert required_only({"type": "string"}) == {"type": "string"}
    # a required name with no property schema is dropped (the schema would require what it cannot describe)
    cut = required_only(
        {"type": "object", "properties": {"a": {"type": "string"}, "b": {}}, "required": ["a", "z"]}
    )
    assert cut == {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
                   "additionalProperties": False}  # fmt: skip


def test_teacher_seed_is_sent_per_request_reproducible_and_different_per_edge():
    """`teacher.seed`: each request's `seed` is a function of the base seed, tree, edge, attempt, turn and the
    session's length: the same request gets the same seed; sibling edges (identical first requests) do not."""
    from sftree.teacher.params import request_seed

    c = TeacherClient.from_config({"base_url": "http://127.0.0.1:1/v1", "seed": 7})
    h = {"X-Sftree-Tree": "t", "X-Sftree-Edge": "e1", "X-Sftree-Attempt": "1", "X-Sftree-Turn": "1"}
    s1 = c.request_body(MSGS, TOOL_SCHEMAS, h)["seed"]
    assert s1 == c.request_body(MSGS, TOOL_SCHEMAS, dict(h))["seed"] == request_seed(7, h, 1)
    assert 0 <= s1 < 2**31
    others = {
        request_seed(8, h, 1),
        request_seed(7, {**h, "X-Sftree-Edge": "e2"}, 1),
        request_seed(7, {**h, "X-Sftree-Attempt": "2"}, 1),
        request_seed(7, {**h, "X-Sftree-Turn": "2"}, 1),
        request_seed(7, {**h, "X-Sftree-Tree": "u"}, 1),
        request_seed(7, h, 3),
    }
    assert s1 not in others and len(others) == 6
    assert "seed" not in body()  # null (default): not sent, the server picks
    assert body(seed=0)["seed"] == request_seed(0, None, 1)
    assert body(seed=1, extra_body={"seed": 5})["seed"] == 5  # extra_body still has the last word


def test_constrained_json_reply_becomes_a_tool_call():
    """What llama-server answers under the constraint (content = one JSON call, no `tool_calls`; shape as recorded
    from the real server) is read as a tool call by `normalize`."""
    from sftree.teacher.response import normalize

    content = (
        '{\n  "name": "bash",\n  "arguments": {\n    "command": "ls",\n    "description": "list"\n  }\n}'
    )
    reply = normalize({"choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": content}}]},
                      {t["function"]["name"] for t in TOOL_SCHEMAS})  # fmt: skip
    (call,) = reply.message["tool_calls"]
    assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"])["command"] == "ls"
    assert reply.message["content"] == "" and reply.notes == ["text_tool_calls:json"]


def test_constrained_json_reply_with_arguments_first_becomes_a_tool_call():
    """The grammar lets the model write the call's keys in either order; the real model often opens with
    `"arguments"` (seen in replies cut at max_tokens, docs/real_teacher.md). Order does not matter to `normalize`."""
    from sftree.teacher.response import normalize

    content = '{\n    "arguments": {\n        "command": "tsp",\n        "description": "A fast tour"\n    },\n    "name": "bash"\n}'
    reply = normalize({"choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": content}}]},
                      {t["function"]["name"] for t in TOOL_SCHEMAS})  # fmt: skip
    (call,) = reply.message["tool_calls"]
    assert call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "tsp", "description": "A fast tour"}
    assert reply.notes == ["text_tool_calls:json"]


def test_config_schema_takes_launch_and_tool_choice(tmp_path):
    cfg = yaml.safe_load((REPO_ROOT / "examples/real.yaml").read_text())
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    loaded = load_config(p)
    assert loaded["teacher"]["tool_choice"] == "required" and loaded["teacher"]["launch"] == {"threads": 1}
    assert load_config(REPO_ROOT / "config.yaml")["teacher"]["launch"] is None
    assert loaded["teacher"]["constrain"] == "tool_call_required" and loaded["teacher"]["seed"] == 0
    default = load_config(REPO_ROOT / "config.yaml")["teacher"]
    assert default["constrain"] == "none" and default["seed"] is None
    for bad in (
        {"tool_choice": "any"},
        {"constrain": "grammar"},
        {"seed": "fixed"},
        {"seed": 1.5},
        {"launch": {"modle": "x.gguf"}},
        {"launch": {"ctx_size": 10}},
    ):
        cfg["teacher"] = bad
        p.write_text(yaml.safe_dump(cfg))
        with pytest.raises(InputError):
            load_config(p)


def test_launch_spec_paths_and_command(tmp_path):
    spec = LaunchSpec.from_config(
        {"model": "m.gguf", "chat_template_file": None, "extra_args": ["--seed", 3]}
    )
    assert spec.binary == DEFAULT_BINARY and spec.model == REPO_ROOT / "m.gguf"
    cmd = spec.command(4242)
    assert cmd[0] == str(DEFAULT_BINARY) and "--jinja" in cmd and "--chat-template-file" not in cmd
    assert cmd[cmd.index("--port") + 1] == "4242" and cmd[-2:] == ["--seed", "3"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"  # never on other interfaces
    with_tpl = LaunchSpec.from_config({"chat_template_file": str(tmp_path / "t.jinja")}).command(1)
    assert with_tpl[with_tpl.index("--chat-template-file") + 1] == str(tmp_path / "t.jinja")


def test_missing_binary_or_model_is_named(tmp_path):
    spec = LaunchSpec.from_config({"binary": str(tmp_path / "nope")})
    with pytest.raises(InputError, match=r"llama-server binary not found at .*nope.*install_llm_server"):
        start_llm_server(spec)
    spec = LaunchSpec.from_config({"binary": "/bin/true", "model": str(tmp_path / "no.gguf")})
    with pytest.raises(InputError, match=r"model file not found at .*no\.gguf"):
        start_llm_server(spec)


def test_server_that_dies_before_health_is_reported(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    log = tmp_path / "server.log"
    spec = LaunchSpec.from_config({"binary": "/bin/false", "model": str(model), "chat_template_file": None,
                                   "log_file": str(log), "startup_timeout": 20})  # fmt: skip
    with pytest.raises(TeacherUnavailable, match=r"exited with code 1 before /health.*/bin/false --model"):
        start_llm_server(spec)
    assert log.exists()


def test_fixture_files_are_real_llama_server_replies():
    """Every recorded fixture names the server and model it came from, and its request and reply are whole."""
    files = sorted((Path(__file__).parent / "fixtures" / "real_responses").glob("*.json"))
    assert files
    for f in files:
        doc = json.loads(f.read_text())
        assert doc["server"].startswith("llama-server") and doc["model"].endswith(".gguf"), f
        assert doc["request"]["messages"] and doc["response"]["choices"][0]["message"]["role"] == "assistant"
        assert doc["response"]["usage"]["prompt_tokens"] > 0


def test_config_schema_takes_the_stream_keys_and_the_qwen_example(tmp_path):
    default = load_config(REPO_ROOT / "config.yaml")["teacher"]
    assert (default["stream"], default["first_chunk_timeout"], default["stall_timeout"], default["fleet_poll"]) == (
        True, 300, 60, 2)  # fmt: skip
    qwen = load_config(REPO_ROOT / "examples/real_qwen.yaml")["teacher"]
    spec = LaunchSpec.from_config(qwen["launch"])
    assert spec.model.name == "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf" and spec.chat_template_file is None
    assert "--chat-template-file" not in spec.command(1234) and qwen["constrain"] == "tool_call_required"
    cfg = yaml.safe_load((REPO_ROOT / "examples/real.yaml").read_text())
    p = tmp_path / "c.yaml"
    for bad in ({"stream": "yes"}, {"stall_timeout": 0}, {"first_chunk_timeout": -1}, {"fleet_poll": -2}):
        cfg["teacher"] = bad
        p.write_text(yaml.safe_dump(cfg))
        with pytest.raises(InputError):
            load_config(p)


def test_constrain_is_refused_with_the_opencode_backend_and_the_real_opencode_overlay_loads():
    """`teacher.constrain` is the native client's: with `agent.backend: opencode` it would be silently ignored (the
    proxy passes OpenCode's requests on), so the config refuses it, naming the field (docs/real_teacher.md)."""
    with pytest.raises(
        InputError, match="teacher.constrain: 'tool_call_required' is applied by the native agent"
    ):
        load_config(REPO_ROOT / "examples/real.yaml", {"agent": {"backend": "opencode"}})
    assert load_config(REPO_ROOT / "examples/real.yaml")["teacher"]["constrain"] == "tool_call_required"
    cfg = load_config(REPO_ROOT / "examples/real_opencode.yaml")
    assert cfg["agent"]["backend"] == "opencode" and cfg["teacher"]["constrain"] == "none"
    launch = LaunchSpec.from_config(cfg["teacher"]["launch"])
    assert launch.chat_template_file.name == "Qwen2.5-fenced-json-calls.jinja"
    assert (REPO_ROOT / "scripts/templates" / launch.chat_template_file.name).exists()
