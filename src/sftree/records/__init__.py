"""The records that pass between stages, one module per file on disk (docs/architecture.md, "Floors").

Each module owns one file: its frozen record type, its one writer and its one reader (with the file's schema
check); nothing else in sftree opens that file. The package sits at the bottom of the house: it imports nothing
from sftree but the leaf helpers (`errors`, `fileio`, `config.SCHEMA_DIR`), so every stage may import it and it
imports no stage.

    scores.py   what a raw score means: `oriented`, `better`, `best_of`, `regressed_rate` (every stage)
    root.py     a root's `metadata.json` and the root folder's checks (select-roots -> explore, export)
    tree.py     `tree.json`, `tree.live.json` + `tree.log.jsonl` (explore -> select-paths, export, report)
    steplog.py  `edges/<edge>/steps.jsonl` + `messages.jsonl` (agents write, export reads)
    stages.py   `stages.tsv` (select-roots -> report, dataset card)
    paths.py    `paths.json` (select-paths -> export, report)
    sft.py      `sft.jsonl` + `sft.stats.json` + `sft.figures.json` (export -> merge -> trainers, report)
    tree_packed.py  `sft.tree.jsonl` + `sft.tree.stats.json`, the tree form (export -> merge -> trainers)
"""
