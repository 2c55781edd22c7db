"""Placement on the real apiserver: spreads by count, skips unusable shards, reports NoCapacity."""

from __future__ import annotations

from collections import Counter

from reconciler.resources import SHARDS
from tests.reconciler.conftest import condition
from tests.support.common import wait_for


def _wait_ready(fleet, *names: str) -> None:
    for name in names:
        wait_for(
            lambda name=name: (c := condition(fleet.get_shard(name), "Ready")) and c["status"] == "True",
            what=f"shard {name} Ready",
        )


def test_spreads_by_count_and_skips_draining_unready_and_full(postgres_pool, fleet, start_manager, admin_rest):
    pg = postgres_pool.get("18")
    a = fleet.shard(pg, max_databases=10)
    b = fleet.shard(pg, max_databases=10)
    full = fleet.shard(pg, max_databases=1)
    draining = fleet.shard(pg, accepting=False)
    fleet.shard(pg, password="wrong")  # never Ready
    start_manager()
    _wait_ready(fleet, a, b, full, draining)
    # One at a time (a burst may overshoot a soft limit by up to the worker count, see the docs).
    placements = Counter()
    for i in range(7):
        name = fleet.database(f"spread-{i}")
        placements[fleet.wait_phase(name, "Ready")["status"]["shard"]] += 1
    # Fewest databases first, ties to the smallest name; draining, not-Ready and full shards are skipped.
    assert placements == {a: 3, b: 3, full: 1}


def test_no_capacity_fails_and_places_once_a_shard_fits(postgres_pool, fleet, start_manager, admin_rest):
    pg = postgres_pool.get("16")
    shard = fleet.shard(pg, max_databases=1, accepting=False)
    start_manager()
    _wait_ready(fleet, shard)
    name = fleet.database("no-room")
    db = fleet.wait_phase(name, "Failed")
    ready = condition(db, "Ready")
    assert ready["reason"] == "NoCapacity" and ready["status"] == "False"
    assert not db["status"].get("shard")
    # A Shard change (draining ends) brings unplaced databases back at once, not only every 5 minutes.
    admin_rest.patch(SHARDS, shard, {"spec": {"accepting": True}})
    assert fleet.wait_phase(name, "Ready")["status"]["shard"] == shard
