"""Benchmark the per-edge cost of shared knowledge as the root's attempt records grow.

    python3 benchmarks/knowledge_fork.py [--attempts 100,1000,10000] [--edges 6] [--shape chain|branches]
        [--modes before,stat-cache,after,prev --prev REV]

A root snapshot whose `shared/attempts/` holds A attempt records (about 600 bytes each, like Coral's) and a
few notes. Each edge does what `run_edge` does with knowledge, in order: fork the node (code worktree + private
knowledge checkout), two turns that each hand the workspace to the sandbox uid (as root only: `handover`, the
native and OpenCode backends' `EdgeWorkspace.hand_to`), build the turn prompt (loads every attempt), run `coral
eval` (loads every attempt, writes one new record) and commit knowledge, the final state (knowledge commit +
refs), and close. `--shape chain`: each edge forks the previous edge's child (the parked checkout's index is already at that
commit); `--shape branches`: edges alternate between two branches, so each fork moves the parked checkout to the
other branch's tip. The first edge of each branch is not counted (nothing to reuse yet; its fork costs what
`before` does).

Side by side in one run:
- before: a full checkout of every knowledge file per fork without stat data in the index (so each turn's
  `add -A` hashes every file again), and every attempt file parsed at every load (the first code, kept
  below and patched in);
- stat-cache: as `after` but for the loads, which stat every attempt file, parsing only changed ones
  (`stat_cache_load_attempts`, the second code, kept here);
- after: edges as a sandboxed run has them (`links_fenced`: link(2) fails in the sandbox). The closed edge's
  checkout is moved into the next fork and brought to its commit by writing the tree diff and the paths its
  edge touched (`kcheckout.py`: no index, no stat sweep); loads look only at the names inotify reported since
  the last load (`attempts.AttemptView`); commits write the reported paths' blobs and build the tree from the
  last one (`gittrees.py`), and one with nothing to commit makes no git call (`kwatch.KnowledgeWatch`);
- unfenced: as `after` for edges without the fence (`sandbox: none`, so no sandbox uid and no handover): the
  checkout is moved by git with its index, and a `diff-files` stat sweep of every file restores what a hard link
  may have changed;
- prev: `after` on the sftree of git revision `--prev` (its `src/` exported with `git archive`, measured by this
  file in a child process), so the code before a change is measured in the same run as the code after it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# `--src DIR` (first): measure the sftree under DIR instead (the `prev` mode runs this file that way).
_SRC = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv[:-1] else str(REPO / "src")
sys.path.insert(0, _SRC)

from sftree.runtime import coral, safefs  # noqa: E402
from sftree.runtime import workspace as wsmod  # noqa: E402
from sftree.runtime.attempts import numeric  # noqa: E402
from sftree.runtime.workspace import TreeStore, git  # noqa: E402

_SWEEPS = [0]  # `git diff-files` runs (the stat sweep of git's way), counted by _counting_git


def _counting_git(args, **kw):
    if "diff-files" in args:
        _SWEEPS[0] += 1
    return git(args, **kw)


def old_load_attempts(attempts_dir: Path) -> list[dict]:
    """load_attempts as it was: every file read and parsed at every call."""
    out = []
    if not attempts_dir.is_dir():
        return out
    for p in attempts_dir.glob("*.json"):
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(d, dict):
            d.setdefault("commit_hash", p.stem)
            out.append(d)
    out.sort(key=lambda d: (str(d.get("timestamp", "")), str(d.get("commit_hash"))))
    return out


_STAT_CACHE: dict[tuple, dict | None] = {}


def stat_cache_load_attempts(attempts_dir: Path) -> list[dict]:
    """The second code, as it was: a stat of every record at every call, parsing only files not seen before
    (key: device, inode, size, mtime, ctime, name; a file changed in the last half second is parsed again)."""
    root, rel = attempts_dir.parents[1], Path(*attempts_dir.parts[-2:])
    out = []
    racy_after = time.time() - 0.5
    try:
        with safefs.open_dir(root, rel) as dfd:
            with os.scandir(dfd) as it:
                names = [e.name for e in it if e.name.endswith(".json") and not e.name.startswith(".")]
            for name in names:
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, name)
                if key in _STAT_CACHE:
                    d = _STAT_CACHE[key]
                else:
                    d = _parse_record(dfd, name)
                    if max(st.st_mtime, st.st_ctime) < racy_after:
                        _STAT_CACHE[key] = d
                if d is not None:
                    out.append(dict(d))
    except OSError:
        pass
    out.sort(key=lambda d: (str(d.get("timestamp", "")), str(d.get("commit_hash"))))
    return out


def _parse_record(dir_fd: int, name: str) -> dict | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        with os.fdopen(fd, "rb") as fh:
            d = json.loads(fh.read(safefs.MAX_READ).decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict):
        return None
    d.setdefault("commit_hash", name[: -len(".json")])
    return d


class ListView(list):
    """The records as a sorted list, queried the way the earlier code did (a scan per query)."""

    def best(self, direction: str, exclude: str | None = None):
        scores = [numeric(a.get("score")) for a in self if a.get("commit_hash") != exclude]
        scores = [x for x in scores if x is not None]
        if not scores:
            return None
        return max(scores) if direction == "maximize" else min(scores)


def old_checkout_knowledge(self, kdir: Path, index: Path, commit: str) -> None:
    """The previous fork: a full checkout, index without stat data."""
    env = {"GIT_INDEX_FILE": str(index)}
    kdir.mkdir()
    git(["--work-tree", str(kdir), "read-tree", commit], git_dir=self.knowledge_git, env=env)
    git(["--work-tree", str(kdir), "checkout-index", "-a", "-f"], git_dir=self.knowledge_git, env=env)


def make_root(tmp: Path, attempts: int) -> Path:
    root = tmp / f"root{attempts}"
    (root / "code").mkdir(parents=True)
    (root / "code" / "solution.py").write_text("ROWS = 5\n")
    notes = root / "shared" / "notes"
    notes.mkdir(parents=True)
    for i in range(5):
        (notes / f"n{i}.md").write_text(f"# note {i}\n" + "insight\n" * 20)
    att = root / "shared" / "attempts"
    att.mkdir()
    for i in range(attempts):
        sha = f"{i:040x}"
        rec = {"commit_hash": sha, "agent_id": f"agent-{i % 4}", "title": f"try {i}", "score": i % 97 / 10,
               "status": "regressed", "parent_hash": f"{i - 1:040x}", "timestamp": f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}",
               "feedback": "grader output " * 20, "metadata": {"eval_number": i + 1}}  # fmt: skip
        (att / f"{sha}.json").write_text(json.dumps(rec))
    return root


def _fork(store: TreeStore, state, edge_id: str, fenced: bool):
    if fenced:
        try:
            return store.fork(state, edge_id, links_fenced=True)
        except TypeError:  # code from before the fence (the prev mode): every fork is git's way
            pass
    return store.fork(state, edge_id)


def one_edge(
    store: TreeStore, state, edge_id: str, n: int, fenced: bool = True
) -> tuple[object, dict[str, float]]:
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    sweeps = _SWEEPS[0]
    ws = _fork(store, state, edge_id, fenced)
    t["fork"] = time.perf_counter() - t0
    t["sweeps"] = _SWEEPS[0] - sweeps
    att = ws.knowledge_dir / "attempts"
    load = 0.0
    commit = 0.0
    hand = 0.0
    for turn in (1, 2):
        if (
            HAND_UID is not None and fenced
        ):  # as root, sandboxed: each turn gives the workspace to its uid first
            t1 = time.perf_counter()
            if hasattr(ws, "hand_to"):
                ws.hand_to(HAND_UID)
            else:  # code from before hand_to (the prev mode): the whole workspace, every turn
                from sftree.runtime.sandbox import give_to

                give_to(ws.root, HAND_UID)
            hand += time.perf_counter() - t1
        t1 = time.perf_counter()
        coral.view_for(
            att
        ).since_improvement()  # the load the turn prompt made (its pivot heartbeat) before sftree.world
        # `coral eval`: the branch best before grading, as CoralRuntime.cmd_eval asks for it
        coral.view_for(att).best("maximize", exclude="0" * 40)
        load += time.perf_counter() - t1
        sha = f"{n:036x}{turn:04x}"
        (att / f"{sha}.json").write_text(json.dumps({"commit_hash": sha, "score": 1.0, "timestamp": "2027"}))
        (ws.knowledge_dir / "notes" / f"{edge_id}-{turn}.md").write_text("a new insight\n")
        t1 = time.perf_counter()
        ws.commit_knowledge(f"{edge_id} turn {turn}")
        commit += time.perf_counter() - t1
    t["loads"], t["commits"], t["handover"] = load, commit, hand
    t1 = time.perf_counter()
    child = ws.state(None)
    ws.close()
    t["state+close"] = time.perf_counter() - t1
    t["edge"] = time.perf_counter() - t0
    return child, t


def run_tree(tmp: Path, root: Path, edges: int, mode: str, shape: str = "chain") -> dict[str, float]:
    saved = (TreeStore._checkout_knowledge, TreeStore.park_knowledge, coral.view_for)
    wsmod.git = _counting_git
    if mode == "before":
        TreeStore._checkout_knowledge = old_checkout_knowledge
        TreeStore.park_knowledge = lambda self, ws: None
        coral.view_for = lambda d: ListView(old_load_attempts(d))
    elif mode == "stat-cache":
        coral.view_for = lambda d: ListView(stat_cache_load_attempts(d))
    _STAT_CACHE.clear()
    try:
        store, state = TreeStore.create(tmp / f"tree-{mode}-{root.name}", root, {})
        times: list[dict[str, float]] = []
        tips = [state, state]  # two branches: `branches` alternates between them
        for i in range(edges + 1):
            if shape == "branches":  # fork the tip of the other branch than the last edge's
                state = tips[i % 2]
            child, t = one_edge(store, state, f"e{i + 1}", i, fenced=mode != "unfenced")
            tips[i % 2] = state = child
            if i > (shape == "branches"):  # the first edge(s) have nothing to reuse
                times.append(t)
        store.close()
    finally:
        TreeStore._checkout_knowledge, TreeStore.park_knowledge, coral.view_for = saved
        wsmod.git = git
    out = {k: 1000 * statistics.median(t[k] for t in times) for k in times[0] if k != "sweeps"}
    out["sweeps"] = sum(t["sweeps"] for t in times)  # forks that took git's way (of the edges counted)
    return out


def run_prev(tmp: Path, rev: str, attempts: int, edges: int, shape: str) -> dict[str, float]:
    """This benchmark's `after` mode on the sftree of commit `rev` (exported with `git archive`), in a child
    process, so the previous code is measured in the same run on the same machine."""
    src = tmp / f"prev-{rev}"
    if not src.is_dir():
        src.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", rev, "src"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    out = subprocess.run(
        [sys.executable, __file__, "--src", str(src / "src"), "--attempts", str(attempts), "--edges", str(edges),
         "--modes", "after", "--shape", shape],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for line in out.splitlines():
        f = line.split()
        if len(f) == 9 and f[0] == str(attempts) and f[1] == "after":
            return dict(zip([*COLS, "sweeps"], map(float, f[2:]), strict=True))
    raise RuntimeError(f"no result row from the {rev} run:\n{out}")


COLS = ["fork", "handover", "loads", "commits", "state+close", "edge"]
# As root, the sandbox runs as an unprivileged uid that must own the workspace (EdgeWorkspace.hand_to).
HAND_UID = 200_999 if os.geteuid() == 0 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attempts", default="100,1000,10000")
    ap.add_argument("--edges", type=int, default=6)
    ap.add_argument("--modes", default="before,stat-cache,after")
    ap.add_argument(
        "--shape",
        choices=["chain", "branches"],
        default="chain",
        help="chain: each edge forks the last edge's child (the parked checkout is at that commit); branches: "
        "edges alternate between two branches (each fork moves the parked checkout to the other branch)",
    )
    ap.add_argument("--prev", default="", help="git revision measured as mode `prev` (with --modes ...,prev)")
    ap.add_argument("--src", help="import sftree from this folder (used by the prev mode)")
    args = ap.parse_args()
    cols = COLS
    print(
        f"Per-edge knowledge cost (ms, median of {args.edges} edges, shape {args.shape}; loads = 4 attempt loads, "
        "commits = 2; handover = 2, as root; sweeps = forks that took git's way with its stat sweep, of the edges counted)"
    )
    print(f"{'attempts':>8} {'mode':>10} " + " ".join(f"{c:>11}" for c in cols) + f" {'sweeps':>7}")
    with tempfile.TemporaryDirectory(prefix="sftree-kfork-") as tmp:
        for a in [int(x) for x in args.attempts.split(",")]:
            root = make_root(Path(tmp), a)
            for mode in args.modes.split(","):
                if mode == "prev":
                    r = run_prev(Path(tmp), args.prev or "HEAD", a, args.edges, args.shape)
                else:
                    r = run_tree(Path(tmp), root, args.edges, mode, args.shape)
                row = " ".join(f"{r[c]:>11.1f}" for c in cols)
                print(f"{a:>8} {mode:>10} {row} {int(r.get('sweeps', 0)):>7}", flush=True)
            shutil.rmtree(root)
    print(f"\nmachine: {os.cpu_count()} CPUs, {sys.platform}, Python {sys.version.split()[0]}, "
          f"{git(['--version']).stdout.strip()}; tmp dir {tempfile.gettempdir()}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
