"""One `git cat-file --batch` process: objects asked by id, answers read a chunk at a time. The one reader of git
objects underneath both of sftree's: a tree's own stores (runtime/objects.py, `ObjectDB`: many objects a round
trip) and a Coral run's repositories, which agents wrote (roots/gitobjects.py, `ObjectReader`: one object at a
time, within its limits, restarting git to skip what it refuses).

With `stall` set, a watchdog kills git when it owes bytes and sends none for that long (a FIFO put among the
objects of a live run), and the read fails with `Stopped(stalled=<object>)` instead of hanging.
"""

from __future__ import annotations

import io
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

# the most of an object's content handed on at once (`read_each`)
CHUNK = 1 << 20


class CatFileError(Exception):
    """git's answer for `oid` was not an object; `answer`: its header line as git sent it (b"" when none came)."""

    def __init__(self, oid: str, answer: bytes = b""):
        super().__init__(f"{oid}: {answer.strip()!r}")
        self.oid, self.answer = oid, answer


class Missing(CatFileError):
    """git has no such object (`missing`), or the id names more than one (`ambiguous`)."""


class BadAnswer(CatFileError):
    """A header that is not `<id> <type> <size>`."""


class Stopped(CatFileError):
    """git stopped answering (it died or was killed); `stalled`: the object the watchdog gave up on, if it did."""

    def __init__(self, oid: str, stalled: str | None = None):
        super().__init__(oid)
        self.stalled = stalled


class CatFile:
    """`git [-c config]... --git-dir DIR cat-file --batch` under `env`, started at once. Not thread-safe: the
    caller holds its own lock (ObjectDB) or reads from one thread (ObjectReader)."""

    def __init__(
        self, git_dir: Path, *, config: tuple[str, ...] = (), env: dict[str, str], stall: float | None = None
    ):
        self.git_dir, self.config, self.env, self.stall = Path(git_dir), tuple(config), env, stall
        self.restarts = 0
        self.proc: subprocess.Popen[bytes]
        self._in: IO[bytes]  # git's stdin and stdout, the pipes `start` made
        self._out: io.BufferedReader
        self._busy: tuple[float, str] | None = (
            None  # (time of the last byte, object) while git owes an answer
        )
        self._stalled: str | None = None
        self._done = threading.Event()
        self.start()
        if stall is not None:
            threading.Thread(
                target=self._watch, args=(stall,), name="git-cat-file-watchdog", daemon=True
            ).start()

    def start(self) -> None:
        cmd = ["git"]
        for kv in self.config:
            cmd += ["-c", kv]
        cmd += ["--git-dir", str(self.git_dir), "cat-file", "--batch"]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=str(self.git_dir),
            env=self.env,
        )
        self._in, self._out = _pipes(self.proc)

    def stop(self) -> None:
        """Kill git and reap it (its answers owed are dropped with it)."""
        self._busy = None
        proc = self.proc
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for fh in (self._in, self._out):
            try:
                fh.close()
            except OSError:
                pass

    def restart(self) -> None:
        """A fresh git process in place of this one (killed), counted in `restarts`."""
        self.stop()
        self.restarts += 1
        self.start()

    def running(self) -> None:
        """Start git again if it exited (a read that failed stopped it)."""
        if self.proc.poll() is not None:
            self.restart()

    def close(self) -> None:
        """End git: its input closed, 10 s to exit, then killed."""
        self._done.set()
        proc = self.proc
        if proc.poll() is None:
            try:
                self._in.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._out.close()

    def _watch(self, stall: float) -> None:
        while not self._done.wait(min(1.0, stall / 4)):
            busy = self._busy
            if busy is not None and time.monotonic() - busy[0] > stall:
                self._stalled = busy[1]
                try:
                    self.proc.kill()
                except OSError:
                    pass

    def idle(self) -> None:
        """git owes nothing now (the watchdog stops timing)."""
        self._busy = None

    def stopped(self, oid: str) -> Stopped:
        """The error for a git that stopped answering while `oid` was read (after a stall, every read says so)."""
        self._busy = None
        return Stopped(oid, self._stalled)

    def ask(self, oid: str) -> tuple[str, int]:
        """Send `oid` and read git's header: (type, size); its `size + 1` bytes (the content and a newline)
        follow, for `chunk` to read."""
        self._busy = (time.monotonic(), oid)
        try:
            self._in.write(oid.encode() + b"\n")
            self._in.flush()
            header = self._out.readline()
        except (OSError, ValueError):
            header = b""
        return self._header(oid, header)

    def _header(self, oid: str, header: bytes) -> tuple[str, int]:
        if not header:
            raise self.stopped(oid)
        parts = header.split()
        if len(parts) == 2 and parts[1] in (b"missing", b"ambiguous"):
            self._busy = None
            raise Missing(oid, header)
        if len(parts) != 3 or not parts[2].isdigit():
            self._busy = None
            raise BadAnswer(oid, header)
        return parts[1].decode("ascii", "replace"), int(parts[2])

    def chunk(self, oid: str, n: int) -> bytes:
        """Up to `n` bytes of the object git is sending (what is there, at least one byte)."""
        try:
            chunk = self._out.read1(n)
        except (OSError, ValueError):
            chunk = b""
        if not chunk:
            raise self.stopped(oid)
        self._busy = (time.monotonic(), oid)
        return chunk

    def read_many(self, oids: list[str]) -> list[tuple[str, bytes]]:
        """(type, content) of each object, with one round trip: the requests are written while the answers are
        read. Any error stops git (the answers still owed go with it); the next call starts it again."""
        out: list[tuple[str, list[bytes]]] = []

        def take(kind: str, _size: int) -> Callable[[bytes], object]:
            out.append((kind, []))
            return out[-1][1].append

        self.read_each(oids, take)
        return [(kind, b"".join(parts)) for kind, parts in out]

    def read_each(self, oids: list[str], take: Callable[[str, int], Callable[[bytes], object]]) -> None:
        """Each object in turn, with one round trip: `take(type, size)` gives the function its content is handed
        to, at most CHUNK bytes a call, so an object of any size passes without being held whole. Any error (the
        handler's included) stops git; the next call starts it again."""
        self.running()
        stdin, stdout = self._in, self._out
        writer = threading.Thread(target=_write_lines, args=(stdin, [o.encode() for o in oids]), daemon=True)
        writer.start()
        try:
            for oid in oids:
                self._busy = (time.monotonic(), oid)
                try:
                    header = stdout.readline()
                except (OSError, ValueError):
                    header = b""
                kind, size = self._header(oid, header)
                put, left = take(kind, size), size
                while left:
                    data = stdout.read(min(left, CHUNK))
                    if not data:
                        raise self.stopped(oid)
                    put(data)
                    left -= len(data)
                if len(stdout.read(1)) != 1:  # the newline after the content
                    raise self.stopped(oid)
            self._busy = None
        except BaseException:
            self.stop()
            raise
        finally:
            writer.join()


def _pipes(proc: subprocess.Popen[bytes]) -> tuple[IO[bytes], io.BufferedReader]:
    """git's stdin and stdout, as Popen made them for `stdin=PIPE, stdout=PIPE` (buffered: `read1` reads what is
    there)."""
    if proc.stdin is None or not isinstance(proc.stdout, io.BufferedReader):
        raise RuntimeError("git cat-file started without its pipes")
    return proc.stdin, proc.stdout


def _write_lines(stream: IO[bytes], lines: list[bytes]) -> None:
    try:
        stream.write(b"".join(line + b"\n" for line in lines))
        stream.flush()
    except (OSError, ValueError):
        pass
