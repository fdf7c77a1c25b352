"""OpenCode's tools (names and argument schemas) for the native agent; every one runs inside the edge's sandbox.

A tool call is an *error* when the tool itself fails - bad or missing arguments, unknown tool, missing file,
edit target not found, timeout, a path outside the workspace (denied) - as OpenCode reports
`state.status == "error"`. A shell command that exits non-zero is not a tool error (its output says so).

A *knowledge action* (DESIGN.md) is a call that reads or writes under the shared knowledge (the worktree's
`.opencode/{notes,skills,attempts,roles}` links, or `.coral/public/` itself), or a `coral notes|skills|log|show`
command. `coral eval` does not count, nor does a call that failed as a tool (it read or wrote nothing); a
shell command counts whatever its exit code. It is decided from the call's arguments by agents/knowledge.py,
the one function both backends use: the host never resolves a path the agent named.

`bash` runs in the sandbox (runtime/edgebox.py); `read`, `write`, `edit`, `glob` and `grep` run there too, as a
small program of their own (agents/toolbox.py), so nothing the agent made is opened by the host.
"""

from __future__ import annotations

import json
import posixpath
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sftree.agents.base import ToolOutcome
from sftree.agents.knowledge import is_knowledge_action
from sftree.jsontypes import JSONObject, JSONValue, arr, obj

if TYPE_CHECKING:
    from sftree.runtime.edgebox import EdgeBox
    from sftree.runtime.procs import GroupResult


def _fn(name: str, description: str, props: JSONObject, required: list[JSONValue]) -> JSONObject:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": props,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


# Fixed order and text: part of every request's byte-identical prefix.
TOOL_SCHEMAS: list[JSONObject] = [
    _fn(
        "bash",
        "Executes a bash command in the workspace with an optional timeout (milliseconds).",
        {
            "command": {"type": "string", "description": "The command to execute"},
            "timeout": {"type": "number", "description": "Optional timeout in milliseconds"},
            "workdir": {
                "type": "string",
                "description": "Directory to run the command in (default: workspace root)",
            },
            "description": {
                "type": "string",
                "description": "Clear, concise description of what this command does in 5-10 words",
            },
        },
        ["command", "description"],
    ),
    _fn(
        "read",
        "Reads a file from the workspace. Lines are numbered; use offset and limit for long files.",
        {
            "filePath": {"type": "string", "description": "The path to the file to read"},
            "offset": {"type": "number", "description": "The line number to start reading from (0-based)"},
            "limit": {"type": "number", "description": "The number of lines to read (defaults to 2000)"},
        },
        ["filePath"],
    ),
    _fn(
        "write",
        "Writes a file in the workspace, overwriting it if it exists.",
        {
            "filePath": {"type": "string", "description": "The path to the file to write"},
            "content": {"type": "string", "description": "The content to write to the file"},
        },
        ["filePath", "content"],
    ),
    _fn(
        "edit",
        "Replaces exact text in a file. oldString must match the file exactly and be unique unless "
        "replaceAll is true.",
        {
            "filePath": {"type": "string", "description": "The path to the file to modify"},
            "oldString": {"type": "string", "description": "The text to replace"},
            "newString": {
                "type": "string",
                "description": "The text to replace it with (must differ from oldString)",
            },
            "replaceAll": {
                "type": "boolean",
                "description": "Replace all occurrences of oldString (default false)",
            },
        },
        ["filePath", "oldString", "newString"],
    ),
    _fn(
        "glob",
        "Finds files by glob pattern (e.g. **/*.py), sorted by path.",
        {
            "pattern": {"type": "string", "description": "The glob pattern to match files against"},
            "path": {"type": "string", "description": "The directory to search in (default: workspace root)"},
        },
        ["pattern"],
    ),
    _fn(
        "grep",
        "Searches file contents with a regular expression; prints path:line: text.",
        {
            "pattern": {"type": "string", "description": "The regex pattern to search for in file contents"},
            "path": {"type": "string", "description": "The directory to search in (default: workspace root)"},
            "include": {"type": "string", "description": "File pattern to include in the search (e.g. *.py)"},
        },
        ["pattern"],
    ),
]


