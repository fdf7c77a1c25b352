"""Progress log lines with counts and rates for long work."""

from __future__ import annotations

import logging
import time
from typing import TextIO


class Progress:
    """Logs `label: done/total (rate/s)` at most every `every` seconds, and once at the end."""

    def __init__(
        self, label: str, total: int | None = None, every: float = 5.0, logger: logging.Logger | None = None
    ):
        self.label, self.total, self.every = label, total, every
        self.log = logger or logging.getLogger("sftree.progress")
        self.start = self.last = time.monotonic()
        self.done = 0

    def update(self, n: int = 1, **extra: object) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self._emit(extra)

    def finish(self, **extra: object) -> None:
        self._emit(extra)

    def _emit(self, extra: dict[str, object]) -> None:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        total = f"/{self.total}" if self.total is not None else ""
        tail = "".join(f" {k}={v}" for k, v in extra.items())
        self.log.info(
            "%s: %d%s done (%.1f/s, %.1fs)%s",
            self.label,
            self.done,
            total,
            self.done / elapsed,
            elapsed,
            tail,
        )


def tree_line(
    label: str,
    counters: dict[str, int],
    max_valid_edges: int,
    target_good_leaves: int,
    best: float | None,
    stop: str | None = None,
) -> str:
    """One console line about a growing tree: valid edges against the edge budget, good leaves against their
    target, the best raw score of any node so far (the root's included), and the stop rule once it fired."""
    best_s = "none" if best is None else f"{best:.6g}"
    line = (
        f"{label}: edges {counters['valid_edges']}/{max_valid_edges} valid ({counters['edges']} run),"
        f" good leaves {counters['good_leaves']}/{target_good_leaves}, best score {best_s}"
    )
    return line + (f", finished: {stop}" if stop else "")


class ConsoleLines:
    """Writes one line per change of a key to a text stream (the console of a job whose log is a file)."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream: TextIO | None = stream
        self.last: object = None

    def emit(self, key: object, line: str) -> None:
        if self.stream is None or key == self.last:
            return
        self.last = key
        self.stream.write(line + "\n")
        self.stream.flush()
