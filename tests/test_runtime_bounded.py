"""The one bounded reader (runtime/bounded.py): a pipe is read while its writer runs, each stream capped, lines
bounded in size and time."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from sftree.runtime.bounded import Capped, LineReader, ReadError
from sftree.runtime.procs import run_group


def test_a_result_pipe_larger_than_the_pipe_is_read_while_the_writer_runs():
    r, w = os.pipe()
    result = Capped(100_000)
    code = "import os, sys; os.write(int(sys.argv[1]), b'x' * 1_000_000); print('done')"
    t0 = time.monotonic()
    try:  # 1 MB into a 64 KiB pipe: read only after the exit, the child would block there until killed
        res = run_group(
            [sys.executable, "-c", code, str(w)], timeout=30, read_also={r: result}, hand_fds=(w,)
        )
    finally:
        os.close(r)
    assert res.returncode == 0 and res.stdout == b"done\n" and time.monotonic() - t0 < 10
    assert result.data() == b"x" * 100_000 and result.dropped == 900_000


def test_outputs_are_capped_and_the_rest_counted():
    res = run_group([sys.executable, "-c", "print('y' * 500_000)"], timeout=30, max_output=1000)
    assert res.stdout == b"y" * 1000 and res.dropped == 499_001


def test_lines_come_one_by_one_and_each_is_bounded():
    r, w = os.pipe()
    os.write(w, b"one\ntwo\nthr")
    lines = LineReader(r, limit=20)
    assert lines.line(1) == b"one\n" and lines.line(1) == b"two\n"
    threading.Timer(0.1, lambda: os.write(w, b"ee\n" + b"z" * 50)).start()
    assert lines.line(2) == b"three\n"
    with pytest.raises(ReadError, match="too large"):
        lines.line(1)
    os.close(w)
    os.close(r)


def test_a_line_that_never_ends_stops_at_its_deadline_and_a_closed_one_is_cut_off():
    r, w = os.pipe()
    os.write(w, b"no newline")
    t0 = time.monotonic()
    with pytest.raises(ReadError, match="not complete within 0.3 s"):
        LineReader(r, limit=100).line(0.3)
    assert time.monotonic() - t0 < 2
    os.close(w)
    with pytest.raises(ReadError, match="closed before the end"):
        LineReader(r, limit=100).line(1)
    os.close(r)
