"""The SGLang prefix-cache model (sftree.teacher.kvcache) against hand-computed reuse, eviction and replay numbers."""

from __future__ import annotations

import json

from sftree.teacher.kvcache import Block, Call, RadixLRU, chain, extend, replay

A, B, C, D, E = (Block(k.encode(), t) for k, t in (("A", 10), ("B", 5), ("C", 10), ("D", 5), ("E", 5)))


def test_longest_cached_prefix_is_reused():
    cache = RadixLRU(float("inf"))
    assert cache.request([A, B]) == 0
    assert cache.request([A, B, D]) == 15
    assert cache.request([A, E]) == 10  # a sibling shares only the parent
    assert cache.used == 10 + 5 + 5 + 5 and cache.evicted == 0


def test_lru_leaf_is_evicted_and_parents_outlive_children():
    cache = RadixLRU(20)
    cache.request([A, B])  # used 15
    assert cache.request([A, D]) == 10  # used 20
    assert cache.request([A, E]) == 10  # 25 > 20: B, the least recently used leaf, goes
    assert cache.evicted == 5 and cache.used == 20
    assert cache.request([A, B]) == 10  # B was evicted; D (now the oldest leaf) makes room for it again
    assert cache.evicted == 10 and list(cache.nodes) == [E.key, B.key, A.key]

    tight = RadixLRU(15)
    tight.request([A, B])
    tight.request([C])  # 25 > 15: B first, then A (a leaf once B is gone), never A before B
    assert list(tight.nodes) == [C.key] and tight.evicted == 15


def test_replay_caches_replies_and_counts_against_room():
    t, u1, r1, x = (Block(k.encode(), n) for k, n in (("T", 4), ("U1", 6), ("R1", 3), ("X", 5)))
    calls = [Call(0.0, 1.0, (t, u1), r1), Call(2.0, 3.0, (t, u1, r1, x), None)]
    big = replay(calls, float("inf"))
    assert (big.prompt_tokens, big.cached_tokens, big.peak_in_flight) == (10 + 18, 4 + 6 + 3, 1)
    assert abs(big.share - 13 / 28) < 1e-12
    small = replay(calls, 12)  # the reply (13 > 12) is evicted at once: the next turn reuses only its prompt
    # evicted: R1 (3) at the first reply; then the second prompt (18 > 12) loses X (5) and R1 (3) again
    assert (small.cached_tokens, small.evicted_tokens) == (10, 3 + 5 + 3)
    overlapping = replay([Call(0.0, 2.0, (t,), None), Call(1.0, 3.0, (t, u1), None)], float("inf"))
    assert overlapping.peak_in_flight == 2 and overlapping.cached_tokens == 4


def test_chain_counts_like_teacher_sim_and_salts_after_the_tools():
    tools = [{"type": "function", "function": {"name": "bash"}}]
    msgs = [{"role": "system", "content": "s" * 40}, {"role": "user", "content": "go"}]
    a, b = chain(msgs, tools, "tree-a"), chain(msgs, tools, "tree-b")
    assert [x.tokens for x in a] == [
        len(json.dumps(tools, sort_keys=True)) // 4,
        len(json.dumps(msgs[0], sort_keys=True)) // 4,
        len(json.dumps(msgs[1], sort_keys=True)) // 4,
    ]
    assert a[0] == b[0] and a[1].key != b[1].key  # the tools are shared by every tree's sessions
    reply = {"role": "assistant", "content": "ok"}
    assert extend(a, reply) == chain([*msgs, reply], tools, "tree-a")[-1]  # the next turn's prompt matches it


# ---- a fleet behind the router (RouterModel, replay_fleet) --------------------------------------------------
def _session(sys_text: str, n: int, tag: str) -> list[dict]:
    msgs = [{"role": "system", "content": sys_text}, {"role": "user", "content": f"task {tag}"}]
    for i in range(n):
        msgs += [{"role": "assistant", "content": "", "tool_calls": [{"id": f"{tag}{i}"}]},
                 {"role": "tool", "content": f"result {tag} {i} " * 20}]  # fmt: skip
    return msgs


