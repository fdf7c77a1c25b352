"""Helpers for the explore tests (tests/test_explore_*.py): a root snapshot, a config file, a run of the CLI."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import yaml

from helpers.tree_rules import check_paths, check_tree
from sftree import cli
from sftree.config import REPO_ROOT
from sftree.dataset.select_paths import select_paths
from sftree.records.tree import Tree
from sftree.search import tree as treemod
from sftree.settings import SelectPathsSettings, schema_defaults

EXAMPLES = REPO_ROOT / "examples"


def make_root(tmp: Path, task: str = "circle_packing", score: float = 1.2, name: str | None = None) -> Path:
    """A root snapshot as select-roots writes it: code/, shared/ and metadata annotated with task and score."""
    root = tmp / "roots" / (name or "eval-000007-agent-1-0123456789ab")
    shutil.copytree(EXAMPLES / task / "seed", root / "code")
    (root / "shared" / "notes").mkdir(parents=True)
    (root / "shared" / "attempts").mkdir()
    (root / "shared" / "notes" / "student.md").write_text("# Student note\nROWS = 5 did not help.\n")
    meta = {"task": task, "direction": "maximize" if task == "circle_packing" else "minimize", "score": score,
            "eval_count": 7, "eval_ok": True, "commit_hash": "0123456789ab" * 3 + "0123"}  # fmt: skip
    (root / "metadata.json").write_text(json.dumps(meta))
    return root


def write_config(tmp: Path, search: dict, *, script: list | None = None, base_url: str | None = None,
                 seed: int = 0, name: str = "config.yaml", agent: dict | None = None) -> Path:  # fmt: skip
    """A config for one circle_packing tree; the Teacher is teacher-sim (in-process with `script`, or base_url)."""
    teacher = {"health_timeout": 10, "retries": 2, "backoff_max": 0.1, "request_timeout": 30}
    if base_url:
        teacher["base_url"] = base_url
    else:
        teacher["sim"] = {"seed": seed, "script": script or []}
    cfg = {
        "tasks": {
            "circle_packing": {
                "coral_task": str(EXAMPLES / "circle_packing"),
                "grader_timeout": 60,
            }
        },
        "results": str(tmp / "results"),
        "teacher": teacher,
        "agent": {"backend": "native", "sandbox": "none", "max_steps_per_turn": 12, **(agent or {})},
        "search": {"seed": seed, **search},
    }
    path = tmp / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def explore_args(root: Path, out: Path, config: Path) -> list[str]:
    return ["explore", "--root", str(root), "--out", str(out), "--config", str(config)]


def explore(root: Path, out: Path, config: Path) -> int:
    return cli.main(explore_args(root, out, config))


def explore_cmd(root: Path, out: Path, config: Path) -> list[str]:
    """The same run as a separate process (to kill it, or to isolate it from the test's threads)."""
    return [sys.executable, "-m", "sftree", *explore_args(root, out, config)]


def load_final(out: Path) -> treemod.Tree:
    """tree.json, validated against the schema and the link checks, and checked against the rules of sections 1
    and 3 by the independent checker (tests/helpers/tree_rules.py)."""
    tree = treemod.load(out / "tree.json")
    obj = tree.to_dict()
    problems = check_tree(obj) + check_paths(
        obj, select_paths(Tree.from_doc(obj), schema_defaults(SelectPathsSettings).top_k).to_doc()
    )
    assert problems == [], f"{out / 'tree.json'} breaks the rules:\n" + "\n".join(problems)
    return tree


def edges_by(tree: treemod.Tree, **where) -> list[treemod.Edge]:
    return [e for e in tree.edges if all(getattr(e, k) == v for k, v in where.items())]
