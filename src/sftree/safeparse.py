"""JSON and YAML from someone else's files, parsed within limits: size, nesting depth, and for YAML no aliases.

Python's parsers recurse once per nesting level, so 100,000 nested lists end in a RecursionError, and a YAML
alias names a node that is shared, not copied: nine aliases to nine aliases ... (a few hundred bytes) make a
value whose every walk (a comparison, `repr` in an error message) visits billions of nodes. Here:

- `json_loads`: the depth is measured on the bytes before the parser sees them (strings skipped), so the parser
  never goes deeper than `max_depth`;
- `yaml_load`: a `SafeLoader` whose composer refuses any alias (Coral writes its config with `yaml.dump` of
  fresh containers, which never makes one), nesting deeper than `max_depth` and more than `max_nodes` values,
  each as it is met, before the document is built.

Errors are `LimitError` (a ValueError) naming the field, or the parser's own error for malformed text.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from sftree.display import shown

if TYPE_CHECKING:  # (annotations: yaml is imported where YAML is read, never for JSON alone)
    import yaml


class _Mark(Protocol):
    """Where PyYAML met a node (its pure-Python and its C Mark alike)."""

    line: int
    column: int


class LimitError(ValueError):
    """The text is well-formed but past a limit; the message names where (YAML: the field, line and column)."""


# --- JSON ---------------------------------------------------------------------------------------------------

_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.S)  # a JSON string (possessive: linear on any input)
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text `data` (brackets inside strings not counted)."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKET)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def json_loads(data: bytes, *, max_bytes: int, max_depth: int) -> Any:
    """`json.loads` of UTF-8 `data`, refused (LimitError) past `max_bytes` or nested deeper than `max_depth`.
    UnicodeDecodeError and json.JSONDecodeError as json.loads raises them."""
    if len(data) > max_bytes:
        raise LimitError(f"holds {len(data)} bytes, more than {max_bytes}")
    # Every bracket, strings included, bounds the depth from above: the usual record needs no closer look.
    if data.count(b"[") + data.count(b"{") > max_depth and json_depth(data) > max_depth:
        raise LimitError(f"arrays and objects nested deeper than {max_depth} levels")
    text = data.decode("utf-8")
    try:
        return json.loads(text)
    except RecursionError:  # cannot happen below max_depth; kept so no input can end the caller
        raise LimitError(f"arrays and objects nested deeper than {max_depth} levels") from None


# --- YAML ---------------------------------------------------------------------------------------------------


def _yaml_loader(max_depth: int, max_nodes: int) -> type[yaml.SafeLoader]:
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader whose composer checks each node as it is met (the field path is kept for messages)."""

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.path: list[str] = []
            self.nodes = 0

        def _refuse(self, mark: _Mark | None, what: str) -> NoReturn:
            where = _field(self.path)
            at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            raise LimitError(f"{where}{at}: {what}")

        def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
            part = _part(parent, index)
            self.path.append(part)
            try:
                # types-PyYAML leaves Parser.peek_event unannotated: it returns the next Event
                event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
                if isinstance(event, yaml.AliasEvent):
                    self._refuse(
                        event.start_mark,
                        f"a YAML alias (*{shown(str(event.anchor))[:40]}); sftree reads no aliases in this file",
                    )
                if len(self.path) > max_depth:
                    self._refuse(event.start_mark, f"values nested deeper than {max_depth} levels")
                self.nodes += 1
                if self.nodes > max_nodes:
                    self._refuse(event.start_mark, f"more than {max_nodes} values in the file")
                # types-PyYAML types `index` as int; PyYAML passes a mapping value's key node (or None) too
                return super().compose_node(parent, index)  # type: ignore[arg-type]
            finally:
                self.path.pop()

    return Loader


def _part(parent: yaml.Node | None, index: object) -> str:
    """The path component of the node composed under `parent` at `index` (PyYAML's resolver arguments)."""
    import yaml

    if parent is None:
        return ""
    if isinstance(index, int):
        return f"[{index}]"
    if isinstance(index, yaml.ScalarNode):  # a mapping's value: named by its key
        return shown(index.value)[:60]
    if isinstance(parent, yaml.MappingNode) and index is None:
        return "(a key)"
    return "(a complex key)"


def _field(path: list[str]) -> str:
    out = ""
    for part in path:
        if not part:
            continue
        out += part if part.startswith("[") or not out else f".{part}"
    return out or "the document"


def yaml_load(text: str, *, max_depth: int = 32, max_nodes: int = 10_000) -> Any:
    """`yaml.safe_load(text)` with no alias, at most `max_depth` levels and `max_nodes` values (LimitError);
    yaml.YAMLError for malformed text."""
    loader = _yaml_loader(max_depth, max_nodes)(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
