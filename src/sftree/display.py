"""Text from someone else's files, made safe to print: every character a terminal would act on is escaped.

A file name, a record field or a YAML key of an imported run can hold terminal escape sequences (retitle the
window, clear the screen, hide text), bidirectional overrides or other invisible characters. `shown` turns each
character that is not printable into a visible escape (`\\x1b`, `\\u202e`, bytes that are not UTF-8 as
`\\xff`), so a message prints exactly what is there and can do nothing else. Printable text, the usual case,
comes back as it is (one `str.isprintable` call).
"""

from __future__ import annotations

import os

_KEEP_IN_LINES = frozenset("\n\t")


def shown(text: str | bytes | os.PathLike[str], *, lines: bool = False) -> str:
    """`text` with every non-printable character escaped. `lines=True` keeps newlines and tabs (a multi-line
    message of our own); otherwise the result is one line. Bytes that are not UTF-8 (and the surrogates
    `os.fsdecode` makes of them) appear as `\\xNN`."""
    if isinstance(text, os.PathLike):
        text = os.fspath(text)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() or (lines and ch in _KEEP_IN_LINES):
            out.append(ch)
            continue
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
            code -= 0xDC00
        out.append(
            f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
        )
    return "".join(out)
