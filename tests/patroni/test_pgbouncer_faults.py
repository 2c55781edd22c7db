"""pgBouncer paused and restarted in front of a healthy Patroni shard: the Databases already Ready keep
their phase (the server is fine; the provider never goes through pgBouncer for its own SQL), a new one
waits in Provisioning with the Ready login's real cause (LoginFailed), and turns Ready once pgBouncer
serves again."""

from __future__ import annotations

import pytest

from harness.patroni import PatroniShard
from tests.patroni.conftest import Fleet
from tests.support.common import condition

pytestmark = pytest.mark.server


def test_pgbouncer_paused_then_restarted(patroni18: PatroniShard, fleet: Fleet, start_manager) -> None:
    cluster = patroni18
    assert cluster.pgbouncer is not None
    shard = fleet.patroni_shard(cluster)
    start_manager()
    ready = fleet.database("before")
    fleet.wait_phase(ready, "Ready", timeout=120)

    with cluster.paused_pgbouncer():
        waiting = fleet.database("while-paused")
        db = fleet.wait_reason(waiting, "Provisioning", "LoginFailed", timeout=120)
        assert "(client endpoint) did not log in" in condition(db, "Ready")["message"]
        assert fleet.get_database(ready)["status"]["phase"] == "Ready"  # type: ignore[index]
        fleet.wait_shard(shard, "Ok")  # the shard itself is fine: its admin endpoint is the primary
    fleet.wait_phase(waiting, "Ready", timeout=120)

    cluster.pgbouncer.stop()
    try:
        stopped = fleet.database("while-stopped")
        db = fleet.wait_reason(stopped, "Provisioning", "LoginFailed", timeout=120)
        assert condition(db, "Ready")["message"].startswith("login failed: unreachable")
        assert fleet.get_database(ready)["status"]["phase"] == "Ready"  # type: ignore[index]
    finally:
        cluster.pgbouncer.start()
    fleet.wait_phase(stopped, "Ready", timeout=120)
