"""The `sftree` command: one subcommand per workflow rule, plus `teacher-sim` and the in-workspace `coral`.

Each subcommand lives in its own module, which exposes `add_arguments(parser)` and `run(args) -> int`.
Modules are imported lazily so that `sftree --help` stays fast and one broken stage cannot break the others.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from sftree.display import shown
from sftree.errors import SftreeError

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "import-coral": (
        "sftree.roots.import_coral",
        "make the per-eval snapshot folders of a task from a standard Coral run folder",
    ),
    "grader-env": (
        "sftree.world.grader_env_cli",
        "preflight a task's grader: build or reuse a packaged grader's venv, check its entrypoint",
    ),
    "select-roots": (
        "sftree.roots.select_roots",
        "stage 1 (algorithm.md section 2): split a Student run into stages and pick root snapshots",
    ),
    "explore": (
        "sftree.search.explore",
        "stage 2 (algorithm.md section 1): grow the token-aware MCTS tree of Teacher sessions from one root",
    ),
    "select-paths": (
        "sftree.dataset.select_paths",
        "stage 3 (algorithm.md section 3): rank a tree's root-to-leaf paths by PathScore, keep the top k",
    ),
    "export-sft": ("sftree.dataset.export", "stage 4: write one task's selected paths as SFT JSONL"),
    "merge-sft": (
        "sftree.dataset.merge",
        "merge the tasks' SFT files: the dataset, its LLaMA-Factory copy and card",
    ),
    "report": ("sftree.report.html", "write the self-contained HTML report"),
    "teacher-sim": (
        "sftree.teacher.sim.server",
        "serve a deterministic OpenAI-compatible stand-in for SGLang",
    ),
    "coral": (
        "sftree.world.coral_command",
        "the coral command inside an agent workspace (eval, log, show, notes, skills)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sftree", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        # add_help=False: `sftree CMD --help` is answered by the module's own parser (see main).
        p = sub.add_parser(name, help=help_text, description=help_text, add_help=False)
        p.set_defaults(_module=module)
        # Arguments are added only for the chosen command (see main) to keep imports lazy.
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Find the subcommand first, then let its module define the real arguments.
    known, _ = parser.parse_known_args(argv)
    module = importlib.import_module(known._module)
    sub = argparse.ArgumentParser(prog=f"sftree {known.command}", description=COMMANDS[known.command][1])
    sub.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    module.add_arguments(sub)
    rest = argv[argv.index(known.command) + 1 :]
    args = sub.parse_args(rest)
    logging.basicConfig(
        level=logging.DEBUG if (args.verbose or known.verbose) else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return int(module.run(args) or 0)
    except SftreeError as exc:
        # names in the message may come from someone else's files: printed escaped (display.shown)
        print(f"sftree {known.command}: error: {shown(str(exc), lines=True)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
