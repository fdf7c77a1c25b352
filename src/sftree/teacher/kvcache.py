"""A model of SGLang's prefix (radix) cache, shared by every tree that talks to one server.

SGLang keeps the KV of earlier requests in one radix tree per server, bounded by the GPU memory left for KV
("KV room"), and evicts least-recently-used leaves when a new request needs room. A request reuses the longest
cached prefix of its prompt; its prompt, and then its reply, stay cached. How much of a fleet's prompts the cache
serves therefore depends on the room and on how many sessions compete for it, which teacher-sim's per-tree
estimate (every prefix ever seen, never evicted) cannot show.

The model works at message granularity (a prompt is the chain of its messages, each with its token count), as
teacher-sim counts tokens; SGLang matches at token (page) granularity, so the model can only under-count reuse
inside a message. Requests in flight are not pinned against eviction (SGLang pins them), so under pressure the
model evicts a little more than SGLang would. `replay` runs a time-ordered trace through one cache.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Block:
    """One radix node: the chained hash of a prompt prefix ending at a message boundary, and its own tokens."""

    key: bytes
    tokens: int


@dataclass
class RadixLRU:
    """The cache: nodes keyed by their prefix hash, in LRU order. A walk touches its nodes deepest first, so a
    parent is always more recent than its children and the least recently used node is a leaf: evicting it never
    orphans a cached child (SGLang evicts leaves only)."""

    capacity: float  # tokens; float("inf") for an unbounded cache
    nodes: OrderedDict = field(default_factory=OrderedDict)
    used: int = 0
    evicted: int = 0

    def lookup(self, blocks: list[Block]) -> int:
        """Tokens of the longest cached prefix of `blocks` (touching the matched nodes)."""
        hit = n = 0
        for b in blocks:
            if b.key not in self.nodes:
                break
            hit += b.tokens
            n += 1
        for b in reversed(blocks[:n]):
            self.nodes.move_to_end(b.key)
        return hit

    def insert(self, blocks: list[Block]) -> None:
        """Cache the whole chain (touching it), then evict LRU leaves until it fits."""
        for b in reversed(blocks):
            if b.key in self.nodes:
                self.nodes.move_to_end(b.key)
            else:
                self.nodes[b.key] = b.tokens
                self.used += b.tokens
        while self.used > self.capacity and self.nodes:
            _, tokens = self.nodes.popitem(last=False)
            self.used -= tokens
            self.evicted += tokens

    def request(self, blocks: list[Block]) -> int:
        """One prefill: the cached tokens it reuses; its prompt is cached afterwards."""
        hit = self.lookup(blocks)
        self.insert(blocks)
        return hit


@dataclass(frozen=True)
class Call:
    """One model call of a trace: prompt chain, reply block (the prompt's chain extended by the reply)."""

    start: float
    end: float
    prompt: tuple[Block, ...]
    reply: Block | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(b.tokens for b in self.prompt)


def chain(messages: Iterable[dict], tools: list | None, salt: str = "") -> list[Block]:
    """The blocks of a chat prompt: tools first (shared by every session), then each message, chained.

    Tokens are characters // 4 of each part's canonical JSON, as teacher-sim counts them. `salt` makes one
    tree's prompts distinct from another's after the tools block (replicas of a recorded tree in a fleet).
    """
    text = json.dumps(tools or [], sort_keys=True)
    h = hashlib.sha256(text.encode())
    blocks = [Block(h.digest(), len(text) // 4)]
    first = True
    for m in messages:
        s = json.dumps(m, sort_keys=True, ensure_ascii=False)
        h = hashlib.sha256(h.digest() + (salt.encode() if first else b"") + s.encode())
        first = False
        blocks.append(Block(h.digest(), len(s) // 4))
    return blocks


def extend(blocks: list[Block] | tuple[Block, ...], message: dict) -> Block:
    """The block a reply adds after `blocks` (the next turn resends it as its next message)."""
    s = json.dumps(message, sort_keys=True, ensure_ascii=False)
    return Block(hashlib.sha256(blocks[-1].key + s.encode()).digest(), len(s) // 4)


@dataclass
class Replay:
    prompt_tokens: int
    cached_tokens: int
    evicted_tokens: int
    peak_in_flight: int

    @property
    def share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def replay(calls: Iterable[Call], capacity: float) -> Replay:
    """Run the calls through one cache in time order: prefill at `start`, the reply cached at `end`.

    At equal times a reply is cached before a prefill starts (a session's next turn follows its reply).
    """
    events = []
    for i, c in enumerate(calls):
        events.append((c.start, 1, i, c))
        events.append((c.end, 0, i, c))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    cache = RadixLRU(capacity)
    prompt = cached = in_flight = peak = 0
    for _, kind, _, c in events:
        if kind == 1:
            prompt += c.prompt_tokens
            cached += cache.request(list(c.prompt))
            in_flight += 1
            peak = max(peak, in_flight)
        else:
            in_flight -= 1
            if c.reply is not None:
                cache.insert([*c.prompt, c.reply])
    return Replay(prompt, cached, cache.evicted, peak)
