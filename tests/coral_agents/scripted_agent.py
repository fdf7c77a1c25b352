"""The scripted agent `scripted_runtime.ScriptedRuntime` starts in a Coral worktree.

    python3 scripted_agent.py --plan PLAN.json --agent agent-1

PLAN.json maps each agent id to its steps, done in order; a restarted agent goes on where it stopped (the step
reached is kept in `.opencode/scripted_state.json`, which Coral's .gitignore keeps out of the commits). A step:

    {"message": "...",                      the `coral eval -m` message
     "set": {"INNER_RING": 0.28},           tunable constants of initial_program.py (made module-level), or
     "break": "syntax",                     a syntax error: the grader fails (crashed)
     "sleep": 6,                            the program sleeps that long (3600: it is never graded)
     "note": "text",                        written to .opencode/notes/<agent>-<k>.md (Coral's shared notes)
     "wait_graded": 7,                      first wait until that many attempts are graded (all agents)
     "no_wait": true,                       `coral eval --no-wait`
     "tune": true}                          `coral eval --tune` (a dev-split eval: budget class tune)

After the last step the agent idles (Coral restarts an agent that exits) until it is stopped.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

RING = "centers[i + 1] = [0.5 + 0.3 * np.cos(angle), 0.5 + 0.3 * np.sin(angle)]"
OUTER = "centers[i + 9] = [0.5 + 0.7 * np.cos(angle), 0.5 + 0.7 * np.sin(angle)]"
DEFAULTS = {"INNER_RING": 0.3, "OUTER_RING": 0.7}
MARK = "  # scripted\n"  # lines the agent added to break or slow the program, removed again by the next step


def program(text: str, values: dict) -> str:
    """initial_program.py with its two ring radii as module-level constants set to `values`."""
    text = "".join(line for line in text.splitlines(keepends=True) if not line.endswith(MARK))
    if "INNER_RING = " not in text:
        text = text.replace(RING, RING.replace("0.3 *", "INNER_RING *"))
        text = text.replace(OUTER, OUTER.replace("0.7 *", "OUTER_RING *"))
        consts = "".join(f"{k} = {v!r}\n" for k, v in DEFAULTS.items())
        text = text.replace("import numpy as np\n", "import numpy as np\n\n" + consts, 1)
    for k, v in values.items():
        text = re.sub(rf"^{k} = .*$", f"{k} = {v!r}", text, flags=re.M)
    return text


def graded() -> int:
    n = 0
    for p in Path(".opencode/attempts").glob("*.json"):
        try:
            n += json.loads(p.read_text()).get("status") != "pending"
        except (OSError, ValueError):
            pass
    return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--agent", required=True)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    steps = json.loads(Path(args.plan).read_text())[args.agent]
    state_file = Path(".opencode/scripted_state.json")
    done = json.loads(state_file.read_text())["done"] if state_file.exists() else 0
    src = Path("initial_program.py")
    while done < len(steps):
        step = steps[done]
        deadline = time.monotonic() + 300
        while graded() < step.get("wait_graded", 0):
            if time.monotonic() > deadline:
                print(f"gave up waiting for {step['wait_graded']} graded attempts", flush=True)
                return 3
            time.sleep(0.2)
        text = program(src.read_text(), step.get("set", {}))
        if step.get("break") == "syntax":
            text += "def half_finished(:" + MARK
        if step.get("sleep"):
            text = f"import time; time.sleep({step['sleep']})" + MARK + text
        src.unlink()  # the seed's files are read-only; the folder is not
        src.write_text(text)
        if step.get("note"):
            notes = Path(".opencode/notes")
            (notes / f"{args.agent}-{done + 1:02d}.md").write_text(step["note"] + "\n")
        cmd = ["coral", "eval", "-m", step["message"]] + (["--no-wait"] if step.get("no_wait") else [])
        cmd += ["--tune"] if step.get("tune") else []
        # The agents take turns: two submissions at once can leave the second's checkpoint with nothing to
        # commit, and Coral then records no shared_state_hash for it (real Coral behaviour, which the importer
        # reports as a problem); the tests count exactly one checkpoint per submission.
        with open(Path(args.plan).with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            proc = subprocess.run(cmd, capture_output=True, text=True)
        print(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}exit {proc.returncode}", flush=True)
        done += 1
        state_file.write_text(json.dumps({"done": done}))
    end = time.monotonic() + 900
    while time.monotonic() < end:
        time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
