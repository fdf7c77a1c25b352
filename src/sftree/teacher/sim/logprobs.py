"""teacher-sim's sampled tokens and log-probabilities (`logprobs: true, top_logprobs: K` in a request).

A toy model, deterministic from the seed and the reply: the reply's message as JSON text is cut into exactly as
many tokens as the usage reports (`completion_tokens`), each with an id in a toy vocabulary of `VOCAB` ids (a
hash of its text) and a distribution over K alternatives: the top-1 holds 0.5 to 0.95 of the mass, each next one
half of what is left. The sampled token is the top-1, except at about one position in five, where it is the
second (sampling at a temperature does that). Entries are llama-server's form (`id, token, bytes, logprob,
top_logprobs: [{id, token, bytes, logprob}]`); `with_ids=False` leaves the ids out (SGLang's and OpenAI's chat
API form).
"""

from __future__ import annotations

import hashlib
import json
import math

from sftree.jsontypes import WireObject

VOCAB = 49152  # SmolLM2's vocabulary size: any number does, a familiar one reads better in a record
MAX_TOP_LOGPROBS = 20  # as OpenAI and SGLang: more is refused with HTTP 400


def _digest(seed: int, *parts: object) -> bytes:
    return hashlib.sha256("\x1f".join(map(str, (seed, *parts))).encode("utf-8", "surrogatepass")).digest()


def _entry(tid: int, text: str, logprob: float, with_ids: bool) -> WireObject:
    out: WireObject = {"token": text, "bytes": list(text.encode("utf-8", "surrogatepass")),
                       "logprob": logprob}  # fmt: skip
    return {"id": tid, **out} if with_ids else out


def toy_logprobs(
    message: WireObject, n_tokens: int, k: int, seed: int, *, with_ids: bool = True
) -> list[WireObject]:
    """`choices[0].logprobs.content` of a reply: `n_tokens` entries with their top-`k` (module docstring)."""
    text = json.dumps(message, ensure_ascii=False, sort_keys=True)
    n = max(1, n_tokens)
    cuts = [len(text) * i // n for i in range(n + 1)]
    out: list[WireObject] = []
    for i in range(n):
        piece = text[cuts[i] : cuts[i + 1]]
        h = _digest(seed, i, piece)
        sampled = int.from_bytes(h[:4], "big") % VOCAB
        top1 = 0.5 + 0.45 * h[4] / 255
        probs = [top1] + [(1 - top1) * 0.5**j for j in range(1, max(k, 2))]
        rank = 1 if h[5] % 5 == 0 else 0  # where the sampled token stands among the alternatives
        alts: list[tuple[int, str]] = []
        for j in range(max(k, 2)):
            if j == rank:
                alts.append((sampled, piece))
                continue
            other = (sampled + 1 + int.from_bytes(_digest(seed, i, j)[:4], "big")) % VOCAB
            alts.append((other if other != sampled else (other + 1) % VOCAB, f"<t{other}>"))
        entry = _entry(sampled, piece, round(math.log(probs[rank]), 6), with_ids)
        entry["top_logprobs"] = [
            _entry(tid, tok, round(math.log(p), 6), with_ids)
            for (tid, tok), p in zip(alts[:k], probs[:k], strict=True)
        ]
        out.append(entry)
    return out


def top_k(body: WireObject) -> int | str | None:
    """The top-K a request asks for: None when it asks for no logprobs, an error text when K is not one."""
    if not body.get("logprobs"):
        return None
    k = body.get("top_logprobs", 0)
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_LOGPROBS:
        return f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, not {str(k)[:20]}"
    return k