def _params(tool: JSONObject) -> tuple[str, dict[str, str], list[str]]:
    """A schema of TOOL_SCHEMAS as (tool name, {argument: JSON type}, required arguments)."""
    fn = obj(tool["function"])
    params = obj(fn["parameters"])
    types = {k: str(obj(spec)["type"]) for k, spec in obj(params["properties"]).items()}
    return str(fn["name"]), types, [str(k) for k in arr(params["required"])]


_SCHEMA = {name: (types, required) for name, types, required in map(_params, TOOL_SCHEMAS)}
TOOL_NAMES = list(_SCHEMA)
_PYTYPES: dict[str, type | tuple[type, ...]] = {"string": str, "number": (int, float), "boolean": bool}

TOOLBOX = Path(__file__).resolve().parent / "toolbox.py"


class ToolError(Exception):
    """The tool itself failed; the message is what the model sees."""


@dataclass
class ToolContext:
    box: EdgeBox  # where every tool runs
    toolbox: str  # the toolbox program's path as the sandbox sees it
    bash_timeout: float  # agent.bash_timeout
    output_cap: int  # agent.output_cap
    deadline: float | None = None  # time.monotonic() at which the turn ends: no tool runs past it


# ---- argument checking -------------------------------------------------------------------------------------
def parse_arguments(name: str, raw: str | JSONObject) -> JSONObject:
    """Decode and check a call's arguments against its schema; ToolError on anything wrong."""
    if name not in _SCHEMA:
        raise ToolError(f"unknown tool {name!r}; available tools: {', '.join(TOOL_NAMES)}")
    if isinstance(raw, dict):
        args = raw
    else:
        try:
            args = json.loads(raw or "{}")
        except (TypeError, ValueError) as exc:
            raise ToolError(f"invalid arguments for {name}: not valid JSON ({exc})") from None
    if not isinstance(args, dict):
        raise ToolError(f"invalid arguments for {name}: expected a JSON object")
    types, required = _SCHEMA[name]
    missing = [k for k in required if k not in args]
    if name == "bash":
        missing = [k for k in missing if k != "description"]  # OpenCode tolerates a missing description
    if missing:
        raise ToolError(f"invalid arguments for {name}: missing {', '.join(missing)}")
    for k, v in args.items():
        jtype = types.get(k)
        if jtype is None:
            raise ToolError(f"invalid arguments for {name}: unexpected field {k!r}")
        ok = isinstance(v, _PYTYPES[jtype]) and not (jtype == "number" and isinstance(v, bool))
        if not ok and v is not None:
            raise ToolError(f"invalid arguments for {name}: {k} must be a {jtype}")
    return args


class _Capped(str):
    """Tool output that is already cut to the cap."""


def _cap(text: str, cap: int) -> str:
    if len(text) <= cap or isinstance(text, _Capped):
        return text
    return text[:cap] + f"\n... (output truncated: {len(text) - cap} more characters)"


def _time_for(ctx: ToolContext, want: float) -> float:
    """The seconds a tool may run: what it asks, within what is left of the turn (ToolError when none is)."""
    left = ctx.deadline - time.monotonic() if ctx.deadline is not None else None
    if left is not None and left < want:
        if left <= 0:
            raise ToolError("not run: the turn's time is up (turn_timeout)")
        return left
    return want


def _stopped(res: GroupResult) -> str:
    return f"\n(stopped: {res.stopped})" if res.stopped else ""


