"""The native agent's file tools, run inside the edge's sandbox as the sandbox user (`python -I -S toolbox.py`).

This file is a program of its own: it imports nothing of sftree (it runs where the project is not visible). It
reads one request from stdin, `{"tool": NAME, "args": {...}, "cwd": DIR, "roots": [DIR, ...], "cap": N}`, runs
the tool and prints one JSON line `{"ok": bool, "text": str}`. Whatever the agent left in its workspace (a FIFO,
a link loop, a huge sparse file, a regular expression that backtracks without end) costs this process alone:
the host bounds its time, memory and output, and reads nothing but this line. Paths must resolve under one of
`roots` (the worktree and the shared knowledge, as the agent sees them).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import stat
import sys

TYPE_CHECKING = False  # `typing` is not imported at run time: every tool call starts this program afresh
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import TypedDict

    class ToolArgs(TypedDict, total=False):
        """The call's arguments, checked by the host against the tool's schema (agents/nativetools.py); a field
        may also be null (the host lets that through, as OpenCode does): the tool's error then says so."""

        filePath: str
        content: str
        oldString: str
        newString: str
        replaceAll: bool
        offset: float
        limit: float
        pattern: str
        path: str
        include: str

    Tool = Callable[[ToolArgs, str, list[str]], str]

MAX_LIST = 200
MAX_LINE = 2000
SKIP_DIRS = {".git", "__pycache__", "node_modules"}


class ToolError(Exception):
    pass


def confine(p: object, cwd: str, roots: Sequence[str]) -> str:
    if not isinstance(p, str) or not p or "\0" in p:
        raise ToolError(f"invalid path {p!r}")
    full = os.path.realpath(os.path.join(cwd, p))
    for r in roots:
        if full == r or full.startswith(r.rstrip("/") + "/"):
            return full
    raise ToolError(f"denied: {p} is outside the workspace")


def _rel(path: str, cwd: str) -> str:
    rel = os.path.relpath(path, cwd)
    return rel if not rel.startswith("..") else path


