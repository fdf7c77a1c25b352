"""The exported files as the trainers read them: TRL's own chat-template code with the newest `datasets`, and
LLaMA-Factory's own dataset_info parser, `openai` converter, template and supervised processor (mask_history)
with `datasets` 4.0. Each runs in its own virtual environment (scripts/install_consumers.sh) through a probe
script under tests/consumers/; this test compares what they read back with what sftree wrote."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.export import make_results

from sftree.dataset.llamafactory import THINK_WORDS, turn_boundaries
from sftree.dataset.select_paths import select_paths
from sftree.records.paths import write_paths
from sftree.records.sft import record_from_doc
from sftree.records.tree import Tree

REPO = Path(__file__).parents[1]
PROBES = Path(__file__).parent / "consumers"
VENVS = {"trl": REPO / ".venv-consumers-trl", "lf": REPO / ".venv-consumers-lf"}


def typed(doc):
    """A record as written, typed (records/sft.py's checking reader)."""
    return record_from_doc(doc, "a record")


def venv_python(name: str) -> str:
    py = VENVS[name] / "bin" / "python"
    if not py.is_file():
        pytest.skip(f"{VENVS[name].name} absent: run `bash scripts/install_consumers.sh` (.ci/run does)")
    return str(py)


def sftree(command: str, *args: str) -> None:
    res = subprocess.run([sys.executable, "-m", "sftree", command, *args], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def export(base: Path, granularity: str) -> Path:
    """Two tasks (maximize, minimize) exported and merged by the real command line."""
    files = []
    for task, direction in (("circle_packing", "maximize"), ("tsp", "minimize")):
        tree_dir = make_results(base, task, direction, "middle")
        doc = select_paths(Tree.from_doc(json.loads((tree_dir / "tree.json").read_text())), top_k=6)
        write_paths(tree_dir / "paths.json", doc)
        out = base / task / "sft.jsonl"
        sftree(
            "export-sft",
            "--paths",
            str(tree_dir / "paths.json"),
            "--out",
            str(out),
            "--granularity",
            granularity,
        )
        files.append(str(out))
    sftree(
        "merge-sft",
        *files,
        "--out",
        str(base / "sft.jsonl"),
        "--dataset-info",
        str(base / "dataset_info.json"),
        "--llamafactory-out",
        str(base / "sft_llamafactory.jsonl"),
        "--card",
        str(base / "dataset_card.md"),
        "--results",
        str(base),
    )
    return base


def probe(venv: str, script: str, *args: str | Path) -> dict:
    out = Path(args[-1]).parent / f"{script}.json"
    res = subprocess.run(
        [venv_python(venv), str(PROBES / script), *map(str, args[:-1]), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.read_text())


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def rendered_turn(msg: dict, call_sep: str, call_prefix: str) -> str:
    """Hand-written expectation of one assistant turn as the Qwen-style templates print it."""
    think = (
        f"{THINK_WORDS[0]}{msg['reasoning_content']}{THINK_WORDS[1]}" if msg.get("reasoning_content") else ""
    )
    calls = [
        "<tool_call>\n"
        + json.dumps(
            {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}, ensure_ascii=False
        )
        + "\n</tool_call>"
        for c in msg.get("tool_calls", [])
    ]
    return think + msg["content"] + (call_prefix if calls else "") + call_sep.join(calls) + "<|im_end|>\n"


@pytest.fixture(scope="module")
def step_results(tmp_path_factory):
    return export(tmp_path_factory.mktemp("step") / "results", "step")


def roles(messages: list[dict]) -> str:
    """What the probes' roles template prints: a line per message, a tool result with its name and call id."""
    return "".join(
        m["role"] + (f" {m['name']} {m['tool_call_id']}" if m["role"] == "tool" else "") + "\n"
        for m in messages
    )


def test_trl_reads_step_records_and_trains_only_the_last_message(step_results):
    ours = lines(step_results / "sft.jsonl")
    got = probe("trl", "trl_probe.py", step_results / "sft.jsonl", step_results / "out")
    assert got["versions"] == {"datasets": "5.2.0", "trl": "1.16.0"}
    # 2 tasks x (3 edges x 4 steps - e2's malformed step, which is only history)
    assert len(got["rows"]) == len(ours) == 22
    for rec, row in zip(ours, got["rows"], strict=True):
        # the chat template gets the roles as sent, tool results as `tool` with the tool's name, then the user
        # prompt of the next rollout turn as `user`
        assert row["roles"] == {"prompt": roles(rec["prompt"]), "completion": "assistant\n"}
        assert all(m["name"] in ("read", "bash") for m in rec["prompt"] if m["role"] == "tool")
        # every message, argument and tool schema comes back exactly (no keys added by Arrow, none lost)
        assert row["loaded"] == {k: rec[k] for k in ("prompt", "completion", "tools")}
        assert row["conversational"] and row["prompt_is_prefix"]
        (target,) = rec["completion"]
        expected = rendered_turn(target, call_sep="", call_prefix="")  # the test template's whitespace
        # TRL's text split and its token-level completion mask both cover exactly the final assistant message
        assert row["completion"] == expected
        assert row["trained_text"] == expected
        assert "<tool_response>" not in row["trained_text"] and "<|im_start|>" not in row["trained_text"]
    # the text beside a call is trained with it
    assert any(r["completion"][0]["content"] == "step 2" for r in ours)
    # a malformed call is in some prompts (kept raw), never in a trained text
    assert sum("_raw" in json.dumps(r["prompt"]) for r in ours) == 2
    assert all("_raw" not in row["trained_text"] for row in got["rows"])
    # a rollout turn's prompt reaches the template as `user`, right after the last turn's tool results
    boundaries = [
        len(re.findall(r"^tool \S+ \S+\nuser$", row["roles"]["prompt"], re.M)) for row in got["rows"]
    ]
    assert boundaries == [turn_boundaries(typed(r)) for r in ours] and sum(boundaries) == 38


def test_trl_reads_path_records(tmp_path):
    base = export(tmp_path / "results", "path")
    ours = lines(base / "sft.jsonl")
    got = probe("trl", "trl_probe.py", base / "sft.jsonl", base / "out")
    assert len(got["rows"]) == len(ours) == 4
    for rec, row in zip(ours, got["rows"], strict=True):
        assert row["loaded"] == {"messages": rec["messages"], "tools": rec["tools"]}
        assert row["roles"] == {"text": roles(rec["messages"])}
        # every assistant turn is trained: none of them is ill-formed (the best path is cut before e2's)
        assert "_raw" not in json.dumps(rec["messages"])
        # the whole session is rendered: every assistant turn is in the text
        assert row["text"].count("<|im_start|>assistant") == sum(
            m["role"] == "assistant" for m in rec["messages"]
        )


def _function_turn(content: str) -> tuple[str | None, str, list]:
    """(reasoning, text, calls) back out of a LLaMA-Factory function turn written by sftree."""
    reasoning = None
    if content.startswith(THINK_WORDS[0]):
        reasoning, content = content[len(THINK_WORDS[0]) :].split(THINK_WORDS[1], 1)
    text, _, calls = content.partition("<tool_call>")
    return reasoning, text, json.loads(calls.removesuffix("</tool_call>")) if calls else []


def expected_lf_turns(originals: list[dict]) -> list[tuple[str, object]]:
    """Hand-written sftree LLaMA-Factory layout of a conversation (system left out): consecutive tool results are
    one observation, as LLaMA-Factory joins them; tool results right before a user prompt move into that user
    turn, each wrapped in <tool_response> (the prompt keeps its role); an assistant message stays itself."""
    out: list[tuple[str, object]] = []
    i = 0
    while i < len(originals):
        m = originals[i]
        if m["role"] == "tool":
            j = i
            while j < len(originals) and originals[j]["role"] == "tool":
                j += 1
            results = [x["content"] for x in originals[i:j]]
            if j < len(originals) and originals[j]["role"] == "user":
                moved = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
                out.append(("user", f"{moved}\n\n{originals[j]['content']}"))
                i = j + 1
            else:
                out.append(("observation", "\n</tool_response>\n<tool_response>\n".join(results)))
                i = j
            continue
        out.append(("user", m["content"]) if m["role"] == "user" else ("function|assistant", m))
        i += 1
    return out


def inference_text(originals: list[dict]) -> str:
    """The conversation as a Qwen chat template renders OpenCode's messages (system left out): a user block per
    user message, one user block of <tool_response>s per run of tool results, the assistant's turns."""
    out, i = [], 0
    while i < len(originals):
        m = originals[i]
        if m["role"] == "tool":
            j = i
            while j < len(originals) and originals[j]["role"] == "tool":
                j += 1
            body = "\n</tool_response>\n<tool_response>\n".join(x["content"] for x in originals[i:j])
            out.append(f"<|im_start|>user\n<tool_response>\n{body}\n</tool_response><|im_end|>\n")
            i = j
            continue
        if m["role"] == "user":
            out.append(f"<|im_start|>user\n{m['content']}<|im_end|>\n")
        else:
            out.append("<|im_start|>assistant\n" + rendered_turn(m, call_sep="\n", call_prefix=""))
        i += 1
    return "".join(out)


BOUNDARY_AS_SENT = "</tool_response><|im_end|>\n<|im_start|>user\n"
BOUNDARY_IN_LF = "</tool_response>\n\n"


def test_llamafactory_converts_without_loss_and_masks_history(step_results):
    ours = lines(step_results / "sft.jsonl")
    got = probe("lf", "lf_probe.py", step_results, step_results / "out")
    assert got["versions"] == {"datasets": "4.0.0", "llamafactory": "0.9.5"}
    assert len(got["rows"]) == len(ours) == 22
    for rec, row in zip(ours, got["rows"], strict=True):
        conv = row["converted"]
        assert conv["_response"], "LLaMA-Factory skipped the record"
        assert json.loads(conv["_tools"]) == rec["tools"]
        system = rec["prompt"][0]["content"]
        assert conv["_system"] == system + "\n"  # LLaMA-Factory's own addition when tools are present
        turns = conv["_prompt"] + conv["_response"]
        originals = [m for m in list(typed(rec).messages) if m["role"] != "system"]
        expected = expected_lf_turns(originals)
        assert len(turns) == len(expected)
        for turn, (role, want) in zip(turns, expected, strict=True):
            if role != "function|assistant":
                assert (turn["role"], turn["content"]) == (role, want)
                continue
            m = want
            assert turn["role"] == ("function" if m.get("tool_calls") else "assistant")
            reasoning, text, calls = _function_turn(turn["content"])
            assert reasoning == m.get("reasoning_content") and text == m["content"]
            assert calls == [
                {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                for c in m.get("tool_calls", [])
            ]
        # the rendered text (LLaMA-Factory's qwen template) is the OpenCode conversation as a Qwen template shows
        # it, except at each tool -> user boundary, where the two blocks become one user block (card, outputs.md)
        head, body = row["text"].split("<|im_end|>\n", 1)
        assert head.startswith("<|im_start|>system\n" + system)
        as_sent = inference_text(originals)
        assert as_sent.count(BOUNDARY_AS_SENT) == turn_boundaries(typed(rec))
        assert body == as_sent.replace(BOUNDARY_AS_SENT, BOUNDARY_IN_LF)
        # mask_history: the labelled tokens are the final assistant message, nothing of the history
        (target,) = rec["completion"]
        assert row["trained_contiguous"]
        assert row["trained_text"] == rendered_turn(target, call_sep="\n", call_prefix="")
        assert row["trained_calls"] == [
            {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in target["tool_calls"]
        ]


def test_llamafactory_file_loads_unchanged_in_newest_datasets(step_results):
    src = step_results / "sft_llamafactory.jsonl"
    code = (
        "import json, sys, datasets;"
        "ds = datasets.load_dataset('json', data_files=sys.argv[1], split='train');"
        "print(json.dumps(ds.to_list()))"
    )
    res = subprocess.run(
        [venv_python("trl"), "-c", code, str(src)], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.splitlines()[-1]) == lines(src)


def test_llamafactory_refuses_the_roles_as_sent(step_results, tmp_path):
    """Why the LLaMA-Factory copy moves tool results: the same records with OpenCode's order (tool results, then
    the next turn's user prompt) are skipped by LLaMA-Factory's own converter (turns must alternate)."""
    ours = lines(step_results / "sft_llamafactory.jsonl")
    as_sent = []
    for rec in ours:
        msgs = []
        for m in rec["messages"]:
            if m["role"] == "user" and m["content"].startswith("<tool_response>\n"):
                moved, prompt = m["content"].rsplit("</tool_response>\n\n", 1)
                for r in (moved + "</tool_response>").split("\n<tool_response>\n"):
                    msgs.append(
                        {
                            "role": "tool",
                            "content": r.removeprefix("<tool_response>\n").removesuffix("\n</tool_response>"),
                        }
                    )
                msgs.append({"role": "user", "content": prompt})
            else:
                msgs.append(m)
        as_sent.append(dict(rec, messages=msgs))
    split = sum(len(a["messages"]) != len(b["messages"]) for a, b in zip(as_sent, ours, strict=True))
    assert split == 18  # the records that hold a tool -> user boundary
    info = json.loads((step_results / "dataset_info.json").read_text())
    info["sftree"]["file_name"] = "as_sent.jsonl"
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    (tmp_path / "as_sent.jsonl").write_text("".join(json.dumps(r) + "\n" for r in as_sent))
    got = probe("lf", "lf_probe.py", tmp_path, tmp_path / "out")
    skipped = [not row["converted"]["_response"] for row in got["rows"]]
    assert skipped == [len(a["messages"]) != len(b["messages"]) for a, b in zip(as_sent, ours, strict=True)]