def tool_file(name: str, args: JSONObject, ctx: ToolContext) -> str:
    """read/write/edit/glob/grep: the toolbox program in the sandbox (module docstring)."""
    box = ctx.box
    roots = [box.worktree, box.inside(box.ws.knowledge_dir)]
    req = json.dumps({"tool": name, "args": args, "cwd": box.worktree, "roots": roots, "cap": ctx.output_cap})
    timeout = _time_for(ctx, min(60.0, ctx.bash_timeout))
    res = box.run(
        [box.python, "-I", "-S", ctx.toolbox],
        timeout=timeout,
        input=req.encode(),
        max_output=ctx.output_cap * 4 + 65536,
        merge_stderr=False,
    )
    if res.timed_out:
        raise ToolError(f"{name} timed out after {timeout:g}s")
    try:
        out = json.loads(res.stdout.decode("utf-8", "replace"))
        ok, text = bool(out["ok"]), str(out["text"])
    except (ValueError, KeyError, TypeError):
        why = res.stopped or f"exited with code {res.returncode}"
        raise ToolError(f"{name} failed ({why}): {res.stderr.decode('utf-8', 'replace')[-500:]}") from None
    if not ok:
        raise ToolError(text.removeprefix("Error: "))
    return text


def tool_bash(args: JSONObject, ctx: ToolContext) -> str:
    """The shell in the sandbox (`parse_arguments` checked the arguments' types; each may still be null)."""
    box = ctx.box
    workdir = args.get("workdir")
    cwd = (
        posixpath.normpath(posixpath.join(box.worktree, workdir))
        if isinstance(workdir, str) and workdir
        else box.worktree
    )
    timeout_ms = args.get("timeout")
    timeout = (
        min(float(timeout_ms) / 1000.0, ctx.bash_timeout * 2)
        if isinstance(timeout_ms, int | float) and timeout_ms
        else ctx.bash_timeout
    )
    if not timeout > 0:
        raise ToolError("timeout must be positive")
    timeout = _time_for(ctx, timeout)
    command = args["command"]
    if not isinstance(command, str):  # a null command: the error running it would raise
        raise TypeError(f"expected str, bytes or os.PathLike object, not {type(command).__name__}")
    # Bytes, not characters: a little more than the cap so the cut is made on characters below.
    res = box.run(["bash", "-c", command], timeout=timeout, cwd=cwd, max_output=ctx.output_cap * 4 + 4096)
    text = res.stdout.decode("utf-8", "replace")
    if res.dropped:  # already over the cap: cut here, counting what was never read into memory
        more = len(text) - ctx.output_cap + res.dropped
        text = _Capped(text[: ctx.output_cap] + f"\n... (output truncated: {more} more characters)")
    if res.timed_out:
        raise ToolError(f"command timed out after {timeout:g}s\n{_cap(str(text), 2000)}")
    if res.stopped:
        raise ToolError(f"command stopped: {res.stopped}\n{_cap(str(text), 2000)}")
    if res.returncode != 0:
        text = type(text)(text + f"\n(exit code {res.returncode})")
    return text


def execute(name: str, raw_arguments: str | JSONObject, ctx: ToolContext) -> ToolOutcome:
    """Run one tool call; never raises. A call that failed read or wrote nothing, so it is no knowledge action."""
    try:
        args = parse_arguments(name, raw_arguments)
    except ToolError as exc:
        return ToolOutcome(f"Error: {exc}", error=True, knowledge=False)
    knowledge = is_knowledge_action(name, args, ctx.box.worktree, ctx.box.inside(ctx.box.ws.knowledge_dir))
    try:
        text = tool_bash(args, ctx) if name == "bash" else tool_file(name, args, ctx)
    except ToolError as exc:
        return ToolOutcome(_cap(f"Error: {exc}", ctx.output_cap), error=True)
    except Exception as exc:  # noqa: BLE001 - any failure of one tool is that tool's error
        return ToolOutcome(f"Error: {type(exc).__name__}: {exc}", error=True)
    return ToolOutcome(_cap(text, ctx.output_cap), error=False, knowledge=knowledge)
