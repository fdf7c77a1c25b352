"""teacher-sim's seeded policy: a small agent that really works a task through OpenCode's tools.

Within a rollout turn (the messages after the last user message) the policy walks a fixed plan, one tool call
per step; a step whose tool result was an error is retried (up to MAX_FAILED failures, then it submits; the
extra_tool_errors fault's reads do not count):

    0 knowledge   `coral log`, `ls .opencode/notes .opencode/attempts`, or glob/read of the notes
    1 find        grep for UPPER_CASE numeric constants in *.py (`NAME = 1.5`)
    2 read        read the file that holds them
    3 edit        nudge one constant (ints by +-1..2, floats by up to +-20%)
    4 note        sometimes (35%) write a note under .opencode/notes/
    5 eval        `coral eval -m "..."`
    after a nudge (a user message that opens no turn, see _is_turn_start): eval at once

Every choice comes from `random.Random(key)` with key = (seed, a hash of the request's skeleton, the
X-Sftree-Edge header). The skeleton is the roles, the assistant messages and tool calls, and whether each tool
result was an error - not the text of tool results or prompts, which can hold timestamps - so the same request
gets the same answer, two forks of one node (different edges) explore differently, and a search run with
parallel_width 1 is reproducible.

Faults (server.py decides which apply to a request) change the answer: no_eval (text only, no tool call),
malformed_args (broken JSON arguments), unknown_tool, tool_errors (read a missing file), broken_code (the edit
writes a syntax error, so the eval crashes), pad_tokens (filler text of N tokens), break_workspace (a hostile
step: `bash` replaces the run directory's knowledge folder `.coral/public` by a link to a missing folder, which
only works without a sandbox (inside one its parent is the host's); the host never follows such a link, so it
cannot take the edge's final state, which makes the edge an `edge_error`).

Two faults add a step *in front of* the planned one instead of breaking the plan, so a turn still does its
normal work (edit, eval, numeric score) and a script sets its tool counts exactly - one extra call per faulted
request: extra_tool_errors (a read of `missing_extra_<i>.py`, a real tool error, which does not count toward
MAX_FAILED: the policy never gives up because of it) and extra_tool_calls (a `glob` of `**/*.py`, a successful
call that is no knowledge action). When both apply to one request, its step carries both calls (the read
first), so each rule's `count` is the number of calls it adds.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re

from sftree.jsontypes import WireObject

# One step of the turn: the assistant message with its tool calls, and the tool results that followed it.
Step = tuple[WireObject, list[WireObject]]

MAX_FAILED = 3
# file name prefix of the extra_tool_errors fault's reads (not counted toward MAX_FAILED)
EXTRA_MISSING = "missing_extra_"
NOTE_P = 0.35
# the break_workspace fault's command: the knowledge folder becomes a link to a folder that does not exist
BREAK_WORKSPACE = "rm -rf ../../.coral/public && ln -s /nonexistent-sftree-knowledge ../../.coral/public"
CONST_RX = r"^[A-Z][A-Z0-9_]*\s*=\s*[-+]?[0-9][0-9_]*(\.[0-9_]*)?([eE][-+]?[0-9]+)?\s*(#.*)?$"
_CONST_LINE = re.compile(
    r"^(?P<name>[A-Z][A-Z0-9_]*)(?P<eq>\s*=\s*)(?P<val>[-+]?[0-9][0-9_]*(\.[0-9_]*)?"
    r"([eE][-+]?[0-9]+)?)(?P<rest>\s*(#.*)?)$"
)
_GREP_HIT = re.compile(r"^(?P<path>[^:\n]+):(?P<line>\d+): (?P<text>.*)$")
_READ_LINE = re.compile(r"^(?P<no>\d{5})\| (?P<text>.*)$")
# The real OpenCode's formats (agent.backend: opencode): grep prints `<path>:` then `  Line N: text` lines,
# read prints `N: text` lines inside <content>.
_OC_GREP_FILE = re.compile(r"^(?P<path>\S[^\n]*):$")
_OC_GREP_LINE = re.compile(r"^  Line (?P<line>\d+): (?P<text>.*)$")
_OC_READ_LINE = re.compile(r"^(?P<no>\d+): (?P<text>.*)$")


def skeleton_hash(messages: list[WireObject]) -> str:
    h = hashlib.sha256()
    for m in messages:
        role = m.get("role")
        if role == "system":  # the same for every session of a run (and absent in some backends): no signal
            continue
        part: WireObject
        if role == "assistant":
            part = {
                "r": "a",
                "c": m.get("content") or "",
                "t": [
                    [c.get("function", {}).get("name"), c.get("function", {}).get("arguments")]
                    for c in m.get("tool_calls") or []
                ],
            }
        elif role == "tool":
            part = {"r": "t", "e": str(m.get("content") or "").startswith("Error")}
        else:
            part = {"r": role}
        h.update(json.dumps(part, sort_keys=True).encode())
    return h.hexdigest()


def make_rng(seed: int, messages: list[WireObject], edge: str, salt: str = "") -> random.Random:
    key = f"{seed}|{skeleton_hash(messages)}|{edge}|{salt}"
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))


def _call(name: str, args: WireObject | str, idx: int) -> WireObject:
    arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": f"call_{idx}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _is_turn_start(messages: list[WireObject], i: int) -> bool:
    """A user message opens a turn unless it is sftree's nudge (`sftree.world.standin.nudge_prompt`, after a
    text-only reply), which continues the turn. (Coral's prompts that open a turn - the manager's `## Eval #N
    Results`, its restart prompt, the runtime's start and resume prompts - have no common mark.)"""
    m = messages[i]
    if m.get("role") != "user":
        return False
    first = not any(x.get("role") == "user" for x in messages[:i])
    return first or _nudge_text() not in _plain(m.get("content"))


def _plain(content: object) -> str:
    """A message's text: a string, or the text parts of a list of parts (OpenCode's messages)."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


@functools.cache
def _nudge_text() -> str:
    from sftree.world.standin import nudge_prompt

    return nudge_prompt()


def _turn_view(messages: list[WireObject]) -> tuple[list[WireObject], bool]:
    """(the current turn's messages after its opening prompt, nudged?)."""
    start = max((i for i in range(len(messages)) if _is_turn_start(messages, i)), default=-1)
    nudged = any(m.get("role") == "user" for m in messages[start + 1 :])
    return messages[start + 1 :], nudged


def _steps(turn_msgs: list[WireObject]) -> list[Step]:
    """(assistant message with tool calls, its tool results) pairs of the turn."""
    out: list[Step] = []
    for i, m in enumerate(turn_msgs):
        if m.get("role") == "assistant" and m.get("tool_calls"):
            results = []
            for r in turn_msgs[i + 1 :]:
                if r.get("role") != "tool":
                    break
                results.append(r)
            out.append((m, results))
    return out


def _stage_of(call: WireObject) -> str | None:
    name = call["function"]["name"]
    try:
        args = json.loads(call["function"]["arguments"])
    except (TypeError, ValueError):
        return None
    if not isinstance(args, dict):
        return None
    if name == "bash":
        cmd = str(args.get("command", ""))
        if "coral eval" in cmd:
            return "eval"
        return "knowledge" if ("coral log" in cmd or ".opencode" in cmd) else None
    if name in ("glob", "read") and ".opencode/notes" in json.dumps(args):
        return "knowledge"
    if name == "grep":
        return "find"
    if name == "read":
        return "read"
    if name == "edit":
        return "edit"
    if name == "write" and ".opencode/notes" in str(args.get("filePath", "")):
        return "note"
    if name == "apply_patch":
        patch = str(args.get("patchText", ""))
        if "*** Update File:" in patch:
            return "edit"
        if "*** Add File:" in patch and ".opencode/notes" in patch:
            return "note"
    return None


def nudge_value(val: str, rng: random.Random) -> str:
    """A nearby value of a numeric literal, kept the same kind (int stays int, non-negative stays so)."""
    clean = val.replace("_", "")
    if re.fullmatch(r"[-+]?\d+", clean):
        v = int(clean)
        new = v + rng.choice([-2, -1, 1, 2])
        if v >= 0 and new < 0 or new == v:
            new = v + 1
        if v > 0 and new == 0:
            new = v + 1
        return str(new)
    x = float(clean)
    factor = 1.0 + rng.choice([-1, 1]) * rng.uniform(0.02, 0.2)
    y = x * factor if x != 0 else rng.uniform(0.01, 0.1)
    return f"{y:.6g}" if "e" in f"{y:.6g}" or "." in f"{y:.6g}" else f"{y:.6g}.0"


def decide(
    messages: list[WireObject],
    *,
    seed: int = 0,
    edge: str = "",
    faults: frozenset[str] = frozenset(),
    pad_tokens: int = 0,
    tools: frozenset[str] = frozenset(),
) -> WireObject:
    """The assistant message for this request. `tools`: the offered tools' names; where OpenCode offers
    `apply_patch` instead of edit and write (its tool set for GPT model ids), the changes are patches."""
    rng = make_rng(seed, messages, edge)
    turn_msgs, nudged = _turn_view(messages)
    steps = _steps(turn_msgs)
    idx = sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
    done: dict[str, Step] = {}
    failed = 0
    for m, results in steps:
        call = m["tool_calls"][0]
        ok = bool(results) and not str(results[0].get("content") or "").startswith("Error")
        stage = _stage_of(call)
        if ok and stage:
            done[stage] = (call, results)
        elif not ok and not _is_extra_error(call):
            failed += 1
    patch = "apply_patch" in tools and "edit" not in tools
    content, call = _plan(rng, done, nudged or failed >= MAX_FAILED, faults, idx, patch)
    calls: list[WireObject] = []
    if "no_eval" in faults:
        content, call = "I think the current solution is in good shape; no further changes for now.", None
    elif call is not None and "break_workspace" in faults:
        call = _call("bash", {"command": BREAK_WORKSPACE, "description": "Relink the knowledge folder"}, idx)
    elif call is not None and "unknown_tool" in faults:
        call = _call("browser_open", {"url": "https://example.com"}, idx)
    elif call is not None and faults & {"extra_tool_errors", "extra_tool_calls"}:
        content, calls = _extra_calls(faults, idx)
    elif call is not None and "tool_errors" in faults:
        call = _call("read", {"filePath": f"missing_{idx}.py"}, idx)
    elif call is not None and "malformed_args" in faults:
        call["function"]["arguments"] = call["function"]["arguments"][:-1] + ',"'
    if pad_tokens > 0:
        words = (
            "consider the layout of the constants and the grader feedback carefully before the next change"
        )
        filler = (words + " ") * (pad_tokens * 4 // (len(words) + 1) + 1)
        content = (content + "\n\n" + filler[: pad_tokens * 4]).strip()
    msg: WireObject = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = calls
    elif call is not None:
        msg["tool_calls"] = [call]
    return msg


def _extra_calls(faults: frozenset[str], idx: int) -> tuple[str, list[WireObject]]:
    """The extra step put in front of the planned one: a failing read and/or a successful glob."""
    out: list[WireObject] = []
    if "extra_tool_errors" in faults:
        out.append(_call("read", {"filePath": f"{EXTRA_MISSING}{idx}.py"}, idx + len(out)))
    if "extra_tool_calls" in faults:
        out.append(_call("glob", {"pattern": "**/*.py"}, idx + len(out)))
    return "Let me look around the code first.", out


def _is_extra_error(call: WireObject) -> bool:
    """A failing read made by the extra_tool_errors fault (not a failure of the plan)."""
    if call["function"]["name"] != "read":
        return False
    try:
        args = json.loads(call["function"]["arguments"])
    except (TypeError, ValueError):
        return False
    return isinstance(args, dict) and str(args.get("filePath", "")).startswith(EXTRA_MISSING)


def _plan(
    rng: random.Random,
    done: dict[str, Step],
    submit_now: bool,
    faults: frozenset[str],
    idx: int,
    patch: bool = False,
) -> tuple[str, WireObject]:
    if submit_now:
        return "Submitting the current state for evaluation.", _eval_call(done, idx)
    if "knowledge" not in done:
        choice = rng.randrange(3)
        if choice == 0:
            return "Let me check what has been tried so far.", _call(
                "bash", {"command": "coral log -n 10", "description": "List recent attempts"}, idx
            )
        if choice == 1:
            return "First, the shared notes and attempts.", _call(
                "bash",
                {
                    "command": "ls .opencode/notes .opencode/attempts | head -40",
                    "description": "List shared notes and attempts",
                },
                idx,
            )
        return "Looking for notes from other agents.", _call(
            "glob", {"pattern": "**/*.md", "path": ".opencode/notes"}, idx
        )
    if "find" not in done:
        return "Now the tunable constants in the code.", _call(
            "grep", {"pattern": CONST_RX, "include": "*.py"}, idx
        )
    hits = _grep_hits(done["find"][1])
    if not hits:
        return "I found no tunable constants; submitting as is.", _eval_call(done, idx)
    files = sorted({h[0] for h in hits})
    if "read" not in done:
        return "Let me read the code around them.", _call("read", {"filePath": rng.choice(files)}, idx)
    if "edit" not in done:
        path, lines = _read_result(done["read"])
        consts = _documented(lines) or [ln for ln in lines if _CONST_LINE.match(ln)]
        if not consts:
            return "Nothing tunable in this file; submitting.", _eval_call(done, idx)
        line = rng.choice(consts)
        m = _CONST_LINE.match(line)
        assert m is not None  # (a constant line)
        new_val = "(" if "broken_code" in faults else nudge_value(m.group("val"), rng)
        new_line = f"{m.group('name')}{m.group('eq')}{new_val}{m.group('rest')}"
        say = f"I'll try {m.group('name')} = {new_val} instead of {m.group('val')}."
        if patch:
            text = f"*** Begin Patch\n*** Update File: {path}\n@@\n-{line}\n+{new_line}\n*** End Patch"
            return say, _call("apply_patch", {"patchText": text}, idx)
        return say, _call("edit", {"filePath": path, "oldString": line, "newString": new_line}, idx)
    if "note" not in done and "eval" not in done and rng.random() < NOTE_P:
        change = _change_summary(done)
        name = f".opencode/notes/sim-{hashlib.sha1(change.encode()).hexdigest()[:8]}.md"
        body = f"# Tried: {change}\n\nNudging one constant at a time; compare the score against the branch's best.\n"
        if patch:
            added = "".join(f"+{ln}\n" for ln in body.splitlines())
            text = f"*** Begin Patch\n*** Add File: {name}\n{added}*** End Patch"
            return "Recording this idea for the others.", _call("apply_patch", {"patchText": text}, idx)
        return "Recording this idea for the others.", _call("write", {"filePath": name, "content": body}, idx)
    return "Submitting this change.", _eval_call(done, idx)


def _grep_hits(results: list[WireObject]) -> list[tuple[str, int, str]]:
    out: list[tuple[str, int, str]] = []
    oc_path = None
    for line in str(results[0].get("content") or "").splitlines():
        m = _GREP_HIT.match(line)
        if m and not m.group("path").startswith(".opencode"):
            out.append((m.group("path"), int(m.group("line")), m.group("text")))
        elif (f := _OC_GREP_FILE.match(line)) and not line.startswith(" "):
            oc_path = f.group("path")
        elif oc_path and (h := _OC_GREP_LINE.match(line)) and "/.opencode/" not in oc_path:
            out.append((oc_path, int(h.group("line")), h.group("text")))
    return out


def _read_result(step: Step) -> tuple[str, list[str]]:
    call, results = step
    path = str(json.loads(call["function"]["arguments"])["filePath"])
    lines: list[str] = []
    for ln in str(results[0].get("content") or "").splitlines():
        m = _READ_LINE.match(ln) or _OC_READ_LINE.match(ln)
        if m:
            lines.append(m.group("text"))
    return path, lines


def _documented(lines: list[str]) -> list[str]:
    """Constant lines whose names the file documents above the first constant (its tunables)."""
    consts = [(i, m) for i, ln in enumerate(lines) if (m := _CONST_LINE.match(ln))]
    if not consts:
        return []
    head = "\n".join(lines[: consts[0][0]])
    return [lines[i] for i, m in consts if re.search(rf"\b{m.group('name')}\b", head)]


def _change_summary(done: dict[str, Step]) -> str:
    if "edit" in done:
        args = json.loads(done["edit"][0]["function"]["arguments"])
        if "patchText" in args:  # apply_patch: one `-old`/`+new` pair under `*** Update File: path`
            lines = args["patchText"].splitlines()
            path = next(ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("*** Update File:"))
            old = next(ln[1:] for ln in lines if ln.startswith("-"))
            new = next(ln[1:] for ln in lines if ln.startswith("+"))
            args = {"oldString": old, "newString": new, "filePath": path}
        old, new = args["oldString"].split("#")[0].strip(), args["newString"].split("#")[0].strip()
        return f"{old} -> {new} in {args['filePath']}"
    return "no code change"


def _eval_call(done: dict[str, Step], idx: int) -> WireObject:
    msg = _change_summary(done).replace('"', "'")
    return _call("bash", {"command": f'coral eval -m "{msg}"', "description": "Evaluate the change"}, idx)
