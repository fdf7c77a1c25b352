"""The Teacher's stored logprobs against the same GGUF run by transformers (tests/test_real_teacher_logprobs_match.py,
docs/real_teacher.md "Stored logprobs against the model").

- `Reply`: one answer of a real llama-server through `TeacherClient` (its `logprobs`, what the step record and
  the export keep) with the exact prompt token ids the server ran: the request body as the client sent it (the
  same bytes, `serialize`: the tool schemas' key order is part of the prompt) through the server's own
  `/apply-template` (the chat completion's own `oaicompat_chat_params_parse`) and `/tokenize` with
  `add_special` and `parse_special` (the flags its chat completion tokenizes with, b11434 server-context.cpp);
  `Reply.check_prompt` holds the count against the server's `usage.prompt_tokens`.
- `Probe`: tests/trainer/gguf_logprobs_probe.py in the trainer venv, started first (loading the GGUF with
  transformers takes ~15-30 s, done while the server answers), then given every reply at once.
- `Agreement`: the comparison at each completion position, per reply and over all (`combine`).

Run as a script (`.venv/bin/python tests/helpers/real_logprobs.py --rounds 3`) it measures more replies than the
test sends and prints the table docs/real_teacher.md keeps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from sftree.agents.nativetools import TOOL_SCHEMAS
from sftree.records.steplog import TokenLogprobs
from sftree.teacher.client import Completion, TeacherClient, serialize

REPO = Path(__file__).parents[2]
PROBE = REPO / "tests" / "trainer" / "gguf_logprobs_probe.py"
K = 5
SYSTEM = {"role": "system", "content": "You are a coding agent. Work only through the tools you are given."}
TASK = {"role": "user", "content": 'Read solution.py, then improve the score and run `coral eval -m "..."`.'}
HEADERS = {"X-Sftree-Edge": "e1", "X-Sftree-Turn": "1"}
BASE = {"stream": False, "max_tokens": 64, "health_timeout": 60, "request_timeout": 300, "logprobs": K}
CONSTRAINED = {"tool_choice": "required", "constrain": "tool_call_required"}
# (name, client settings, with the tool schemas): four plain-text chats (49 prompt tokens; cheap, so the top-1 share
# is over some 360 tokens), then the ~1000-token prompt with the tools, constrained to a call (as examples/real.yaml
# asks) and free
REQUESTS: list[tuple[str, dict, bool]] = [
    ("text T0.7", {"temperature": 0.7, "seed": 1}, False),
    ("text T1.0", {"temperature": 1.0, "seed": 2}, False),
    ("text T0.7", {"temperature": 0.7, "seed": 3}, False),
    ("text T1.0", {"temperature": 1.0, "seed": 6}, False),
    ("tools, constrained call T0.7", {"temperature": 0.7, "seed": 4, **CONSTRAINED}, True),
    ("tools, free T0.9", {"temperature": 0.9, "seed": 5}, True),
]


@dataclass
class Reply:
    name: str
    body: dict  # the request as sent
    prompt: str  # its prompt as the server renders it (`/apply-template`)
    prompt_ids: list[int]
    comp: Completion

    @property
    def lp(self) -> TokenLogprobs:
        assert self.comp.logprobs is not None, self.comp.logprobs_dropped
        return self.comp.logprobs

    def check_prompt(self) -> None:
        """The prompt ids are the server's: as many as its own `usage.prompt_tokens`."""
        assert len(self.prompt_ids) == self.comp.usage.prompt_tokens, (self.name, len(self.prompt_ids))


def prompt_of(root: str, body: dict) -> tuple[str, list[int]]:
    """The prompt llama-server at `root` runs for this request body, and its token ids (module docstring)."""
    r = requests.post(f"{root}/apply-template", data=serialize(body), timeout=60,
                      headers={"Content-Type": "application/json"})  # fmt: skip
    r.raise_for_status()
    prompt: str = r.json()["prompt"]
    t = requests.post(f"{root}/tokenize", timeout=60,
                      json={"content": prompt, "add_special": True, "parse_special": True})  # fmt: skip
    t.raise_for_status()
    return prompt, t.json()["tokens"]


def ask(base_url: str, requests_: list[tuple[str, dict, bool]] = REQUESTS) -> list[Reply]:
    """Each request once, non-streamed (llama-server gives no logprobs for a streamed request with tools)."""
    root = base_url.removesuffix("/v1")
    out = []
    for name, cfg, with_tools in requests_:
        client = TeacherClient.from_config({"base_url": base_url, **BASE, **cfg})
        tools = TOOL_SCHEMAS if with_tools else None
        comp = client.chat([SYSTEM, TASK], tools, headers=HEADERS)
        body = dict(client.request_body([SYSTEM, TASK], tools, HEADERS))
        out.append(Reply(f"{name}, seed {cfg.get('seed')}", body, *prompt_of(root, body), comp))
    return out


