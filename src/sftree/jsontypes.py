"""The JSON sftree passes around, named once: every floor may import it (a leaf helper, docs/architecture.md).

What others send (OpenAI chat requests and replies, OpenCode's events, a request body from the sandbox, a session's
messages) is a `JSONObject` of `JSONValue`s, read through the narrowing helpers below, which trust no shape; what
came off the wire and is only read, each field checked before use, is a `ForeignJSON`. The Teacher's own code
builds and reads a server's shapes as the protocol fixes them: a `WireObject`. What sftree owns is a TypedDict
beside its writer (the step records and their usage: records/steplog.py; the Teacher's counters: teacher/client.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

# Any value JSON holds, as `object`: every read checks its shape first (isinstance, or `obj`/`arr` below). A
# session's messages and the search's tree documents are this type, with no copy between agents/ and search/.
JSONValue: TypeAlias = object
JSONObject: TypeAlias = dict[str, JSONValue]
JSONList: TypeAlias = list[JSONValue]
# A JSON object as a server, a file or a caller sent it: read with a check of each field it uses.
ForeignJSON: TypeAlias = Mapping[str, object]
# A JSON object the Teacher's modules build or pass on in a server's shape (a request body, a chat message, a
# completion), read as the OpenAI protocol fixes it.
WireObject: TypeAlias = dict[str, Any]
# A document in Coral's own shape that the Teacher's world reads and passes on as Coral's code does: a task's
# task.yaml (or config.yaml) sections, an attempt record (`Attempt.to_dict`), an answer of the bridge to the user's
# Coral, a grader's result. Its fields are read where Coral's own code reads them, with Coral's defaults.
CoralDoc: TypeAlias = dict[str, Any]
# A session's messages and the tools offered, as a caller hands them to the Teacher (read, never changed).
ChatMessages: TypeAlias = Sequence[Mapping[str, object]]
Tools: TypeAlias = Sequence[Mapping[str, object]]


def obj(value: object) -> JSONObject:
    """`value` when it is a JSON object, else an empty one (what `value or {}` reads, for any shape)."""
    return value if isinstance(value, dict) else {}


def arr(value: object) -> JSONList:
    """`value` when it is a JSON array, else an empty one (what `value or []` reads, for any shape)."""
    return value if isinstance(value, list) else []


def count(value: object) -> int:
    """A count as `int(value or 0)` reads it from JSON that holds one (a number, or a numeric string)."""
    return int(value) if isinstance(value, int | float | str) and value else 0
