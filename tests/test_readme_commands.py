"""Every command in README.md is one a test runs as written.

The commands are read from the README itself (its ```bash blocks and the inline code that starts with a
program), so a README edit that adds or changes a command fails here until a test runs it:
- the demo command and the rerun-one-stage commands run in a copy of the checkout (slow test below);
- the test command is the one `.ci/run` runs (CI is where it runs as written: a test cannot run the whole
  suite inside itself); the fast tier's command is run as written, collecting only, by
  tests/test_conventions_fast_tier.py (which checks what it selects);
- the few that need what no test machine has (a GPU with SGLang, a production run) are listed in OUTSIDE;
  the fast test fails as soon as the README's commands and these lists drift apart.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.tiers import FAST_COMMAND

REPO = Path(__file__).resolve().parents[1]
DEMO = "bash scripts/setup.sh && .venv/bin/snakemake --cores 2 --configfile examples/demo.yaml"
TESTS = "bash scripts/setup.sh && .venv/bin/python -m pytest -q"
FAST = FAST_COMMAND  # collected as written by tests/test_conventions_fast_tier.py
RERUN_STAGE = [
    ".venv/bin/snakemake --cores 2 --configfile examples/demo.yaml --forcerun select_paths",
    ".venv/bin/snakemake results/tsp/sft.jsonl --cores 2 --configfile examples/demo.yaml",
]
OUTSIDE = {  # command -> why no test runs it
    "python -m sglang.launch_server --model-path <model> --port 30000 --tool-call-parser <parser>"
    " --enable-cache-report": "needs a GPU, SGLang and model weights",
    ".venv/bin/snakemake --cores 16": "the production run: the user's Student run and a live SGLang server",
    ".venv/bin/snakemake --profile profiles/slurm": "a real Slurm cluster (the localhost one: test_slurm_demo)",
}
PROGRAMS = ("bash ", ".venv/bin/", "snakemake", "python", "sftree")


def readme_commands(text: str) -> list[str]:
    """Lines of ```bash blocks and inline code spans that start with a program, in README order."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        commands += [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    # a program with arguments (a bare `sftree` in prose names the program, it is no command)
    commands += [c for c in re.findall(r"`([^`\n]+)`", prose) if c.startswith(PROGRAMS) and " " in c]
    return commands


def test_readme_commands_are_all_run_or_listed():
    commands = readme_commands((REPO / "README.md").read_text())
    assert sorted(set(commands)) == sorted({DEMO, TESTS, FAST, *RERUN_STAGE, *OUTSIDE}), commands


def test_readme_has_exactly_the_two_setup_commands_and_ci_runs_the_test_one():
    text = (REPO / "README.md").read_text()
    setup = text[
        text.index("## Set-up on a fresh machine") : text.index("\n## ", text.index("## Set-up") + 5)
    ]
    assert readme_commands(setup) == [DEMO, TESTS, FAST]
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    assert TESTS in ci, ".ci/run must run the README's test command as written"


def test_readme_rerun_commands_name_the_demo_config():
    for cmd in RERUN_STAGE:
        assert "--configfile examples/demo.yaml" in cmd and cmd in (REPO / "README.md").read_text()


def _copy_checkout(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked-not-ignored files), like a fresh clone plus edits."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, names):
        src, dst = REPO / name, dest / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def _sh(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{cmd}\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc


def _rules_run(proc: subprocess.CompletedProcess) -> set[str]:
    return set(re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", proc.stdout + proc.stderr))


@pytest.mark.slow
def test_readme_demo_and_rerun_commands_as_written(tmp_path):
    work = tmp_path / "checkout"
    _copy_checkout(work)
    if sys.prefix != sys.base_prefix:
        # Running from a venv set up by scripts/setup.sh: the copy uses it (setup.sh sees it up to date), so
        # this test does not spend a minute on pip. Without a venv, setup.sh makes a fresh one in the copy.
        os.symlink(sys.prefix, work / ".venv")
    if (REPO / ".tools").exists():  # OpenCode already installed: no npm download either
        os.symlink((REPO / ".tools").resolve(), work / ".tools")

    first = _sh(DEMO, work)
    out = first.stdout + first.stderr
    for step in ("apt", "venv", "student", "opencode"):
        assert re.search(rf"^setup: {step} done in [\d.]+ s$", out, re.M), out[-3000:]
    assert {"example_run", "select_roots", "explore", "export_sft", "report"} <= _rules_run(first)
    assert sorted(p.name for p in (work / "examples" / "all_snapshots").iterdir()) == [
        "circle_packing",
        "tsp",
    ]
    assert (work / "results" / "sft.jsonl").stat().st_size > 0
    # the console: one line per select_roots job, a progress line per explore edge
    assert len(re.findall(r"^Job \d+: select_roots (circle_packing|tsp): ", out, re.M)) == 2
    assert "metadata.json" not in "".join(re.findall(r"^checkpoint select_roots:\n(?:    .*\n)*", out, re.M))
    assert re.search(
        r"^explore tsp/eval-\S+: edges \d+/6 valid \(\d+ run\), good leaves \d+/4, best score ", out, re.M
    )
    assert re.search(r"good leaves \d+/4, best score \S+, finished: \w+$", out, re.M)

    again = _sh(DEMO, work)
    assert "Nothing to be done" in again.stdout + again.stderr and not _rules_run(again)

    forced = _sh(RERUN_STAGE[0], work)
    assert _rules_run(forced) == {"select_paths", "export_sft", "merge_sft", "report", "all"}
    (work / "results" / "tsp" / "sft.jsonl").unlink()
    target = _sh(RERUN_STAGE[1], work)
    assert _rules_run(target) == {"export_sft"} and (work / "results" / "tsp" / "sft.jsonl").is_file()
