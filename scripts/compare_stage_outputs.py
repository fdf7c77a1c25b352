"""Rerun the deterministic stages (select-paths, export-sft, merge-sft, report) on the same explored trees with the
sftree of a git revision and with the working tree's, and compare every file they write, byte for byte.

    python3 scripts/compare_stage_outputs.py REV [--configfile examples/demo.yaml]

The trees are those of a finished run in results/ (run the demo first). The stage commands are the workflow's
own, as `snakemake --dry-run --printshellcmds --forcerun select_paths` prints them; each side runs them in a copy
of results/ with its own `src/` first on PYTHONPATH. Exit 0 when every output is identical; else the differing
files are named. A refactor that must keep behaviour byte for byte is checked with it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("select-paths", "export-sft", "merge-sft", "report")


def stage_commands(configfile: str) -> list[str]:
    dry = subprocess.run(
        [str(REPO / ".venv/bin/snakemake"), "-n", "-p", "--cores", "1", "--configfile", configfile,
         "--forcerun", "select_paths"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    stages = "|".join(STAGES)
    cmds = re.findall(rf"^Shell command: (sftree (?:{stages}) .*)$", dry, re.M)
    if not cmds:
        sys.exit("no stage commands in the dry run: is there a finished run in results/?")
    return cmds


def run_side(name: str, src: Path, work: Path, cmds: list[str]) -> Path:
    """A copy of the repo's results/ in work/name (everything else linked), the commands run there."""
    side = work / name
    side.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in ("results", ".git", ".snakemake"):
            (side / entry.name).symlink_to(entry)
    shutil.copytree(REPO / "results", side / "results", symlinks=True)
    env = dict(os.environ, PYTHONPATH=str(src), PATH=f"{REPO / '.venv/bin'}{os.pathsep}{os.environ['PATH']}")
    for cmd in cmds:
        subprocess.run(cmd, shell=True, cwd=side, env=env, check=True)  # noqa: S602 - the workflow's own commands
    return side / "results"


def outputs(cmds: list[str]) -> list[str]:
    """The files the stage commands write (their --out, --dataset-info, --card, --llamafactory-out, and the
    figures and stats files merge-sft and export-sft write beside their output)."""
    out: list[str] = []
    for cmd in cmds:
        written = re.findall(r"--(?:out|dataset-info|card|llamafactory-out) (\S+)", cmd)
        sft = [o for o in written if o.endswith("sft.jsonl")]
        beside = (
            ["sft.stats.json", "sft.figures.json"]
            if cmd.startswith("sftree merge-sft")
            else ["sft.stats.json"]
        )
        out += written + [o.replace("sft.jsonl", name) for o in sft for name in beside]
    return sorted(set(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the git revision to compare the working tree with")
    ap.add_argument("--configfile", default="examples/demo.yaml")
    args = ap.parse_args()
    cmds = stage_commands(args.configfile)
    with tempfile.TemporaryDirectory(prefix="sftree-compare-") as tmp:
        work = Path(tmp)
        base_src = work / "rev"
        base_src.mkdir()
        archive = subprocess.run(["git", "archive", args.rev, "src", "workflow"], cwd=REPO, capture_output=True,
                                 check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(base_src)], input=archive, check=True)
        if (
            REPO / ".tools"
        ).is_dir():  # the Student's tokenizer, which the config names relative to the checkout
            (base_src / ".tools").symlink_to(REPO / ".tools")
        a = run_side("a", base_src / "src", work, cmds)
        b = run_side("b", REPO / "src", work, cmds)
        files = [o.removeprefix("results/") for o in outputs(cmds)]
        # A file that names the Student's tokenizer names it inside each side's checkout: the rev's paths are
        # read as the working tree's before the bytes are compared.
        root_a, root_b = str(base_src).encode(), str(REPO).encode()
        differ = [f for f in files if (a / f).read_bytes().replace(root_a, root_b) != (b / f).read_bytes()]
    for f in files:
        print(f"{'DIFFERS' if f in differ else 'same   '} results/{f}")
    print(f"{len(files) - len(differ)} of {len(files)} outputs identical ({args.rev} vs the working tree)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
