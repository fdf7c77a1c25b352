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

A fleet (`replay_fleet`): N such servers behind sglang-router, whose choice of server `RouterModel` plays
(round_robin, or cache_aware: prefix affinity on the request text, least loaded when the load is imbalanced).
llama-server's prompt cache (its slots' KV and the host-memory cache of earlier prompts, `--cache-ram`, 8 GiB by
default) reuses the longest cached prefix of a prompt as SGLang's radix cache does, so the same model stands for
the test bed's workers (benchmarks/fleet.py checks it against them; docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypedDict, Unpack

from sftree.jsontypes import ForeignJSON, WireObject


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
    nodes: OrderedDict[bytes, int] = field(default_factory=OrderedDict)
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


def chain(messages: Iterable[ForeignJSON], tools: list[ForeignJSON] | None, salt: str = "") -> list[Block]:
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


def extend(blocks: list[Block] | tuple[Block, ...], message: ForeignJSON) -> Block:
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


# ---- a fleet: N servers behind sglang-router ---------------------------------------------------------------
ROUTER_POLICIES = ("cache_aware", "round_robin")


def routing_text(messages: Iterable[WireObject]) -> list[tuple[bytes, int]]:
    """What sglang-router's cache_aware policy matches on, as chained blocks: the text of each message it reads
    (system, user and tool contents; an assistant's content when not empty: its tool calls are not part of it),
    joined by spaces, one block per message (key = chained hash, size = characters)."""
    h = hashlib.sha256(b"router")
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if m.get("role") == "assistant":
            content = " ".join(x for x in (content or "", m.get("reasoning_content") or "") if x).strip()
        if not content:
            continue
        h = hashlib.sha256(h.digest() + str(content).encode())
        out.append((h.digest(), len(content) + 1))
    return out


@dataclass(frozen=True)
class FleetCall(Call):
    """A call with the router's view of it (routing_text of its messages)."""

    text: tuple[tuple[bytes, int], ...] = ()


@dataclass
class RouterModel:
    """sglang-router's choice of worker (sgl-router `policies/cache_aware.rs`, `round_robin.rs`).

    round_robin: the next worker in turn, per request. cache_aware: when the load (requests in flight per
    worker) is imbalanced, i.e. max - min > balance_abs and max > balance_rel * min, the least loaded worker;
    else the worker holding the longest prefix of the request's text in the router's own approximate tree (one
    tree of every request text it routed, each text tagged with the worker it went to; the most recent one on a
    tie) when that prefix is more than cache_threshold of the text, else the worker with the least text in the
    tree. Every routed text is inserted under its worker. The router's tree is never evicted here (its
    max_tree_size is 2^26 nodes by default). Matching is per message, where the router matches characters."""

    servers: int
    policy: str = "cache_aware"
    cache_threshold: float = 0.3
    balance_abs: int = 64
    balance_rel: float = 1.5
    _next: int = 0
    _owner: dict[bytes, int] = field(default_factory=dict)  # text block key -> worker that routed it last
    _size: list[int] = field(default_factory=list)  # characters of text in the tree per worker
    _has: list[set[bytes]] = field(default_factory=list)  # the text blocks in the tree per worker

    def __post_init__(self) -> None:
        if self.policy not in ROUTER_POLICIES:
            raise ValueError(f"policy must be one of {ROUTER_POLICIES}, not {self.policy!r}")
        self._size = [0] * self.servers
        self._has = [set() for _ in range(self.servers)]

    def route(self, text: tuple[tuple[bytes, int], ...], loads: list[int]) -> int:
        if self.policy == "round_robin":
            i, self._next = self._next, (self._next + 1) % self.servers
            return i
        hi, lo = max(loads), min(loads)
        if hi - lo > self.balance_abs and hi > lo * self.balance_rel:
            w = loads.index(lo)
        else:
            total = sum(n for _, n in text)
            matched, owner = 0, None
            for key, n in text:
                if key not in self._owner:
                    break
                matched += n
                owner = self._owner[key]
            if total and owner is not None and matched / total > self.cache_threshold:
                w = owner
            else:
                w = self._size.index(min(self._size))
        for key, n in text:
            if key not in self._has[w]:
                self._has[w].add(key)
                self._size[w] += n
            self._owner[key] = w
        return w


class RouterKnobs(TypedDict, total=False):
    """RouterModel's cache_aware settings, as `replay_fleet` passes them on."""

    cache_threshold: float
    balance_abs: int
    balance_rel: float


