"""The router's command line and the check that it is installed, without starting anything (the fleet itself, a
router over workers, is the `router` tier's: tests/test_fleet_router.py)."""

from __future__ import annotations

from pathlib import Path

from sftree.teacher.fleet import router_command, router_missing


def test_a_missing_router_is_named_with_its_install_script(tmp_path):
    why = router_missing(tmp_path / "sglang-router")
    assert why is not None and str(tmp_path / "sglang-router") in why and "install_router.sh" in why


def test_router_command_names_its_workers_policy_and_metrics_port():
    cmd = router_command(8000, ["http://127.0.0.1:1", "http://127.0.0.1:2"], "cache_aware",
                         binary=Path("/x/sglang-router"), metrics_port=9100)  # fmt: skip
    assert cmd[:2] == ["/x/sglang-router", "launch"]
    i = cmd.index("--worker-urls")
    assert cmd[i + 1 : i + 3] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert (
        cmd[cmd.index("--policy") + 1] == "cache_aware" and cmd[cmd.index("--prometheus-port") + 1] == "9100"
    )
