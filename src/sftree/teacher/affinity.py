"""Session affinity behind smg: the routing key a Teacher session's requests carry.

smg (the router's successor, docs/serving.md) pins every request with the same `x-smg-routing-key` to one worker
(`smg launch --routing-key-override`: the first request of a key goes where the policy sends it, cache_aware
there, then the key stays on that worker while it is healthy), so a session's growing prefix stays in one
worker's cache instead of being rebuilt on another. A session is one edge of one tree: the search names both in
the `X-Sftree-Tree` and `X-Sftree-Edge` headers of each of its requests (search/edge.py), and the key is made from
them, so every turn of the edge shares it and two edges never do. sglang-router ignores the header.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

ROUTING_KEY_HEADER = "x-smg-routing-key"


def routing_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """{x-smg-routing-key: key} for a request whose headers name its tree and edge; {} for any other request.
    The key is a digest (short, plain hex: a header value any router accepts, whatever the tree's name)."""
    low = {k.lower(): v for k, v in headers.items()}
    tree, edge = low.get("x-sftree-tree"), low.get("x-sftree-edge")
    if not tree or not edge:
        return {}
    key = hashlib.sha256(f"{tree}\0{edge}".encode()).hexdigest()[:32]
    return {ROUTING_KEY_HEADER: key}
