"""The agent-text rule (docs/runtime.md, "The agent's text"): text the agent or its graded code wrote may appear
in a block the host builds, never so that it reads as the host's.

Coral's blocks (the manager's `## Eval #N Results` header, `coral eval`'s ruled block) are line-oriented: every line
the host writes starts a field (`Score:`, `Commit:`, `Status:`, ...) or a rule at the first column. Agent text gets
the smallest change that keeps it off those lines:

- `one_line`: the eval message (`What you did:`, the attempt title) is one line: every line break (anything
  `str.splitlines` breaks at: `\\n`, `\\r`, `\\v`, `\\f`, `\\x1c-\\x1e`, `\\x85`, `\\u2028`, `\\u2029`) becomes one
  space, and every other control character (ANSI escapes, backspace, NUL) becomes `\\ufffd`.
- `quoted`: feedback (the grader's text, which may carry an exception or output of the graded code) keeps its first
  line after `Feedback: `; each further line is prefixed with `> ` (a quote, never the first column of a field or
  a rule), with the same control-character rule.

Both are applied to the record before Coral's own code formats it, so the rest of the block is Coral's, byte for
byte. Text without line breaks or control characters is unchanged.
"""

from __future__ import annotations

import unicodedata

QUOTE = "> "


def _clean(line: str) -> str:
    return "".join(
        ch if ch == "\t" or unicodedata.category(ch) != "Cc" else "\ufffd" for ch in line
    )


def one_line(text: str | None) -> str:
    """The message or title on one line (see the module docstring)."""
    if not text:
        return text or ""
    return _clean(" ".join(str(text).splitlines()))


def quoted(text: str | None) -> str:
    """Feedback whose lines after the first are quoted (see the module docstring)."""
    if not text:
        return text or ""
    lines = str(text).splitlines()
    if not lines:
        return ""
    return "\n".join([_clean(lines[0]), *(QUOTE + _clean(ln) for ln in lines[1:])])


def safe_attempt(record: dict) -> dict:
    """A copy of an attempt record whose agent-written fields obey the rule (title one line, feedback quoted)."""
    out = dict(record)
    out["title"] = one_line(out.get("title"))
    out["feedback"] = quoted(out.get("feedback"))
    return out
