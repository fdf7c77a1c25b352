"""`paths.json`: one tree's ranked root-to-leaf paths (docs/architecture.md, "paths.json"). select-paths writes it
beside the tree's `tree.json`; export and the report read it. Only this module opens it.

There is no JSON Schema for it; the reader checks what every reader relies on (an object with a `paths` list), so
a wrong file fails naming itself instead of reading as "no paths".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sftree.errors import InputError
from sftree.fileio import read_json, write_json_atomic

PATHS_NAME = "paths.json"
PATHS_VERSION = 1


def paths_path(tree_dir: str | os.PathLike[str]) -> Path:
    """TREEDIR/paths.json."""
    return Path(tree_dir) / PATHS_NAME


def write_paths(path: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    """Write atomically (2-space JSON), so a reader never sees half a file."""
    write_json_atomic(path, doc)


def read_paths(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A paths document; InputError naming the file when it is not JSON or has no `paths` list."""
    doc = read_json(path, "selected paths file")
    if not isinstance(doc, dict) or not isinstance(doc.get("paths"), list):
        raise InputError(f"selected paths file {path}: no `paths` list")
    return doc
