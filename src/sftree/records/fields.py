"""Field checks for the readers of records/ (paths.json, the SFT records): each names where it failed, so a wrong
file fails naming itself and the field instead of reading as empty."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sftree.errors import InputError


class Fields:
    """The fields of one JSON object read at `where` (a file, or a file and the path to an object in it). `what`:
    the document a top-level object is ("the paths document"); None for an object inside one."""

    def __init__(self, d: Any, where: str, what: str | None = None):
        if not isinstance(d, dict):
            raise InputError(f"{where}: {f'{what} is not' if what else 'expected'} a JSON object")
        self.d: Mapping[str, Any] = d
        self.sep = ": " if what else "."
        self.where = where

    def get(self, key: str, ok: Callable[[Any], bool], expected: str) -> Any:
        if key not in self.d:
            raise InputError(f"{self.where}{self.sep}{key}: missing")
        return self.check(key, ok, expected)

    def opt(self, key: str, ok: Callable[[Any], bool], expected: str) -> Any:
        """A field that may be absent: None then (a present field is checked as `get` does)."""
        return self.check(key, ok, expected) if key in self.d else None

    def check(self, key: str, ok: Callable[[Any], bool], expected: str) -> Any:
        value = self.d[key]
        if not ok(value):
            raise InputError(f"{self.where}{self.sep}{key}: expected {expected}, got {value!r:.80}")
        return value

    def at(self, key: str) -> str:
        """Where a nested object of this one is (for its own `Fields`)."""
        return f"{self.where}{self.sep}{key}"


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def is_bool(x: Any) -> bool:
    return isinstance(x, bool)


def is_str(x: Any) -> bool:
    return isinstance(x, str)


def is_strs(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(s, str) for s in x)


def is_ints(x: Any) -> bool:
    return isinstance(x, list) and all(is_int(i) for i in x)


def is_list(x: Any) -> bool:
    return isinstance(x, list)


def is_object(x: Any) -> bool:
    return isinstance(x, dict)


def is_objects(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(o, dict) for o in x)


def optional(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda x: x is None or ok(x)
