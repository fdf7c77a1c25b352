"""Run with the trainer venv's python: `gguf_logprobs_probe.py MODEL.gguf`. Loads the GGUF with transformers
(`from_pretrained(folder, gguf_file=name)`: dequantised, float32, CPU), prints `{"ready": load seconds}` on a
line of its own, then reads one JSON object from stdin, `{"k": K, "shifts": [0, ...], "cases": [{"prompt": ids,
"completion": ids, "top_ids": [[K ids] per completion token]}]}`, runs one forward per case over prompt +
completion and prints, per case and shift s (0 or 1), what the model gives at row `i + s` for completion token i (row
i + 0 is the distribution the i-th completion token was sampled from): `lp`, the log-softmax of the completion
id; `at_top`, of the given top ids; `top_ids`/`top_lps`, the model's own top-K. Shift 1 is the misaligned
comparison a test shows failing. Load time is spent before stdin is read, so a caller can start this first."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

t0 = time.monotonic()
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.disable_progress_bar()
gguf = Path(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
model.eval()
print(json.dumps({"ready": round(time.monotonic() - t0, 2)}), flush=True)

job = json.loads(sys.stdin.read())
t1 = time.monotonic()
k, shifts = int(job["k"]), [int(s) for s in job["shifts"]]
assert set(shifts) <= {0, 1}, shifts  # the rows kept: the prompt's last position .. the sequence's last
out = []
for case in job["cases"]:
    prompt, comp, tops = case["prompt"], case["completion"], case["top_ids"]
    n = len(comp)
    # row r: the distribution after prompt + comp[:r], the one comp[r] was drawn from
    with torch.no_grad():
        logits = model(torch.tensor([prompt + comp]), logits_to_keep=n + 1).logits[0].float()
    lps = torch.log_softmax(logits, dim=-1)
    per_shift = {}
    for s in shifts:
        rows = lps[s : s + n]
        top_lps, top_ids = rows.topk(k, dim=-1)
        per_shift[str(s)] = {
            "lp": [rows[i, t].item() for i, t in enumerate(comp)],
            "at_top": [[rows[i, t].item() for t in ids] for i, ids in enumerate(tops)],
            "top_ids": top_ids.tolist(),
            "top_lps": top_lps.tolist(),
        }
    out.append(per_shift)
print(
    json.dumps(
        {"cases": out, "forward_s": round(time.monotonic() - t1, 2), "threads": torch.get_num_threads()}
    )
)
