"""The JSON shapes the Teacher's modules pass around, named once.

A chat request, a reply and the session's messages are the servers' shapes (OpenAI's chat completions), not ours:
what a caller builds and reads on is a `JSONObject`; what came off the wire and is only read, with a check before
each use, is a `ForeignJSON`. The shapes sftree itself writes (usage, the client's counters and incidents) are
TypedDicts beside their writers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# A JSON object built or passed on as a server's shape (a request body, a chat message, a completion).
JSONObject = dict[str, Any]
# A JSON object as a server, a file or a caller sent it: read with a check of each field it uses.
ForeignJSON = Mapping[str, object]
# A section of the validated config (workflow/schemas/config.schema.yaml checked each value's type).
ConfigSection = Mapping[str, Any]
# A session's messages and the tools offered, as a caller hands them to the Teacher (read, never changed).
ChatMessages = Sequence[Mapping[str, object]]
Tools = Sequence[Mapping[str, object]]
