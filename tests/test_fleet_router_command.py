"""The router's command line and the check that it is installed, without starting anything (the fleet itself, a
router over workers, is the `router` tier's: tests/test_fleet_router.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sftree.teacher.fleet import ROUTERS, router_command, router_missing


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_a_missing_router_is_named_with_its_install_script(tmp_path, router):
    why = router_missing(router, tmp_path / router)
    assert why is not None and str(tmp_path / router) in why and ROUTERS[router][1] in why


def test_an_unknown_router_is_refused_by_name():
    assert "'nginx'" in (router_missing("nginx") or "")


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_router_command_names_its_workers_policy_and_metrics_port(router):
    cmd = router_command(8000, ["http://127.0.0.1:1", "http://127.0.0.1:2"], "cache_aware", router=router,
                         binary=Path(f"/x/{router}"), metrics_port=9100)  # fmt: skip
    assert cmd[:2] == [f"/x/{router}", "launch"]
    i = cmd.index("--worker-urls")
    assert cmd[i + 1 : i + 3] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert (
        cmd[cmd.index("--policy") + 1] == "cache_aware" and cmd[cmd.index("--prometheus-port") + 1] == "9100"
    )
