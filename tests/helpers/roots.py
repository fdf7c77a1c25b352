"""Build small hand-made Student runs for the select-roots tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MISSING = object()  # "no score key at all" in an attempt record


def commit_of(index: int) -> str:
    return hashlib.sha1(f"commit-{index}".encode()).hexdigest()


def make_run(root: Path, scores, eval_ok=None, pending=(), start: int = 1) -> list[Path]:
    """One eval-* folder per score (global indices start, start+1, ...).

    eval_ok: list of bools (default: True where the score is not None); pending: positions without eval_ok.
    """
    root.mkdir(parents=True, exist_ok=True)
    folders = []
    for pos, score in enumerate(scores):
        index = start + pos
        commit = commit_of(index)
        agent = f"agent-{pos % 4 + 1}"
        folder = root / f"eval-{index:06d}-{agent}-{commit[:12]}"
        (folder / "code").mkdir(parents=True)
        (folder / "code" / "solution.py").write_text(f"X = {pos}\n")
        (folder / "shared" / "attempts").mkdir(parents=True)
        (folder / "shared" / "notes").mkdir()
        (folder / "shared" / "notes" / "n.md").write_text("note\n")
        ok = (score is not None and score is not MISSING) if eval_ok is None else eval_ok[pos]
        meta = {
            "eval_count": pos // 4 + 1,
            "agent_id": agent,
            "commit_hash": commit,
            "shared_state_hash": "s" * 8,
            "exported_shared_content_hash": "e" * 8,
        }
        if pos not in pending:
            meta["eval_ok"] = ok
        (folder / "metadata.json").write_text(json.dumps(meta))
        record = {
            "commit_hash": commit,
            "agent_id": agent,
            "title": f"t{pos}",
            "status": "improved",
            "parent_hash": None,
            "timestamp": "2026-01-01T00:00:00Z",
            "feedback": "",
        }
        if score is not MISSING:
            record["score"] = score
        (folder / "shared" / "attempts" / f"{commit}.json").write_text(json.dumps(record))
        folders.append(folder)
    return folders


def tree_digest(root: Path) -> str:
    """Hash of every path, mode and content under root: proves an input was not modified."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        mtime = st.st_mtime_ns if p.is_file() else 0
        h.update(f"{p.relative_to(root)}|{st.st_mode}|{mtime}\n".encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def read_table(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]
