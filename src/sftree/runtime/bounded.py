"""The one bounded reader of what an untrusted process sends on a pipe or a socket (docs/security.md, "Bounds").

    out, err = Capped(16 << 20), Capped(16 << 20)     # each keeps its first 16 MiB and counts the rest
    why = drain({proc.stdout: out, proc.stderr: err}, deadline=time.monotonic() + 60, watch=check, every=0.5)
    line = read_line(conn, limit=64 << 20, timeout=30) # one request, up to and including its newline
    lines = LineReader(proc.stdout, limit=64 << 20)    # the same, line after line from one stream

Everything is read as it comes, while the writer runs: a writer is never left blocked on a full pipe (a result
larger than its pipe would otherwise hang the process until it is killed). Chunks are joined once (linear time);
at most `cap` bytes are kept per stream, the rest is read, dropped and counted (`drain`), or refused (`read_line`:
a line over its limit is an error, read no further). Every read has a deadline.
"""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Callable, Mapping
from typing import Protocol, TypeAlias

CHUNK = 65536


class ReadError(Exception):
    """A line that was too long, too slow or cut off."""


class Capped:
    """The first `cap` bytes of a stream; what came after is counted in `dropped`."""

    def __init__(self, cap: int):
        self.cap = cap
        self.size = 0
        self.dropped = 0
        self._chunks: list[bytes] = []

    def add(self, chunk: bytes) -> None:
        room = self.cap - self.size
        if room > 0:
            kept = chunk[:room]
            self._chunks.append(kept)
            self.size += len(kept)
        self.dropped += max(0, len(chunk) - max(room, 0))

    def data(self) -> bytes:
        if len(self._chunks) > 1:
            self._chunks = [b"".join(self._chunks)]
        return self._chunks[0] if self._chunks else b""


class HasFileno(Protocol):
    """A file object or a socket: what has a descriptor."""

    def fileno(self) -> int: ...


# what can be read: a descriptor, or what has one
Readable: TypeAlias = int | HasFileno


def _fd(stream: Readable) -> int:
    return stream if isinstance(stream, int) else stream.fileno()


def drain(
    streams: Mapping[Readable, Capped],
    *,
    deadline: float,
    watch: Callable[[], str | None] | None = None,
    every: float = 1.0,
) -> str | None:
    """Read each stream (a file object, a socket or a descriptor) into its Capped until every one is at its end:
    None. Stops early at `deadline` (time.monotonic()): "timeout"; or when `watch()`, called every `every` s,
    gives a reason: that reason. The streams stay open (the caller's)."""
    next_watch = time.monotonic() + every
    with selectors.DefaultSelector() as sel:
        for stream, buf in streams.items():
            sel.register(_fd(stream), selectors.EVENT_READ, buf)
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            if watch is not None and now >= next_watch:
                next_watch = now + every
                why = watch()
                if why:
                    return why
            wait = min(deadline - now, 1.0, every if watch is not None else 1.0)
            for key, _ in sel.select(timeout=max(0.0, wait)):
                try:
                    chunk = os.read(key.fd, CHUNK)
                except BlockingIOError:
                    continue
                except OSError:  # a reset socket: its end
                    chunk = b""
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                key.data.add(chunk)
    return None


class LineReader:
    """Newline-terminated lines from one stream, each at most `limit` bytes (with its newline) and within the
    timeout given for it; bytes after a line's newline are kept for the next."""

    def __init__(self, stream: Readable, limit: int) -> None:
        self.fd = _fd(stream)
        self.limit = limit
        self._rest = b""

    def line(self, timeout: float, *, what: str = "request") -> bytes:
        deadline = time.monotonic() + timeout
        chunks, size = ([self._rest], len(self._rest)) if self._rest else ([], 0)
        self._rest = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.fd, selectors.EVENT_READ)
            while True:
                if chunks and b"\n" in chunks[-1]:
                    head, _, tail = chunks[-1].partition(b"\n")
                    chunks[-1] = head + b"\n"
                    self._rest = tail
                    line = b"".join(chunks)
                    if len(line) > self.limit:
                        raise ReadError(f"{what} too large (over {self.limit} bytes)")
                    return line
                if size > self.limit:
                    raise ReadError(f"{what} too large (over {self.limit} bytes)")
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    raise ReadError(f"{what} not complete within {timeout:g} s")
                try:
                    chunk = os.read(self.fd, CHUNK)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    raise ReadError(f"{what} cut off: {exc}") from None
                if not chunk:
                    raise ReadError(f"connection closed before the end of the {what}")
                chunks.append(chunk)
                size += len(chunk)


def read_line(stream: Readable, limit: int, timeout: float, *, what: str = "request") -> bytes:
    """One line from `stream` (bytes after its newline are dropped): `LineReader.line`."""
    return LineReader(stream, limit).line(timeout, what=what)