def _regular(path: str, shown: str) -> os.stat_result:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ToolError(f"file not found: {shown}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ToolError(f"{shown} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(f"{shown} is not a regular file")
    return st


def _number(v: float | None, default: int) -> int:
    if v is None:
        return default
    n = float(v)
    if n != n or n in (float("inf"), float("-inf")):
        raise ToolError(f"not a finite number: {v}")
    return int(n)


def tool_read(a: ToolArgs, cwd: str, roots: list[str]) -> str:
    path = confine(a["filePath"], cwd, roots)
    _regular(path, a["filePath"])
    offset = max(0, _number(a.get("offset"), 0))
    limit = max(1, min(_number(a.get("limit"), 2000), 100000))
    out, more = [], False
    with open(path, "rb") as fh:
        head = fh.read(8192)
        if b"\0" in head:
            raise ToolError(f"cannot read binary file: {a['filePath']}")
        fh.seek(0)
        for i, raw in enumerate(fh):
            if i < offset:
                continue
            if i >= offset + limit:
                more = True
                break
            line = raw[: MAX_LINE * 4].decode("utf-8", "replace").rstrip("\r\n")[:MAX_LINE]
            out.append(f"{i + 1:05d}| {line}")
    tail = f"\n\n(File has more lines. Use 'offset' to read beyond line {offset + limit})" if more else ""
    return "<file>\n" + "\n".join(out) + tail + "\n</file>"


def tool_write(a: ToolArgs, cwd: str, roots: list[str]) -> str:
    path = confine(a["filePath"], cwd, roots)
    if os.path.isdir(path):
        raise ToolError(f"{a['filePath']} is a directory")
    existed = os.path.lexists(path)
    if existed and not stat.S_ISREG(os.stat(path).st_mode):
        raise ToolError(f"{a['filePath']} is not a regular file")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(a["content"])
    return f"{'Overwrote' if existed else 'Wrote'} {a['filePath']} ({len(a['content'])} characters)"


def tool_edit(a: ToolArgs, cwd: str, roots: list[str]) -> str:
    path = confine(a["filePath"], cwd, roots)
    old, new = a["oldString"], a["newString"]
    if old == new:
        raise ToolError("oldString and newString must be different")
    if old == "":
        raise ToolError("oldString must not be empty (use write to create a file)")
    _regular(path, a["filePath"])
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    n = text.count(old)
    if n == 0:
        raise ToolError("oldString not found in content")
    if n > 1 and not a.get("replaceAll"):
        raise ToolError(f"oldString found {n} times; give more context to make it unique, or set replaceAll")
    text = text.replace(old, new) if a.get("replaceAll") else text.replace(old, new, 1)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return f"Edited {a['filePath']} ({n if a.get('replaceAll') else 1} replacement(s))"


def _walk(base: str, roots: list[str]) -> Iterator[str]:
    """Files under `base` (sorted); links are listed only when they lead inside the roots, never followed."""
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for f in sorted(filenames):
            p = os.path.join(dirpath, f)
            if os.path.islink(p):
                try:
                    confine(p, base, roots)
                except ToolError:
                    continue
            yield p


def _dir(a: ToolArgs, cwd: str, roots: list[str], key: str) -> str:
    base = confine(a.get(key) or ".", cwd, roots)
    if not os.path.isdir(base):
        raise ToolError(f"directory not found: {a.get(key)}")
    return base


def tool_glob(a: ToolArgs, cwd: str, roots: list[str]) -> str:
    base = _dir(a, cwd, roots, "path")
    pattern = a["pattern"]
    hits = []
    for p in _walk(base, roots):
        rel = os.path.relpath(p, base)
        name = os.path.basename(p)
        if (
            fnmatch.fnmatch(rel, pattern)
            or ("/" not in pattern and fnmatch.fnmatch(name, pattern))
            or (pattern.startswith("**/") and fnmatch.fnmatch(rel, pattern[3:]))
        ):
            hits.append(_rel(p, cwd))
    if not hits:
        return "No files found"
    more = f"\n(showing {MAX_LIST} of {len(hits)})" if len(hits) > MAX_LIST else ""
    return "\n".join(hits[:MAX_LIST]) + more


def tool_grep(a: ToolArgs, cwd: str, roots: list[str]) -> str:
    base = confine(a.get("path") or ".", cwd, roots)
    if not os.path.exists(base):
        raise ToolError(f"path not found: {a.get('path')}")
    try:
        rx = re.compile(a["pattern"])
    except re.error as exc:
        raise ToolError(f"invalid regex {a['pattern']!r}: {exc}") from None
    include = a.get("include")
    files = [base] if os.path.isfile(base) else _walk(base, roots)
    hits = []
    for p in files:
        if include and not fnmatch.fnmatch(
            os.path.basename(p), include[3:] if include.startswith("**/") else include
        ):
            continue
        try:
            if not stat.S_ISREG(os.stat(p).st_mode):
                continue
            with open(p, "rb") as fh:
                if b"\0" in fh.read(8192):
                    continue
                fh.seek(0)
                for i, raw in enumerate(fh, start=1):
                    line = raw[: MAX_LINE * 4].decode("utf-8", "replace").rstrip("\r\n")
                    if rx.search(line):
                        hits.append(f"{_rel(p, cwd)}:{i}: {line[:500]}")
                        if len(hits) >= MAX_LIST:
                            break
        except OSError:
            continue
        if len(hits) >= MAX_LIST:
            break
    return "\n".join(hits) if hits else "No matches found"


TOOLS: dict[str, Tool] = {
    "read": tool_read,
    "write": tool_write,
    "edit": tool_edit,
    "glob": tool_glob,
    "grep": tool_grep,
}


def main() -> None:
    req = json.loads(sys.stdin.read())
    cwd, roots = req["cwd"], [os.path.realpath(r) for r in req["roots"]]
    try:
        text, ok = TOOLS[req["tool"]](req["args"], cwd, roots), True
    except ToolError as exc:
        text, ok = f"Error: {exc}", False
    except Exception as exc:  # noqa: BLE001 - any failure of a tool is that tool's error
        text, ok = f"Error: {type(exc).__name__}: {exc}", False
    cap = int(req.get("cap", 30000))
    if len(text) > cap:
        text = text[:cap] + f"\n... (output truncated: {len(text) - cap} more characters)"
    sys.stdout.write(json.dumps({"ok": ok, "text": text}) + "\n")


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    main()
