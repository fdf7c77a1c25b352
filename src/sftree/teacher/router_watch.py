"""Watching sglang-router's worker list (`GET /workers`): which workers are healthy, and a thread that reports
each change, so the Teacher client can resend the requests a dead worker held (teacher/client.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sftree.teacher.transport import RequestFailed


def read_workers(payload: object) -> dict[str, bool] | None:
    """`GET /workers` of sglang-router as {url: healthy}, or None when the answer is not a worker list."""
    workers = payload.get("workers") if isinstance(payload, dict) else None
    if not isinstance(workers, list):
        return None
    out: dict[str, bool] = {}
    for w in workers:
        if isinstance(w, dict) and isinstance(w.get("url"), str):
            out[w["url"]] = bool(w.get("is_healthy", True))
    return out


class RouterWatcher:
    """Polls the router's worker list every `poll` s and calls `on_change(url, healthy, view)` on each change."""

    def __init__(
        self,
        fetch: Callable[[], dict[str, bool] | None],
        poll: float,
        on_change: Callable[[str, bool, dict[str, bool]], None],
        initial: dict[str, bool],
    ):
        self.fetch, self.poll, self.on_change = fetch, poll, on_change
        self.view = dict(initial)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="teacher-fleet", daemon=True)

    def start(self) -> RouterWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                view = self.fetch()
            except (RequestFailed, ValueError):
                continue  # the router itself is unreachable: the requests' own timeouts and retries cover it
            if view is None:
                continue
            self.check(view)

    def check(self, view: dict[str, bool]) -> None:
        """Compare with the last view: a worker that turned unhealthy or left the list is down; one that turned
        healthy, or joined healthy, is up. One that joins unhealthy is not reported (nothing is routed to it)."""
        old, self.view = self.view, dict(view)
        for url in sorted(set(old) | set(view)):
            before, now = old.get(url), view.get(url, False)
            if now != bool(before) and not (before is None and not now):
                self.on_change(url, now, self.view)
