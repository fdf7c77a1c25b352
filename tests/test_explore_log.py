"""explore.log keeps the run's INFO lines however the process set up logging: in-process, under pytest's log
capture (which leaves the root logger at WARNING, so `sftree`'s basicConfig does nothing), as from the CLI."""

from __future__ import annotations

import logging

from helpers.explore import explore, make_root, write_config


def test_explore_log_has_info_lines_in_process_and_the_root_level_is_restored(tmp_path):
    root_logger = logging.getLogger()
    before = root_logger.level
    assert root_logger.getEffectiveLevel() > logging.INFO  # what pytest leaves: the case that lost the lines
    root = make_root(tmp_path)
    search = {
        "root_children": 1,
        "max_children": 1,
        "max_depth": 1,
        "max_valid_edges": 1,
        "parallel_width": 1,
    }
    out = tmp_path / "tree"
    assert explore(root, out, write_config(tmp_path, search)) == 0
    log = (out / "explore.log").read_text()
    assert " INFO sftree.teacher.client: teacher ready at " in log
    assert (
        " INFO sftree.search.explore: new tree for circle_packing/" in log
        and " INFO sftree.search.mcts: " in log
    )
    assert root_logger.level == before