@dataclass
class SlotCache:
    """llama-server's prompt reuse with `--parallel S` slots (b11434, `server_context::get_available_slot` and
    `server_prompt_cache::load`), at message granularity. Each slot holds the chain of the last prompt it ran. A
    request takes the idle slot whose chain shares the largest fraction of the request (above
    `similarity`, `--slot-prompt-similarity` 0.1; 0 = never by similarity), else the least recently used slot.
    When it came by LRU, or its shared prefix keeps less than half of the slot's chain, the slot's chain is saved
    to the host-memory prompt cache (`--cache-ram`; a saved chain that the new one contains is dropped) and the
    saved chain that keeps at least a quarter of itself and beats the slot on both the fraction kept and the
    fraction of the request shared is moved into the slot. The request reuses the prefix it shares with what
    the slot then holds. (The host cache is taken as large enough: 8 GiB by default.)"""

    slots: int = 1
    similarity: float = 0.1
    contents: list[list[Block]] = field(default_factory=list)  # per slot: its chain
    last_used: list[int] = field(default_factory=list)
    saved: list[list[Block]] = field(default_factory=list)  # the host cache: chains
    used: int = 0
    evicted: int = 0
    _tick: int = 0

    @staticmethod
    def _lcp(chain: list[Block], blocks: list[Block]) -> int:
        hit = 0
        for a, b in zip(chain, blocks, strict=False):
            if a.key != b.key:
                break
            hit += b.tokens
        return hit

    def request(self, blocks: list[Block]) -> int:
        n = sum(b.tokens for b in blocks) or 1
        best, f_sim_best = None, 0.0
        if self.similarity > 0:
            for i, chain in enumerate(self.contents):
                f = self._lcp(chain, blocks) / n
                if chain and f > f_sim_best and f > self.similarity:
                    best, f_sim_best = i, f
        update = best is None
        if best is None:
            if len(self.contents) < self.slots:
                self.contents.append([])
                self.last_used.append(0)
                best = len(self.contents) - 1
            else:
                best = min(range(len(self.contents)), key=lambda i: self.last_used[i])
        else:
            size = sum(b.tokens for b in self.contents[best]) or 1
            update = self._lcp(self.contents[best], blocks) / size < 0.5
        if update:
            self._swap(best, blocks, n)
        hit = self._lcp(self.contents[best], blocks)
        self.contents[best] = list(blocks)
        self._tick += 1
        self.last_used[best] = self._tick
        return hit

    def _swap(self, slot: int, blocks: list[Block], n: int) -> None:
        cur = self.contents[slot]
        if cur:
            keys = [b.key for b in cur]
            self.saved = [c for c in self.saved if [b.key for b in c] != keys[: len(c)]]  # contained: dropped
            self.saved.append(list(cur))
        lcp = self._lcp(cur, blocks)
        size = sum(b.tokens for b in cur)
        f_keep_best = lcp / size if size else -1.0
        f_sim_best = lcp / n
        pick = None
        for j, chain in enumerate(self.saved):
            lcp_j = self._lcp(chain, blocks)
            f_keep = lcp_j / (sum(b.tokens for b in chain) or 1)
            if f_keep < 0.25:
                continue
            if f_keep_best < f_keep and f_sim_best < lcp_j / n:
                pick, f_keep_best, f_sim_best = j, f_keep, lcp_j / n
        if pick is not None:
            self.contents[slot] = self.saved.pop(pick)

    def insert(self, blocks: list[Block]) -> None:
        """The reply joins the slot that still holds its prompt."""
        for i, chain in enumerate(self.contents):
            if [b.key for b in chain] == [b.key for b in blocks[:-1]]:
                self.contents[i] = list(blocks)
                return


@dataclass
class FleetReplay:
    per_server: list[Replay]
    requests: list[int]  # calls routed to each server

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.per_server)

    @property
    def cached_tokens(self) -> int:
        return sum(r.cached_tokens for r in self.per_server)

    @property
    def share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def replay_fleet(calls: Iterable[FleetCall], servers: int, capacity: float, policy: str = "cache_aware", *,
                 cache: str = "radix", slots: int = 1, similarity: float = 0.1, replies: bool = True,
                 **router: Unpack[RouterKnobs]) -> FleetReplay:  # fmt: skip
    """Run the calls, in time order, through `servers` caches behind RouterModel: each call is routed at its
    start (the router's load = calls in flight per server), prefilled there, and its reply cached there at its
    end. `cache="radix"`: SGLang's radix LRU of `capacity` tokens (as `replay`); `cache="slots"`: llama-server's
    `slots` slots and host prompt cache (SlotCache, `similarity` its --slot-prompt-similarity). `replies=False`: a reply is never reused (a server whose chat template renders the
    reply in the next prompt other than the tokens it generated, e.g. a tool call it wrote as JSON content)."""
    events = []
    for i, c in enumerate(calls):
        events.append((c.start, 1, i, c))
        events.append((c.end, 0, i, c))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    model = RouterModel(servers, policy, **router)
    caches = [
        RadixLRU(capacity) if cache == "radix" else SlotCache(slots, similarity) for _ in range(servers)
    ]
    stats = [[0, 0, 0, 0] for _ in range(servers)]  # prompt, cached, in flight, peak
    requests = [0] * servers
    where: dict[int, int] = {}
    for _, kind, i, c in events:
        if kind == 1:
            w = model.route(c.text, [s[2] for s in stats])
            where[i] = w
            requests[w] += 1
            st = stats[w]
            st[0] += c.prompt_tokens
            st[1] += caches[w].request(list(c.prompt))
            st[2] += 1
            st[3] = max(st[3], st[2])
        else:
            w = where[i]
            stats[w][2] -= 1
            if c.reply is not None and replies:
                caches[w].insert([*c.prompt, c.reply])
    per = [Replay(s[0], s[1], caches[k].evicted, s[3]) for k, s in enumerate(stats)]
    return FleetReplay(per, requests)
