"""What the tree takes from its root snapshot for Coral's world, read once when the tree starts (the Student's
snapshot, never a workspace): the agent whose run it is, the attempt history, the eval count, the number of agents
and the run's heartbeat files.

    rc = read_root_context(root_dir)     # RootContext
    rc.counters("maximize")              # CoralCounters at the root
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from sftree.jsontypes import CoralDoc
from sftree.records.root import read_root_meta
from sftree.world.counters import CoralCounters


@dataclass(frozen=True)
class RootContext:
    agent_id: str
    eval_count: int | None
    attempts: list[CoralDoc] = field(default_factory=list)
    agents: int = 1  # distinct agent ids in the attempt history (at least 1)
    heartbeat: CoralDoc = field(default_factory=dict)  # {"local": [...]|None, "global": [...]|None}

    def counters(self, direction: str) -> CoralCounters:
        return CoralCounters.from_root(
            self.attempts, agent_id=self.agent_id, eval_count=self.eval_count, direction=direction
        )


def root_context(meta: CoralDoc, files: dict[str, bytes], agent_id: str | None = None) -> RootContext:
    """The root's context from its metadata and the files of its `shared/` ({path: bytes}; as the tree's store
    holds them, read by the host without following links). Records that are not JSON objects, or larger than
    1 MiB, are left out; so is a heartbeat file that is not `{"actions": [{"name", "every", ...}]}`."""
    agent = agent_id or meta.get("agent_id")
    agent = agent if isinstance(agent, str) and agent else "agent-1"

    def doc(data: bytes | None) -> object:
        if data is None or len(data) > 1 << 20:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    attempts = []
    for path in sorted(files):
        name = path.rpartition("/")[2]
        if (
            path.startswith("attempts/")
            and path.count("/") == 1
            and name.endswith(".json")
            and not name.startswith(".")
        ):
            rec = doc(files[path])
            if isinstance(rec, dict):
                attempts.append(rec)
    hb = {}
    for key, name in (("local", f"heartbeat/{agent}.json"), ("global", "heartbeat/_global.json")):
        data = doc(files.get(name))
        acts = data.get("actions") if isinstance(data, dict) else None
        if isinstance(acts, list) and all(isinstance(a, dict) and "name" in a and "every" in a for a in acts):
            hb[key] = acts
    ids = {a.get("agent_id") for a in attempts if isinstance(a.get("agent_id"), str) and a.get("agent_id")}
    ec = meta.get("eval_count")
    return RootContext(
        agent_id=agent,
        eval_count=ec if isinstance(ec, int) and not isinstance(ec, bool) else None,
        attempts=attempts,
        agents=len(ids | {agent}),
        heartbeat=hb,
    )


def read_root_context(root_dir: str | Path, agent_id: str | None = None) -> RootContext:
    """`root_context` of a root snapshot folder on disk (its files read without following links)."""
    from sftree.runtime.folderreader import Quota, walk

    root_dir = Path(root_dir)
    meta = read_root_meta(root_dir).to_dict()
    files = {}
    shared = Path(os.path.realpath(root_dir / "shared"))  # (select-roots' own top-level link, if any)
    for dfd, rel, entry in walk(shared, Quota(files=10_000_000, bytes=1 << 62, file_bytes=1 << 62, depth=2)):
        if rel.startswith(("attempts/", "heartbeat/")) and entry.is_file(follow_symlinks=False):
            fd = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
            with os.fdopen(fd, "rb") as fh:
                files[rel] = fh.read((1 << 20) + 1)
    return root_context(meta, files, agent_id)
