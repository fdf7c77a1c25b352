"""A run's processes end with the run, whichever of them was killed.

A process killed with SIGKILL cannot stop what it started, and its children (started in sessions of their own,
so a group signal misses them) are handed to init and run on. So each `sftree` process of a workflow run
watches the processes it belongs to: the Snakefile names the main Snakemake process in the environment variable
`SFTREE_WATCH`, every `sftree` command started below it (cli.py, `watch_from_env`) adds its own name for what
it starts (`sftree teacher-sim` under `sftree explore`), and polls the processes named there. When one is gone
it sends itself SIGTERM: `sftree explore`'s handler ends what it started and removes its temporary folders
(runtime/tempdirs.py), any other command dies of it. So after a `kill -9` of Snakemake or of an explore job,
the rest of the run ends within `POLL` seconds or so.

A name is `host:pid:start time` (/proc's field 22): a reused pid is not the owner, and a job of a cluster run on
another node (its environment copied by the scheduler) does not watch a pid of the submitting host. Outside a
workflow run the variable is unset and nothing is watched: an `sftree` command run by hand or under `nohup`
outlives its shell as before.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading

from sftree.runtime.runowner import start_time

log = logging.getLogger(__name__)

ENV = "SFTREE_WATCH"
POLL = 1.0  # seconds between looks


def name_of(pid: int) -> str | None:
    """`host:pid:start`, or None when the process is gone."""
    started = start_time(pid)
    return None if started is None else f"{socket.gethostname()}:{pid}:{started}"


def _here(names: str) -> list[tuple[int, str]]:
    """The (pid, start) named in `names` that are processes of this host."""
    host = socket.gethostname()
    out = []
    for name in filter(None, names.split(",")):
        parts = name.rsplit(":", 2)
        if len(parts) == 3 and parts[0] == host and parts[1].isdigit():
            out.append((int(parts[1]), parts[2]))
    return out


def gone(names: str) -> int | None:
    """The first process named in `names` (of this host) that is no longer running, else None."""
    return next((pid for pid, started in _here(names) if start_time(pid) != started), None)


def add_self(env: dict[str, str] | os._Environ[str], pid: int | None = None) -> None:
    """Name this process (or `pid`) in `env` for the processes started from it."""
    me = name_of(os.getpid() if pid is None else pid)
    if me is not None:
        env[ENV] = ",".join(filter(None, [env.get(ENV, ""), me]))


def watch_from_env(poll: float = POLL) -> threading.Thread | None:
    """In an `sftree` command: watch the processes `SFTREE_WATCH` names (SIGTERM to itself when one is gone),
    then add itself for its children. Nothing when the variable is unset."""
    names = os.environ.get(ENV, "")
    if not _here(names):
        return None
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(poll):
            pid = gone(names)
            if pid is not None:
                log.warning("process %d of this run is gone: ending this one", pid)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=loop, name="run-watch", daemon=True)
    thread.start()
    add_self(os.environ)
    return thread