def _calls(sessions: list[list[dict]], steps: int):
    """Each session's steps in turn (session s's step k starts at k*10 + s), each prompt = its first 2+2k messages."""
    from sftree.teacher.kvcache import FleetCall, routing_text

    out = []
    for k in range(steps):
        for s, msgs in enumerate(sessions):
            prompt = msgs[: 2 + 2 * k]
            blocks = chain(prompt, None)
            reply = extend(blocks, msgs[2 + 2 * k]) if 2 + 2 * k < len(msgs) else None
            out.append(
                FleetCall(k * 10.0 + s, k * 10.0 + s + 1, tuple(blocks), reply, tuple(routing_text(prompt)))
            )
    return out


def test_round_robin_takes_turns_and_scatters_sessions():
    from sftree.teacher.kvcache import replay_fleet

    calls = _calls([_session("S" * 800, 4, "a"), _session("S" * 800, 4, "b")], 4)
    rr = replay_fleet(calls, 2, float("inf"), "round_robin")
    assert rr.requests == [4, 4]
    ca = replay_fleet(calls, 2, float("inf"), "cache_aware")
    # cache_aware keeps each session on one worker (after its first request): more of each prompt is cached
    assert ca.share > rr.share
    one = replay(calls, float("inf"))  # one server holds everything: the upper bound
    assert abs(ca.share - one.share) < 0.2 and ca.share <= one.share


def test_cache_aware_sends_a_shared_prefix_to_its_worker_and_new_text_to_the_emptiest():
    from sftree.teacher.kvcache import RouterModel, routing_text

    r = RouterModel(2)
    a = tuple(routing_text([{"role": "system", "content": "S" * 100}, {"role": "user", "content": "a"}]))
    b = tuple(routing_text([{"role": "system", "content": "T" * 100}, {"role": "user", "content": "b"}]))
    assert r.route(a, [0, 0]) == 0  # nothing in the tree: the smallest (first) worker
    assert r.route(b, [1, 0]) == 1  # no match above 0.3: the worker with the least text
    a2 = tuple(routing_text([{"role": "system", "content": "S" * 100}, {"role": "user", "content": "x"}]))
    assert r.route(a2, [0, 5]) == 0  # the system prompt (100 of 103 characters) is worker 0's
    assert r.route(a2, [70, 0]) == 1  # imbalanced (70 - 0 > 64, 70 > 1.5 * 0): the least loaded
    # an assistant message's tool calls are not routing text; its content is
    asst = routing_text(
        [{"role": "assistant", "content": "", "tool_calls": [{}]}, {"role": "assistant", "content": "hi"}]
    )
    assert [n for _, n in asst] == [3]


def test_llama_slots_reuse_what_a_slot_holds_and_the_host_cache_only_when_a_slot_would_lose_half():
    from sftree.teacher.kvcache import SlotCache

    X, a, b, a2, b2 = (
        Block(k.encode(), t) for k, t in (("X", 20), ("a", 5), ("b", 5), ("a2", 5), ("b2", 30))
    )
    one = SlotCache(1)
    assert one.request([X, a]) == 0
    assert one.request([X, b]) == 20  # the shared prefix with what the slot holds
    # [X, a, a2] resembles the slot ([X, b]: 20 of 30 tokens) and keeps 20/25 of it: no host cache, only X
    assert one.request([X, a, a2]) == 20
    lru = SlotCache(1, similarity=0)  # --slot-prompt-similarity 0: by LRU, through the host cache every time
    lru.request([X, a])
    lru.request([X, b])
    assert lru.request([X, a, a2]) == 25  # [X, a] was saved and is moved back into the slot
    # a slot that would keep less than half of its chain is saved to the host cache first, and the saved chain
    # that serves the request best comes back; one that would keep half or more is simply overwritten
    long_a = Block(b"A30", 30)
    half = SlotCache(1)
    half.request([X, long_a])
    assert half.request([X, b]) == 20  # keeps 20 of 50: [X, A30] saved
    assert half.request([X, b, b2]) == 25  # the slot's own
    assert half.request([X, long_a, a2]) == 50  # keeps 20 of 55: [X, b, b2] saved, [X, A30] back
    assert half.request([X, b, b2, a]) == 55  # and back again
    two = SlotCache(2)
    two.request([A, B])
    two.request([C, D])  # nothing shared: a second slot
    assert two.request([A, B, E]) == 15 and two.request([C, D, E]) == 15
