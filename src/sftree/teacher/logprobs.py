"""The Teacher's sampled tokens and their log-probabilities (`teacher.logprobs: K`), read from a reply.

A request under `teacher.logprobs: K` (K > 0) asks for `logprobs: true, top_logprobs: K`
(`request_fields`). A server answers per sampled token, in `choices[0].logprobs.content` (streamed: one piece per
chunk, joined by `teacher/stream.py`), `{id?, token, bytes?, logprob, top_logprobs: [{id?, token, logprob}]}`:
llama-server gives the token `id`, SGLang's and OpenAI's chat API only the text.

`read_logprobs` keeps them compactly as a `TokenLogprobs` (records/steplog.py): the ids, the logprobs (rounded to
`DECIMALS` places), the top-K ids and logprobs; the token text only where the server gave no id (then for every
token of the reply, so the lists stay aligned). What it does not keep, and why, is the reason it returns (the
step record's `logprobs_dropped`, apart from the normalisation `notes`: the reply itself is as good as any):
never a half or guessed list.

- no `logprobs` in the reply: None and no reason when none were asked for; `absent` when they were (a server
  that ignores the fields): recorded as absent, never invented.
- not aligned with the reply: more tokens than the request's `max_tokens`, a token count that is not the
  server's own `usage.completion_tokens` (or one less: some servers count the end-of-turn token without
  listing it), more than K alternatives: `misaligned:<reason>`.
- malformed (an entry that is not an object, a logprob that is not a finite number <= 0, neither id nor token, a
  token text over `MAX_TOKEN_CHARS`): `malformed:<reason>`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from sftree.records.steplog import TokenLogprobs

DECIMALS = 5  # |rounding error| <= 5e-6 nat: far under any tolerance a comparison with the model needs
MAX_TOKEN_CHARS = 256  # one token's text; a longer "token" is not one (bounds the record)
MAX_TOP_K = 20  # OpenAI's and SGLang's bound on top_logprobs (the schema's bound on teacher.logprobs)


class Unusable(ValueError):
    """The reply's logprobs cannot be kept; the message is the note's reason."""


def request_fields(k: int) -> dict[str, object]:
    """The request's fields asking for the sampled tokens' logprobs and the top-`k` (none for k = 0)."""
    return {"logprobs": True, "top_logprobs": k} if k > 0 else {}


def wire_content(choice: Mapping[str, object]) -> object:
    """`choices[0].logprobs.content` as sent, or None when the reply has none."""
    lp = choice.get("logprobs")
    return lp.get("content") if isinstance(lp, dict) else None


def _logprob(v: object, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v > 1e-6:
        raise Unusable(f"{where}.logprob is not a finite number <= 0: {str(v)[:40]!r}")
    return round(min(float(v), 0.0), DECIMALS)


def _token(entry: object, where: str) -> tuple[int | None, str | None, float]:
    if not isinstance(entry, dict):
        raise Unusable(f"{where} is not an object")
    tid, text = entry.get("id"), entry.get("token")
    if isinstance(tid, bool) or not (tid is None or (isinstance(tid, int) and tid >= 0)):
        raise Unusable(f"{where}.id is not a token id: {str(tid)[:40]!r}")
    if text is not None and not isinstance(text, str):
        raise Unusable(f"{where}.token is not a string")
    if tid is None and text is None:
        raise Unusable(f"{where} has neither id nor token")
    if text is not None and len(text) > MAX_TOKEN_CHARS:
        raise Unusable(f"{where}.token is longer than {MAX_TOKEN_CHARS} characters")
    return tid, text, _logprob(entry.get("logprob"), where)


def parse(content: object, k: int, *, max_tokens: int, completion_tokens: int | None) -> TokenLogprobs:
    """The compact record of `choices[0].logprobs.content`; Unusable (with the note) when it cannot be kept."""
    if not isinstance(content, list):
        raise Unusable(f"malformed:content is a {type(content).__name__}, not a list")
    if len(content) > max_tokens:
        raise Unusable(f"misaligned:{len(content)} tokens for max_tokens {max_tokens}")
    if completion_tokens is not None and len(content) not in (completion_tokens, completion_tokens - 1):
        raise Unusable(f"misaligned:{len(content)} tokens for usage.completion_tokens {completion_tokens}")
    ids: list[int | None] = []
    texts: list[str | None] = []
    lps: list[float] = []
    top: list[list[tuple[int | None, str | None, float]]] = []
    try:
        for i, entry in enumerate(content):
            tid, text, lp = _token(entry, f"content[{i}]")
            alts = entry.get("top_logprobs") if isinstance(entry, dict) else None
            if alts is None:
                alts = []
            if not isinstance(alts, list):
                raise Unusable(f"content[{i}].top_logprobs is not a list")
            if len(alts) > k:
                raise Unusable(f"misaligned:content[{i}] has {len(alts)} alternatives for top_logprobs {k}")
            ids.append(tid)
            texts.append(text)
            lps.append(lp)
            top.append([_token(a, f"content[{i}].top_logprobs[{j}]") for j, a in enumerate(alts)])
    except Unusable as exc:
        msg = str(exc)
        raise Unusable(msg if msg.startswith("misaligned:") else f"malformed:{msg}") from None
    by_id = all(t is not None for t in ids) and all(a[0] is not None for alts in top for a in alts)
    out: TokenLogprobs = {"k": k, "logprobs": lps, "top_logprobs": [[a[2] for a in alts] for alts in top]}
    if by_id:
        out["ids"] = [t for t in ids if t is not None]
        out["top_ids"] = [[a[0] for a in alts if a[0] is not None] for alts in top]
    else:  # text only where the server gives no id: for every token then, so the lists stay aligned
        out["tokens"] = [t or "" for t in texts]
        out["top_tokens"] = [[a[1] or "" for a in alts] for alts in top]
    return out


def read_logprobs(
    choice: Mapping[str, object], k: int, *, max_tokens: int, completion_tokens: int | None
) -> tuple[TokenLogprobs | None, str | None]:
    """(the kept record, None) or (None, the reason none is kept); (None, None) when none were asked
    for. `completion_tokens` is the server's own count (None when it reported none)."""
    if k <= 0:
        return None, None
    content = wire_content(choice)
    if content is None:
        return None, "absent"
    try:
        return parse(content, k, max_tokens=max_tokens, completion_tokens=completion_tokens), None
    except Unusable as exc:
        return None, str(exc)[:200]
