"""Whether a tool call is a *knowledge action* (DESIGN.md), for both agent backends.

A knowledge action reads or writes under the shared knowledge: the worktree's `.opencode/{notes,skills,attempts,
roles}` (Coral's links into the shared folder), the shared folder `.coral/public/` and those items in it, or
lists one of those two folders; or it runs `coral notes|skills|log|show`. `coral eval` does not count.

Every tool OpenCode 1.18.33 offers is decided by what it touches, from its arguments as the model sent them:

| tool | what is read |
|---|---|
| `read`, `write`, `edit` | `filePath` |
| `glob` | `path` (the folder searched) and `pattern` under it |
| `grep` | `path` and `include` (a file glob) under it; `pattern` is a regex over contents, not a path |
| `list` | `path` |
| `apply_patch` | every file its `patchText` names: `*** Add File:`, `*** Update File:`, `*** Delete File:`, `*** Move to:` |
| `skill` | always: it loads a skill from the shared skills |
| `bash` | `coral notes|skills|log|show`, `workdir`, and every path its command names (a `coral eval` message aside) |

Paths are taken as the tool takes them: relative to the worktree (bash: to its `workdir`), `./` and `..`
segments folded, absolute ones as the sandbox shows them (`agent.run_dir`). A path also counts when it names
`.opencode/<item>` or `.coral/public[/<item>]` anywhere in it (`/proc/self/cwd/.opencode/notes`, `$HOME/...`):
the host never resolves a path the agent named, so text that reaches the knowledge through a link it cannot see
is judged by its names. Glob patterns count when they can match under the knowledge; as in OpenCode's ripgrep
and the shell, a wildcard does not match a hidden name, so `**/*.md` does not reach into `.opencode/`.

Pure functions: the caller says where the worktree and the shared folder are as the agent sees them. Whether the
call succeeded is the caller's to add (a call that failed as a tool read or wrote nothing).
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
import shlex
from collections.abc import Mapping

ITEMS = ("notes", "skills", "attempts", "roles")  # the shared items that are knowledge (Coral's CORAL_ITEMS)
SHARED_REL = ".coral/public"  # the shared folder, relative to the Coral run folder
# The knowledge folders as names that may appear anywhere in a path (module docstring).
_REL_BASES = ((".opencode",), (".coral", "public"))
_KNOWLEDGE_SUBCMDS = frozenset({"notes", "skills", "log", "show"})
# `coral notes|skills|log|show` in text the shell tokenizer could not split (or in a `bash -c` string).
_KNOWLEDGE_CMD_RX = re.compile(r"(^|[\s;&|(`/!{])coral\s+(notes|skills|log|show)\b")
# What separates path-like words inside one shell word (`python -c "open('x')"`, `--dir=x`, `a:b`).
_WORD_SPLIT = re.compile(r"""[\s;&|()<>`'"=,:]+""")
_PATCH_HEADERS = ("*** Add File:", "*** Update File:", "*** Delete File:", "*** Move to:")
_PATH_KEYS = ("filePath", "path", "file_path")  # a tool this table does not know: its path arguments
# A pattern part that may match a hidden name (`.*`, `.o?encode`, `{x,.o*}`): only such reach a hidden folder
# without naming it; in a path, and anywhere in a command's text.
_HIDDEN_WILD = re.compile(r"(^|[/{,])\.[^/]*[*?\[{]")
_HIDDEN_WILD_TEXT = re.compile(r"(^|[\s/{,'\"=:(])\.[^/\s]*[*?\[{]")
_MAX_BRACES = 64  # brace alternatives expanded per pattern; past that `{...}` is taken as `*`


def is_knowledge_action(
    tool: str, args: Mapping[str, object], worktree: str = ".", shared: str | None = None
) -> bool:
    """DESIGN.md's knowledge action, from the call's arguments alone. `worktree`: the agent's cwd as it sees it
    ("." when unknown: relative paths are still judged); `shared`: the shared folder as it sees it (default: Coral's
    layout, `<worktree>/../../.coral/public`)."""
    if not isinstance(args, dict):
        return False
    wt = posixpath.normpath(worktree or ".")
    where = (wt, posixpath.normpath(shared) if shared else posixpath.normpath(f"{wt}/../../{SHARED_REL}"))
    if tool == "skill":
        return True
    if tool == "bash":
        return _bash(args, where)
    if tool == "apply_patch":
        text = args.get("patchText")
        return isinstance(text, str) and any(_names(p, wt, where) for p in patch_paths(text))
    if tool in ("glob", "grep"):
        base = _str(args.get("path"))
        if base and _names(base, wt, where):
            return True
        pat = _str(args.get("pattern" if tool == "glob" else "include"))
        folder = posixpath.join(wt, base) if base else wt
        return bool(pat) and _names(pat, folder, where, glob=True)
    if tool in ("read", "write", "edit"):
        return _names(_str(args.get("filePath")), wt, where)
    return any(_names(_str(args.get(k)), wt, where) for k in _PATH_KEYS)


def patch_paths(text: str) -> list[str]:
    """The files an apply_patch text names, as OpenCode's parser reads its headers (whole text trimmed, a heredoc
    wrapper dropped, lines split on newlines, a header starts its line, the path is the rest trimmed)."""
    out = []
    for line in text.strip().replace("\r\n", "\n").split("\n"):
        for h in _PATCH_HEADERS:
            if line.startswith(h) and line[len(h) :].strip():
                out.append(line[len(h) :].strip())
    return out


# ---- bash ----------------------------------------------------------------------------------------------------
def _bash(args: Mapping[str, object], where: tuple[str, str]) -> bool:
    wt = where[0]
    workdir = _str(args.get("workdir"))
    if workdir and _names(workdir, wt, where):
        return True
    cwd = posixpath.normpath(posixpath.join(wt, workdir)) if workdir else wt
    cmd = _str(args.get("command"))
    hints = (".opencode", ".coral", where[1])
    if not any(h in cwd for h in hints) and not (
        any(h in cmd for h in ("coral", *hints)) or _HIDDEN_WILD_TEXT.search(cmd)
    ):
        return False  # names no folder and no coral command (most commands): no need to split it
    words = _shell_words(cmd)
    if words is None:  # unbalanced quotes: judge the raw text
        return bool(_KNOWLEDGE_CMD_RX.search(cmd)) or _any_path(cmd, cwd, where)
    for i, w in enumerate(words):
        if posixpath.basename(w) == "coral" and i + 1 < len(words) and words[i + 1] in _KNOWLEDGE_SUBCMDS:
            return True
    for w in _without_eval_messages(words):
        if _KNOWLEDGE_CMD_RX.search(w) or _any_path(w, cwd, where):
            return True
    return False


def _shell_words(cmd: str) -> list[str] | None:
    """The command's words as the shell splits them (quotes removed, `;&|()<>` apart); None if it cannot."""
    lex = shlex.shlex(cmd, posix=True, punctuation_chars=";&|()<>")
    lex.whitespace_split = True
    lex.commenters = ""  # a `#` inside a word is text; a comment naming a path is judged as text too
    try:
        return list(lex)
    except ValueError:
        return None


def _without_eval_messages(words: list[str]) -> list[str]:
    """`words` less the message of each `coral eval -m MSG` (its text names no file it reads)."""
    out, in_eval, skip = [], False, False
    for i, w in enumerate(words):
        if skip:
            skip = False
            continue
        if w and set(w) <= set(";&|()<>"):
            in_eval = False
        elif posixpath.basename(w) == "coral" and i + 1 < len(words) and words[i + 1] == "eval":
            in_eval = True
        elif in_eval and w in ("-m", "--message"):
            skip = True
            continue
        elif in_eval and (w.startswith("--message=") or (w.startswith("-m") and len(w) > 2)):
            continue
        out.append(w)
    return out


def _any_path(text: str, cwd: str, where: tuple[str, str]) -> bool:
    return any(_names(p, cwd, where, glob=True) for p in _WORD_SPLIT.split(text) if p)


# ---- paths ---------------------------------------------------------------------------------------------------
def _str(v: object) -> str:
    return v if isinstance(v, str) else ""


def _names(path: str, cwd: str, where: tuple[str, str], *, glob: bool = False) -> bool:
    """Whether `path` (taken from `cwd`; a glob pattern when `glob`) names the knowledge (module docstring)."""
    if not path:
        return False
    unresolved = path.startswith("~") or "$" in path or "\\" in path  # the shell would expand it: judge names
    full = posixpath.normpath(path if unresolved else posixpath.join(cwd, path))
    wt, shared = where
    if not any(h in full for h in (".opencode", ".coral", shared)) and not (
        glob and _HIDDEN_WILD.search(full)
    ):
        return False  # names neither folder, nor a wildcard that could match one (hidden names): most paths
    pats = _expand_braces(full) if glob else [full]
    anchored = (tuple(_parts(posixpath.join(wt, ".opencode"))), tuple(_parts(shared)))
    for pat in pats:
        parts = _parts(pat)
        if not unresolved and any(_reaches(parts, base, glob) for base in anchored):
            return True
        for k in range(len(parts)):  # the knowledge folders' names anywhere in the path
            if any(_reaches(parts[k:], base, glob) for base in _REL_BASES):
                return True
    return False


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _reaches(pat: list[str], base: tuple[str, ...], glob: bool) -> bool:
    """Whether the path (or pattern) `pat`, read from its first part, is the folder `base` itself or is at or
    under one of its knowledge items."""
    folder = list(base)
    if _match(pat, folder, glob, exact=True):
        return True
    return any(_match(pat, [*folder, item], glob, exact=False) for item in ITEMS)


def _match(pat: list[str], target: list[str], glob: bool, *, exact: bool) -> bool:
    """`exact`: `pat` matches exactly `target`; else: `pat` matches `target` or something under it."""
    memo: dict[tuple[int, int], bool] = {}

    def go(i: int, j: int) -> bool:
        key = (i, j)
        if key in memo:
            return memo[key]
        if j == len(target):
            res = i == len(pat) or (i == len(pat) - 1 and pat[i] == "**" and glob) or not exact
        elif i == len(pat):
            res = False
        elif glob and pat[i] == "**":
            res = go(i + 1, j) or (not target[j].startswith(".") and go(i, j + 1))
        else:
            res = _component(pat[i], target[j], glob) and go(i + 1, j + 1)
        memo[key] = res
        return res

    return go(0, 0)


def _component(pat: str, name: str, glob: bool) -> bool:
    if not glob or not any(c in pat for c in "*?["):
        return pat == name
    if name.startswith(".") and not pat.startswith("."):
        return False  # a wildcard does not match a hidden name (ripgrep, the shell)
    return fnmatch.fnmatchcase(name, pat)


def _expand_braces(pat: str) -> list[str]:
    """`a/{notes,skills}/*` -> both; nested braces too; past _MAX_BRACES alternatives `{...}` is `*`."""
    out, todo = [], [pat]
    while todo:
        p = todo.pop()
        m = re.search(r"\{([^{}]*)\}", p)
        if not m:
            out.append(p)
            continue
        if len(out) + len(todo) > _MAX_BRACES:
            todo.append(p[: m.start()] + "*" + p[m.end() :])
            continue
        todo.extend(p[: m.start()] + alt + p[m.end() :] for alt in m.group(1).split(","))
    return out