class Probe:
    """tests/trainer/gguf_logprobs_probe.py running in the trainer venv: started at once, asked once."""

    def __init__(self, python: Path, gguf: Path, env: dict[str, str]):
        self.proc = subprocess.Popen([str(python), str(PROBE), str(gguf)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip

    def run(self, replies: list[Reply], shifts: tuple[int, ...] = (0, 1), timeout: float = 300) -> dict:
        job = {"k": K, "shifts": list(shifts), "cases": [
            {"prompt": r.prompt_ids, "completion": r.lp["ids"], "top_ids": r.lp["top_ids"]} for r in replies]}  # fmt: skip
        out, err = self.proc.communicate(json.dumps(job), timeout=timeout)
        assert self.proc.returncode == 0, err[-3000:]
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        got: dict = lines[-1]
        got["load_s"] = lines[0]["ready"]
        return got

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


SURE = -0.1  # a stored logprob >= this (p >= 0.9): a token the model is sure of


@dataclass
class Agreement:
    """Stored (server) against model (transformers) at each completion position; `d` = |difference| in nats."""

    tokens: int
    d_sampled_max: float  # the sampled token's logprob
    d_sampled_sum: float
    d_sure_max: float  # the same, over the tokens stored with a logprob >= SURE only (0 when none)
    sure: int  # how many those are
    d_top_max: float  # each of the stored top-K's logprobs, against the model's at the same id
    d_top_sum: float
    top1_same: int  # the stored top-1 id is the model's
    overlap_sum: float  # |stored top-K ids & model's top-K ids| / K

    @property
    def d_sampled_mean(self) -> float:
        return self.d_sampled_sum / self.tokens

    @property
    def d_top_mean(self) -> float:
        return self.d_top_sum / (self.tokens * K)

    @property
    def top1(self) -> float:
        return self.top1_same / self.tokens

    @property
    def overlap(self) -> float:
        return self.overlap_sum / self.tokens

    def row(self, name: str) -> str:
        return (f"| {name} | {self.tokens} | {self.d_sampled_max:.3f} | {self.d_sampled_mean:.4f} | "
                f"{self.d_sure_max:.3f} ({self.sure}) | {self.d_top_max:.3f} | {self.d_top_mean:.4f} | "
                f"{self.top1_same}/{self.tokens} ({100 * self.top1:.1f}%) | {self.overlap:.3f} |")  # fmt: skip


HEADER = ("| reply | tokens | max \\|d\\| sampled | mean \\|d\\| sampled | max \\|d\\| sampled, p >= 0.9 (tokens) | "
          "max \\|d\\| top-5 | mean \\|d\\| top-5 | same top-1 | top-5 overlap |\n"
          "|---|---|---|---|---|---|---|---|---|")  # fmt: skip


def compare(lp: TokenLogprobs, model: dict) -> Agreement:
    """One reply's stored logprobs against the probe's answer for it at one shift."""
    d = [abs(a - b) for a, b in zip(lp["logprobs"], model["lp"], strict=True)]
    sure = [x for x, a in zip(d, lp["logprobs"], strict=True) if a >= SURE]
    dt = [abs(a - b) for s, m in zip(lp["top_logprobs"], model["at_top"], strict=True)
          for a, b in zip(s, m, strict=True)]  # fmt: skip
    same = sum(s[0] == m[0] for s, m in zip(lp["top_ids"], model["top_ids"], strict=True))
    overlap = sum(len(set(s) & set(m)) / K for s, m in zip(lp["top_ids"], model["top_ids"], strict=True))
    return Agreement(
        len(d), max(d), sum(d), max(sure, default=0.0), len(sure), max(dt), sum(dt), same, overlap
    )


def combine(parts: list[Agreement]) -> Agreement:
    return Agreement(sum(p.tokens for p in parts), max(p.d_sampled_max for p in parts),
                     sum(p.d_sampled_sum for p in parts), max(p.d_sure_max for p in parts),
                     sum(p.sure for p in parts), max(p.d_top_max for p in parts),
                     sum(p.d_top_sum for p in parts), sum(p.top1_same for p in parts),
                     sum(p.overlap_sum for p in parts))  # fmt: skip


def table(replies: list[Reply], model: list[dict]) -> tuple[str, list[Agreement], Agreement, Agreement]:
    """(the markdown table, each reply's agreement, all replies', all replies' shifted one position)."""
    parts = [compare(r.lp, g["0"]) for r, g in zip(replies, model, strict=True)]
    whole = combine(parts)
    shifted = combine([compare(r.lp, g["1"]) for r, g in zip(replies, model, strict=True)])
    rows = [
        p.row(f"{r.name} ({r.comp.usage.prompt_tokens} prompt)") for r, p in zip(replies, parts, strict=True)
    ]
    text = "\n".join(
        [HEADER, *rows, whole.row("**all**"), shifted.row("all, shifted one position (misaligned)")]
    )
    return text, parts, whole, shifted


def main() -> None:
    """Measure: `--rounds` times the test's requests with other seeds (round r: seed + 10 r), one table."""
    sys.path.insert(0, str(REPO / "tests"))
    from test_export_trainer import trainer_python  # the test's own way to the trainer venv
    from test_tree_trainer import probe_env

    from sftree.teacher.llm_server import LaunchSpec, start_llm_server

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tmp", default="/tmp/sftree-real-logprobs")
    ap.add_argument("--dump", help="write the replies and the model's answer here (JSON)")
    args = ap.parse_args()
    tmp = Path(args.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    spec = LaunchSpec.from_config({"log_file": str(tmp / "server.log")})
    t0 = time.monotonic()
    probe = Probe(trainer_python(), spec.model, probe_env(tmp))
    url, stop = start_llm_server(spec)
    try:
        reqs = [(n, {**c, "seed": c["seed"] + 10 * r}, t)
                for r in range(args.rounds) for n, c, t in REQUESTS]  # fmt: skip
        replies = ask(url, reqs)
    finally:
        stop()
    for r in replies:
        r.check_prompt()
    got = probe.run(replies)
    if args.dump:
        kept = [{"name": r.name, "prompt": r.prompt_ids, "logprobs": r.lp} for r in replies]
        Path(args.dump).write_text(json.dumps({"replies": kept, "model": got}))
    print(table(replies, got["cases"])[0])
    print(f"\nprobe load {got['load_s']} s, forward {got['forward_s']} s ({got['threads']} threads); "
          f"wall {time.monotonic() - t0:.1f} s; machine load {os.getloadavg()[0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
