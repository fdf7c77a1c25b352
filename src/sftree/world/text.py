"""The agent-text rule (docs/runtime.md, "The agent's text"): text the agent or its graded code wrote may appear
in a block the host builds, never so that it reads as the host's.

Coral's blocks (the manager's `## Eval #N Results` header, `coral eval`'s ruled block) are line-oriented: every line
the host writes starts a field (`Score:`, `Commit:`, `Status:`, ...) or a rule at the first column. Agent text gets
the smallest change that keeps it off those lines:

- `one_line`: the eval message (`What you did:`, the attempt title) is one line: every line break (anything
  `str.splitlines` breaks at: `\\n`, `\\r`, `\\v`, `\\f`, `\\x1c-\\x1e`, `\\x85`, `\\u2028`, `\\u2029`) becomes one
  space, and every other control character (ANSI escapes, backspace, NUL) becomes `\\ufffd`.
- `quoted`: feedback (the grader's text, which may carry an exception or output of the graded code) keeps its first
  line after `Feedback: `; a further line that could pass for one of the host's is prefixed with `> ` (a quote):
  one that, past leading blanks and markdown marks (`- * + > # | ` _`), starts with a label of Coral's blocks
  (`Eval #`, `CORAL Eval`, `CORAL Wait`, `Score`, `Commit`, `Status`, `What you did`, `Budget`, `Feedback`,
  `Tip:`, `Heartbeat`, any case), a markdown heading (`#`), or is a rule (three or more `=`, `-`, `*`, `_`). Other
  lines (Coral's usual `name: explanation` lines of a bundle) stay as they are, so an ordinary feedback reads
  exactly as Coral prints it. Control characters as above, on every line.

Both are applied to the record before Coral's own code formats it, so the rest of the block is Coral's, byte for
byte. Text without line breaks or control characters is unchanged.
"""

from __future__ import annotations

import unicodedata

QUOTE = "> "


def _clean(line: str) -> str:
    return "".join(ch if ch == "\t" or unicodedata.category(ch) != "Cc" else "\ufffd" for ch in line)


def one_line(text: str | None) -> str:
    """The message or title on one line (see the module docstring)."""
    if not text:
        return text or ""
    return _clean(" ".join(str(text).splitlines()))


LABELS = (
    "eval #",
    "coral eval",
    "coral wait",
    "score",
    "commit",
    "status",
    "what you did",
    "budget",
    "feedback",
    "tip:",
    "heartbeat",
)
_MARKS = " \t-*+>#|`_"


def looks_like_host(line: str) -> bool:
    """Could this line pass for one the host writes in Coral's blocks (see the module docstring)?"""
    bare = line.lstrip()
    if bare.startswith("#"):
        return True
    core = bare.strip()
    if len(core) >= 3 and len(set(core)) == 1 and core[0] in "=-*_":
        return True
    rest = bare.lstrip(_MARKS).lower()
    return rest.startswith(LABELS)


def quoted(text: str | None) -> str:
    """Feedback whose later lines cannot pass for the host's (see the module docstring)."""
    if not text:
        return text or ""
    lines = str(text).splitlines()
    if not lines:
        return ""
    rest = [QUOTE + _clean(ln) if looks_like_host(ln) else _clean(ln) for ln in lines[1:]]
    ends = str(text).splitlines(True)[-1] != lines[-1]  # a final line break is kept (as "\n")
    return "\n".join([_clean(lines[0]), *rest]) + ("\n" if ends else "")


def safe_attempt(record: dict) -> dict:
    """A copy of an attempt record whose agent-written fields obey the rule (title one line, feedback quoted)."""
    out = dict(record)
    out["title"] = one_line(out.get("title"))
    out["feedback"] = quoted(out.get("feedback"))
    return out
