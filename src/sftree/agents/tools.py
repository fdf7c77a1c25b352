"""OpenCode's tools (names and argument schemas), confined to the agent's workspace.

A tool call is an *error* when the tool itself fails - bad or missing arguments, unknown tool, missing file,
edit target not found, timeout, a path outside the workspace (denied) - as OpenCode reports
`state.status == "error"`. A shell command that exits non-zero is not a tool error (its output says so).

A *knowledge action* (DESIGN.md) is a call that reads or writes under `.opencode/{notes,skills,attempts,roles}`
(or lists `.opencode` itself), or a `coral notes|skills|log|show` command. `coral eval` does not count, nor
does a call that failed as a tool (it read or wrote nothing); a shell command counts whatever its exit code.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from sftree.agents.base import ToolOutcome
from sftree.runtime.procs import run_group
from sftree.runtime.sandbox import (
    AGENT_LIMITS,
    CORAL_MOUNT,
    KNOWLEDGE_DIR,
    NO_FENCE,
    bwrap_argv,
    give_to,
    knowledge_fence,
    scrubbed_env,
    wait_gone,
    wrap_limits,
)


def _fn(name: str, description: str, props: dict, required: list[str]) -> dict:
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
TOOL_SCHEMAS: list[dict] = [
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
TOOL_NAMES = [t["function"]["name"] for t in TOOL_SCHEMAS]
_SCHEMA = {t["function"]["name"]: t["function"]["parameters"] for t in TOOL_SCHEMAS}
_PYTYPES = {"string": str, "number": (int, float), "boolean": bool}

KNOWLEDGE_SUBDIRS = ("notes", "skills", "attempts", "roles")
_KNOWLEDGE_CMD = re.compile(r"(^|[\s;&|(`])coral\s+(notes|skills|log|show)\b")
_KNOWLEDGE_PATH = re.compile(r"\.opencode(/(notes|skills|attempts|roles)\b|/?(?=$|[\s'\";|&)*]))")
SKIP_DIRS = {".git", "__pycache__", "node_modules"}
MAX_LIST = 200


class ToolError(Exception):
    """The tool itself failed; the message is what the model sees."""


@dataclass
class ToolContext:
    root: Path  # the workspace root (resolved)
    sandbox: str  # bwrap | none
    coral_env: dict[str, str] = field(default_factory=dict)
    coral_dir: Path | None = None  # host folder holding the coral client and socket
    hidden: list[Path] = field(default_factory=list)
    bash_timeout: float = 300.0
    output_cap: int = 30000
    uid: int | None = None  # the unprivileged host uid the sandbox runs as (sftree is root), else None
    deadline: float | None = None  # time.monotonic() at which the turn ends: no tool runs past it
    # Every shell command so far saw `.opencode` as its own mount (sandbox.knowledge_fence); `none` fences nothing.
    fenced: bool = True


# ---- knowledge detection (pure) ----------------------------------------------------------------------------
def _under_knowledge(path: Path, root: Path) -> bool:
    try:
        rel = path.resolve().relative_to((root / ".opencode").resolve())
    except ValueError:
        return False
    return not rel.parts or rel.parts[0] in KNOWLEDGE_SUBDIRS


def is_knowledge_action(name: str, args: dict, root: Path) -> bool:
    """DESIGN.md's knowledge action, decided from the call's arguments alone."""
    if not isinstance(args, dict):
        return False
    if name == "bash":
        cmd = str(args.get("command", ""))
        return bool(_KNOWLEDGE_CMD.search(cmd) or _KNOWLEDGE_PATH.search(cmd))
    if name in ("read", "write", "edit"):
        p = args.get("filePath")
        return isinstance(p, str) and _under_knowledge(_abs(p, root), root)
    if name in ("glob", "grep"):
        p = args.get("path")
        if isinstance(p, str) and p and _under_knowledge(_abs(p, root), root):
            return True
        pat = str(args.get("pattern", "")) if name == "glob" else str(args.get("include", ""))
        return bool(_KNOWLEDGE_PATH.search(pat))
    return False


def _abs(p: str, root: Path) -> Path:
    q = Path(p)
    return q if q.is_absolute() else root / q


# ---- argument checking -------------------------------------------------------------------------------------
def parse_arguments(name: str, raw) -> dict:
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
    schema = _SCHEMA[name]
    missing = [k for k in schema["required"] if k not in args]
    if name == "bash":
        missing = [k for k in missing if k != "description"]  # OpenCode tolerates a missing description
    if missing:
        raise ToolError(f"invalid arguments for {name}: missing {', '.join(missing)}")
    for k, v in args.items():
        spec = schema["properties"].get(k)
        if spec is None:
            raise ToolError(f"invalid arguments for {name}: unexpected field {k!r}")
        ok = isinstance(v, _PYTYPES[spec["type"]]) and not (spec["type"] == "number" and isinstance(v, bool))
        if not ok and v is not None:
            raise ToolError(f"invalid arguments for {name}: {k} must be a {spec['type']}")
    return args


def confine(p: str, ctx: ToolContext) -> Path:
    """Resolve a path against the workspace; ToolError (denied) when it leaves the workspace."""
    target = _abs(p, ctx.root).resolve()
    if target != ctx.root and not target.is_relative_to(ctx.root):
        raise ToolError(f"denied: {p} is outside the workspace")
    return target


class _Capped(str):
    """Tool output that is already cut to the cap."""


def _cap(text: str, cap: int) -> str:
    if len(text) <= cap or isinstance(text, _Capped):
        return text
    return text[:cap] + f"\n... (output truncated: {len(text) - cap} more characters)"


# ---- the tools ---------------------------------------------------------------------------------------------
def tool_read(args: dict, ctx: ToolContext) -> str:
    path = confine(args["filePath"], ctx)
    if not path.exists():
        raise ToolError(f"file not found: {args['filePath']}")
    if path.is_dir():
        raise ToolError(f"{args['filePath']} is a directory, not a file")
    offset = max(0, int(args.get("offset") or 0))
    limit = max(1, int(args.get("limit") or 2000))
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        raise ToolError(f"cannot read binary file: {args['filePath']}")
    lines = data.decode("utf-8", "replace").splitlines()
    body = "\n".join(
        f"{i + 1:05d}| {ln[:2000]}" for i, ln in enumerate(lines[offset : offset + limit], start=offset)
    )
    more = len(lines) - offset - limit
    tail = f"\n\n(File has more lines. Use 'offset' to read beyond line {offset + limit})" if more > 0 else ""
    return f"<file>\n{body}{tail}\n</file>"


def tool_write(args: dict, ctx: ToolContext) -> str:
    path = confine(args["filePath"], ctx)
    if path.is_dir():
        raise ToolError(f"{args['filePath']} is a directory")
    existed = path.exists()
    first_new = next((p for p in reversed([path.parent, *path.parent.parents]) if not p.exists()), None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(args["content"], encoding="utf-8")
    if ctx.uid is not None:  # the sandbox user must be able to change what the tool made
        give_to(first_new or path, ctx.uid)
    return f"{'Overwrote' if existed else 'Wrote'} {args['filePath']} ({len(args['content'])} characters)"


def tool_edit(args: dict, ctx: ToolContext) -> str:
    path = confine(args["filePath"], ctx)
    old, new = args["oldString"], args["newString"]
    if old == new:
        raise ToolError("oldString and newString must be different")
    if not path.is_file():
        raise ToolError(f"file not found: {args['filePath']}")
    text = path.read_text(encoding="utf-8", errors="replace")
    if old == "":
        raise ToolError("oldString must not be empty (use write to create a file)")
    n = text.count(old)
    if n == 0:
        raise ToolError("oldString not found in content")
    if n > 1 and not args.get("replaceAll"):
        raise ToolError(f"oldString found {n} times; give more context to make it unique, or set replaceAll")
    path.write_text(
        text.replace(old, new) if args.get("replaceAll") else text.replace(old, new, 1), encoding="utf-8"
    )
    return f"Edited {args['filePath']} ({n if args.get('replaceAll') else 1} replacement(s))"


def _walk(base: Path, root: Path):
    """Files under `base`; a symlink is listed only when it resolves inside the workspace (never followed out)."""
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for f in sorted(filenames):
            p = Path(dirpath) / f
            if p.is_symlink() and not p.resolve().is_relative_to(root):
                continue
            yield p


def _rel(p: Path, ctx: ToolContext) -> str:
    return str(p.relative_to(ctx.root))


def tool_glob(args: dict, ctx: ToolContext) -> str:
    base = confine(args.get("path") or ".", ctx)
    if not base.is_dir():
        raise ToolError(f"directory not found: {args.get('path')}")
    pattern = args["pattern"]
    hits = []
    for p in _walk(base, ctx.root):
        rel = str(p.relative_to(base))
        if (
            fnmatch.fnmatch(rel, pattern)
            or ("/" not in pattern and fnmatch.fnmatch(p.name, pattern))
            or (pattern.startswith("**/") and fnmatch.fnmatch(rel, pattern[3:]))
        ):
            hits.append(_rel(p, ctx))
    if not hits:
        return "No files found"
    more = f"\n(showing {MAX_LIST} of {len(hits)})" if len(hits) > MAX_LIST else ""
    return "\n".join(hits[:MAX_LIST]) + more


def tool_grep(args: dict, ctx: ToolContext) -> str:
    base = confine(args.get("path") or ".", ctx)
    if not base.exists():
        raise ToolError(f"path not found: {args.get('path')}")
    try:
        rx = re.compile(args["pattern"])
    except re.error as exc:
        raise ToolError(f"invalid regex {args['pattern']!r}: {exc}") from None
    include = args.get("include")
    files = [base] if base.is_file() else _walk(base, ctx.root)
    hits = []
    for p in files:
        if include and not fnmatch.fnmatch(
            p.name, include.lstrip("*/") if include.startswith("**/") else include
        ):
            continue
        try:
            data = p.read_bytes()
        except OSError:
            continue
        if b"\0" in data[:8192]:
            continue
        for i, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
            if rx.search(line):
                hits.append(f"{_rel(p, ctx)}:{i}: {line[:500]}")
                if len(hits) >= MAX_LIST:
                    break
        if len(hits) >= MAX_LIST:
            break
    return "\n".join(hits) if hits else "No matches found"


def tool_bash(args: dict, ctx: ToolContext) -> str:
    cwd = confine(args.get("workdir") or ".", ctx)
    if not cwd.is_dir():
        raise ToolError(f"workdir not found: {args.get('workdir')}")
    timeout_ms = args.get("timeout")
    timeout = ctx.bash_timeout if not timeout_ms else min(float(timeout_ms) / 1000.0, ctx.bash_timeout * 2)
    if timeout <= 0:
        raise ToolError("timeout must be positive")
    turn_left = ctx.deadline - time.monotonic() if ctx.deadline is not None else None
    if turn_left is not None and turn_left < timeout:
        if turn_left <= 0:
            raise ToolError("not run: the turn's time is up (turn_timeout)")
        timeout = turn_left  # the turn's timeout holds for the running command too
    sandboxed = ctx.sandbox == "bwrap"
    env = scrubbed_env(ctx.coral_env, sandboxed=sandboxed, workspace=ctx.root)
    argv = ["bash", "-c", args["command"]]
    ws = Path(ctx.root).resolve()
    with knowledge_fence(ws, ws / KNOWLEDGE_DIR) if sandboxed else contextlib.nullcontext(NO_FENCE) as fence:
        if sandboxed:
            coral = [(ctx.coral_dir, CORAL_MOUNT)] if ctx.coral_dir is not None else []
            argv = bwrap_argv(
                argv,
                cwd=cwd,
                binds=[(ws, ws)],
                fd_binds=fence.fd_binds,
                seccomp_fd=fence.seccomp_fd,
                ro_binds=coral,
                hidden=ctx.hidden,
                uid=ctx.uid,
            )
            argv = wrap_limits(argv, AGENT_LIMITS, ctx.uid)
        ctx.fenced = ctx.fenced and fence.held  # one start without the fence and the edge is not fenced
        # Bytes, not characters: a little more than the cap so the cut is made on characters below.
        res = run_group(
            argv,
            timeout=timeout,
            merge_stderr=True,
            max_output=ctx.output_cap * 4 + 4096,
            env=env,
            cwd=cwd,
            pass_fds=fence.pass_fds,
        )
    if sandboxed and not wait_gone(ctx.uid):  # a process that outlives its command: the edge is not fenced
        ctx.fenced = False
    text = res.stdout.decode("utf-8", "replace")
    if res.dropped:  # already over the cap: cut here, counting what was never read into memory
        more = len(text) - ctx.output_cap + res.dropped
        text = _Capped(text[: ctx.output_cap] + f"\n... (output truncated: {more} more characters)")
    if res.timed_out:
        raise ToolError(f"command timed out after {timeout:g}s\n{_cap(str(text), 2000)}")
    if res.returncode != 0:
        text = type(text)(text + f"\n(exit code {res.returncode})")
    return text


TOOLS = {
    "bash": tool_bash,
    "read": tool_read,
    "write": tool_write,
    "edit": tool_edit,
    "glob": tool_glob,
    "grep": tool_grep,
}


def execute(name: str, raw_arguments, ctx: ToolContext) -> ToolOutcome:
    """Run one tool call; never raises. A call that failed read or wrote nothing, so it is no knowledge action."""
    try:
        args = parse_arguments(name, raw_arguments)
    except ToolError as exc:
        return ToolOutcome(f"Error: {exc}", error=True, knowledge=False)
    knowledge = is_knowledge_action(name, args, ctx.root)
    try:
        text = TOOLS[name](args, ctx)
    except ToolError as exc:
        return ToolOutcome(_cap(f"Error: {exc}", ctx.output_cap), error=True)
    except (OSError, UnicodeError, ValueError) as exc:
        return ToolOutcome(f"Error: {type(exc).__name__}: {exc}", error=True)
    return ToolOutcome(_cap(text, ctx.output_cap), error=False, knowledge=knowledge)
