"""The agent-text rule (docs/runtime.md, "The agent's text"): text the agent or its graded code wrote may appear
in a block the host builds, never so that it reads as the host's.

Coral's blocks (the manager's `## Eval #N Results` header, `coral eval`'s ruled block, `coral show`) are
line-oriented: every line the host writes starts a field (`Score:`, `Commit:`, `Status:`, ...) or a rule at the
first column. One function decides whether a line could pass for one of those, `looks_like_host`, and it decides
on the line as a reader takes it (`normalised`): folded to NFKC (fullwidth `Ｓcore`, mathematical bold letters,
`＃` are the ASCII they stand for), without control characters, format characters (Unicode category Cf: U+200B,
U+FEFF, U+00AD, bidi marks, U+2060, tag characters, ...) and the other invisible code points (Unicode's
default-ignorables: U+034F, variation selectors, Hangul fillers), U+2800 (a blank) as a space. Such a line, past
blanks and markdown marks (`- * + # | ` _`), starts with a label of Coral's blocks (`Eval #`, `CORAL Eval`, `CORAL
Wait`, `Score`, `Commit`, `Status`, `What you did`, `Budget`, `Feedback`, `Tip:`, `Heartbeat`, any case), a
markdown heading (`#`), or is a rule (three or more `=`, `-`, `*`, `_`, spaces between allowed). A line that
starts with `>` is a quote, which is how agent text is marked: never the host's.

What is shown is the agent's own characters, not the normalised form (a fullwidth letter stays fullwidth, so
ordinary text is never rewritten), with only what no reader sees changed: format and invisible characters are
dropped (they cannot hide a line's start nor reorder what is shown), control characters other than tab become
U+FFFD. On top of that, agent text gets the smallest change that keeps it off the host's lines:

- `one_line`: text shown after a host label on the label's line (the eval message as `What you did:`, the title,
  an error naming the agent's file): every line break (anything `str.splitlines` breaks at: `\\n`, `\\r`, `\\v`,
  `\\f`, `\\x1c-\\x1e`, `\\x85`, `\\u2028`, `\\u2029`) becomes one space.
- `own_line`: agent text shown as a line of its own (the eval message as the commit's message, which `git log`
  and Coral's `coral show` print): one line, and `> ` in front when it reads as the host's.
- `quoted`: feedback (the grader's text, which may carry an exception or output of the graded code) keeps its first
  line after `Feedback: `; every further line is an `own_line`. Lines that do not read as the host's (Coral's
  usual `name: explanation` lines of a bundle) stay as they are, so an ordinary feedback reads exactly as Coral
  prints it.

All are idempotent (a record shown once can be shown again: the restart prompt, the attempt records), and are
applied to the record before Coral's own code formats it, so the rest of the block is Coral's, byte for byte.
"""

from __future__ import annotations

import unicodedata

from sftree.jsontypes import CoralDoc

QUOTE = "> "

# Invisible code points outside categories Cc and Cf (Unicode's Default_Ignorable_Code_Point): combining grapheme
# joiner, Hangul fillers, Khmer inherent vowels, Mongolian variation selectors, variation selectors.
_INVISIBLE = frozenset(
    [0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0]
    + list(range(0x180B, 0x1810))
    + list(range(0xFE00, 0xFE10))
    + list(range(0xE0100, 0xE01F0))
)
_BLANK = {"\u2800": " "}  # Braille blank: shown as it is, read as a space


def _hidden(ch: str) -> bool:
    return unicodedata.category(ch) == "Cf" or ord(ch) in _INVISIBLE


_ASCII_CC = [*range(0x09), *range(0x0A, 0x20), 0x7F]  # in ASCII, NFKC changes nothing and nothing is Cf
_SHOWN_ASCII = dict.fromkeys(_ASCII_CC, "\ufffd")
_READ_ASCII = dict.fromkeys(_ASCII_CC)


def _shown(line: str) -> str:
    """The agent's characters as shown: invisible ones dropped, control characters (tab aside) as U+FFFD."""
    if line.isascii():
        return line.translate(_SHOWN_ASCII)
    out = []
    for ch in line:
        if ch != "\t" and unicodedata.category(ch) == "Cc":
            out.append("\ufffd")
        elif not _hidden(ch):
            out.append(ch)
    return "".join(out)


def normalised(line: str) -> str:
    """The line as a reader takes it (see the module docstring): what `looks_like_host` decides on."""
    if line.isascii():
        return line.translate(_READ_ASCII)

    def strip(s: str) -> str:
        return "".join(
            _BLANK.get(ch, ch)
            for ch in s
            if ch == "\t" or not (_hidden(ch) or unicodedata.category(ch) == "Cc")
        )

    return strip(unicodedata.normalize("NFKC", strip(line)))  # NFKC can make an invisible one (U+3164)


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
    """Could this line pass for one the host writes in Coral's blocks? The one decision (see the module docstring)."""
    bare = normalised(line).lstrip()
    if bare.startswith(">"):
        return False  # a quote: how agent text is marked
    if bare.startswith("#"):
        return True
    core = bare.replace(" ", "").replace("\t", "")
    if len(core) >= 3 and len(set(core)) == 1 and core[0] in "=-*_":
        return True
    return bare.lstrip(_MARKS).casefold().startswith(LABELS)


def one_line(text: str | None) -> str:
    """Text for the line of a host label, on one line (see the module docstring)."""
    return _shown(" ".join(str(text).splitlines())) if text else ""


def own_line(text: str | None) -> str:
    """Agent text as a line of its own: one line, quoted when it reads as the host's (decided on the text as
    written, before control characters are shown as U+FFFD)."""
    line = " ".join(str(text).splitlines()) if text else ""
    return (QUOTE if looks_like_host(line) else "") + _shown(line)


def quoted(text: str | None) -> str:
    """Feedback whose later lines cannot pass for the host's (see the module docstring)."""
    if not text:
        return text or ""
    lines = str(text).splitlines()
    if not lines:
        return ""
    ends = str(text).splitlines(True)[-1] != lines[-1]  # a final line break is kept (as "\n")
    return "\n".join([one_line(lines[0]), *(own_line(ln) for ln in lines[1:])]) + ("\n" if ends else "")


def safe_attempt(record: CoralDoc) -> CoralDoc:
    """A copy of an attempt record whose agent-written fields obey the rule (title one line, feedback quoted)."""
    out = dict(record)
    out["title"] = one_line(out.get("title"))
    out["feedback"] = quoted(out.get("feedback"))
    return out
