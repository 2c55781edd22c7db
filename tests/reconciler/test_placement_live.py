"""Placement on the real apiserver: spreads by count, skips unusable shards, reports NoCapacity."""

from __future__ import annotations

import contextlib
import random
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes.client.exceptions import ApiException

from domain.resources import DATABASES, SHARDS
from tests.reconciler.conftest import NAMESPACE, condition, install_config
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
    # One at a time: the spread is deterministic.
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


@pytest.mark.parametrize("seed", range(3))
def test_a_burst_never_puts_a_shard_over_max_databases(seed, postgres_pool, fleet, start_manager, admin_rest):
    """More Databases at once than the shards hold, placed by eight workers at a time while another
    writer keeps changing them (so placement writes lose on 409 and are retried): no shard ends up
    over maxDatabases, and every slot is used (a refused write gives its reservation back)."""
    rng = random.Random(seed)
    pg = postgres_pool.get("18")
    limits = {fleet.shard(pg, max_databases=rng.randint(2, 5)): 0 for _ in range(3)}
    for name in limits:
        limits[name] = fleet.get_shard(name)["spec"]["maxDatabases"]
    start_manager(install_config(workersPerShard=8, workersTotal=16))
    _wait_ready(fleet, *limits)

    created: list[str] = []
    stop = threading.Event()

    def meddle() -> None:  # another writer: the controller's conditional status writes meet 409s
        while not stop.is_set():
            if created:
                name = rng.choice(created)
                with contextlib.suppress(ApiException):
                    admin_rest.patch(
                        DATABASES, name, {"metadata": {"labels": {"touched": str(rng.random())}}}, NAMESPACE
                    )

    meddler = threading.Thread(target=meddle, daemon=True)
    meddler.start()
    try:
        with ThreadPoolExecutor(12) as pool:
            for name in pool.map(lambda i: fleet.database(f"burst{seed}-{i}"), range(sum(limits.values()) + 6)):
                created.append(name)

        def settled() -> Counter[str] | None:
            placed: Counter[str] = Counter()
            for name in created:
                db = fleet.get_database(name)
                shard = (db.get("status") or {}).get("shard")
                if shard:
                    placed[shard] += 1
                elif (condition(db, "Ready") or {}).get("reason") != "NoCapacity":
                    return None
            return placed

        placed = wait_for(settled, timeout=120, what="every database placed or NoCapacity")
    finally:
        stop.set()
        meddler.join(10)
    assert placed == Counter(limits), (placed, limits)
