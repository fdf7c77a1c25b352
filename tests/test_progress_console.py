"""Console progress of a tree (progress.tree_line, ConsoleLines) and `sftree explore --progress-fd`."""

from __future__ import annotations

import io
import os

import pytest

from sftree.errors import InputError
from sftree.progress import ConsoleLines, tree_line
from sftree.search.explore import _progress_stream

COUNTERS = {"edges": 5, "valid_edges": 3, "pruned_edges": 1, "failed_edges": 1, "good_leaves": 2}


def test_tree_line_counts_budget_leaves_and_best():
    line = tree_line("explore tsp/eval-1", COUNTERS, 40, 8, 702.78971234)
    assert line == "explore tsp/eval-1: edges 3/40 valid (5 run), good leaves 2/8, best score 702.79"


def test_tree_line_without_a_score_and_when_finished():
    line = tree_line("t/r", {**COUNTERS, "good_leaves": 0}, 6, 4, None, stop="edge_budget")
    assert line == "t/r: edges 3/6 valid (5 run), good leaves 0/4, best score none, finished: edge_budget"


def test_console_lines_once_per_key():
    out = io.StringIO()
    console = ConsoleLines(out)
    for key, text in [(0, "a"), (0, "a again"), (1, "b"), ((1, "done"), "c")]:
        console.emit(key, text)
    assert out.getvalue() == "a\nb\nc\n"
    ConsoleLines(None).emit(0, "nowhere")  # no stream: nothing to write, no error


def test_progress_fd_writes_through_the_shared_descriptor(tmp_path):
    path = tmp_path / "console.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, b"before\n")
        stream = _progress_stream(fd)
        ConsoleLines(stream).emit(1, "progress")
        stream.close()  # closefd=False: the descriptor stays open for its owner
        os.write(fd, b"after\n")
    finally:
        os.close(fd)
    assert path.read_text() == "before\nprogress\nafter\n"  # in order, nothing overwritten


def test_progress_fd_not_open_is_a_clear_error():
    r, w = os.pipe()
    os.close(r)
    os.close(w)  # a descriptor number that is surely closed now
    with pytest.raises(InputError, match=rf"--progress-fd {w}: not an open file descriptor"):
        _progress_stream(w)
