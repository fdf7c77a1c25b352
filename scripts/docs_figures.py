#!/usr/bin/env python3
"""The figures docs/outputs.md quotes, regenerated from a run (its `sft.stats.json` and `sft.figures.json`).

    .venv/bin/python scripts/docs_figures.py --results results [--write]

Prints the Markdown block of the run's figures: records and tokens under the Student and the tokenizer they were
counted with, control-token text found, duplicate trained messages. `--write` copies the two files into
docs/figures/demo/ and replaces the block between `<!-- figures:demo -->` and `<!-- /figures:demo -->` in
docs/outputs.md, so the docs quote only what a run wrote (tests/test_docs_figures.py checks that they agree).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]
DOCS = REPO / "docs" / "outputs.md"
SOURCE = REPO / "docs" / "figures" / "demo"
BEGIN, END = "<!-- figures:demo -->", "<!-- /figures:demo -->"


def block(stats: dict, figures: dict) -> str:
    """The Markdown the docs quote, from a merged run's stats and figures."""
    st = stats.get("student") or {}
    tok = st.get("tokenizer") or {}
    sp = stats.get("special_text") or {}
    merge = stats.get("merge") or {}
    ratio = f"{st['tokens_processed'] / st['tokens_trained']:.1f}" if st.get("tokens_trained") else "-"
    lines = [
        "| figure | value |",
        "|---|---:|",
        f"| records ({stats.get('granularity')}) | {figures.get('records')} |",
        f"| tokens processed under the Student | {st.get('tokens_processed', '-')} |",
        f"| tokens trained | {st.get('tokens_trained', '-')} |",
        f"| processed per trained token | {ratio} |",
        f"| longest record (tokens) | {st.get('longest', '-')} |",
        f"| records dropped by the Student (`too_long`) | {(st.get('dropped') or {}).get('too_long', 0)} |",
        f"| records with control-token text ({sp.get('mode', '-')}) | {sp.get('records', '-')} |",
        f"| duplicate trained messages | {merge.get('duplicates', '-')} |",
        "",
        f"Tokenizer: `{Path(str(tok.get('file'))).name}` ({tok.get('kind')}, sha256 `{tok.get('sha256')}`); chat "
        f"template `{Path(str(st.get('template'))).name}`; `max_length` {st.get('max_length')}.",
    ]
    return "\n".join(lines)


def _local_names(path: Path) -> None:
    """The Student's files by name only: the kept copy names no host path."""
    doc = json.loads(path.read_text())
    st = doc.get("student") or {}
    for d, key in ((st, "source"), (st, "template"), (st.get("tokenizer") or {}, "file")):
        if d.get(key):
            d[key] = Path(str(d[key])).name
    path.write_text(json.dumps(doc, indent=2) + "\n")


def read(folder: Path) -> tuple[dict, dict]:
    return (
        json.loads((folder / "sft.stats.json").read_text()),
        json.loads((folder / "sft.figures.json").read_text()),
    )


def replace(docs: str, text: str) -> str:
    head, rest = docs.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{text}\n{END}{tail}"


def quoted(docs: str) -> str:
    """The block the docs quote now."""
    return docs.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--results", required=True, help="a run's results folder (sft.stats.json, sft.figures.json)"
    )
    ap.add_argument("--write", action="store_true", help="copy the run's files and rewrite docs/outputs.md")
    args = ap.parse_args(argv)
    results = Path(args.results)
    text = block(*read(results))
    if args.write:
        SOURCE.mkdir(parents=True, exist_ok=True)
        for name in ("sft.stats.json", "sft.figures.json"):
            shutil.copyfile(results / name, SOURCE / name)
        _local_names(SOURCE / "sft.stats.json")
        DOCS.write_text(replace(DOCS.read_text(), text))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
