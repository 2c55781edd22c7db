"""Placement on cloudberry shards: paused while the Keldon cluster is not Running, never across engines."""

from __future__ import annotations

import pytest

from harness import PostgresServer
from tests.cloudberry.conftest import RUNNING, Fleet, condition
from tests.support.common import wait_for


def _unplaced_no_capacity(fleet: Fleet, name: str, engine: str) -> None:
    db = fleet.wait_reason(name, "Failed", "NoCapacity")
    assert not db["status"].get("shard")
    assert not db["status"].get("tenantName")  # nothing was chosen, no SQL ran
    assert f"no accepting, ready {engine} shard" in condition(db, "Ready")["message"]


def _unplaced_waiting(fleet: Fleet, name: str, engine: str) -> None:
    """Only not-Ready shards: a transient wait (Provisioning/ShardsUnavailable), not NoCapacity."""
    db = fleet.wait_reason(name, "Provisioning", "ShardsUnavailable")
    assert not db["status"].get("shard")
    assert not db["status"].get("tenantName")  # nothing was chosen, no SQL ran
    assert f"no {engine} shard usable right now" in condition(db, "Ready")["message"]


@pytest.mark.parametrize("phase", ["Pending", "Initializing", "Scaling", "CoordinatorFailover", "Recovering", "Failed"])
def test_placement_pauses_while_not_running_and_resumes(pg15: PostgresServer, fleet: Fleet, start_manager, phase):
    cluster = fleet.cluster(phase)
    shard = fleet.cloudberry_shard(pg15, cluster)
    start_manager()
    if phase == "Scaling":
        fleet.wait_shard(shard, "ClusterScaling", "is Scaling")
    else:
        fleet.wait_shard(shard, "ClusterNotRunning", f"(phase {phase})")

    waiting = fleet.database("waiting")
    _unplaced_waiting(fleet, waiting, "cloudberry")

    # Running again: the Shard turns Ready and the unplaced database is placed at once (not after 5 min).
    fleet.set_phase(cluster, RUNNING)
    fleet.wait_shard(shard, "Ok")
    assert fleet.wait_ready(waiting, timeout=30)["status"]["shard"] == shard


def test_scaling_stops_new_placements_only(pg15: PostgresServer, fleet: Fleet, start_manager):
    """Keldon scaling (Running -> Scaling -> Running): placement pauses with a reason of its own (not
    an outage: ClusterScaling, which the critical alert leaves alone), the Scaling condition records
    since when, new databases wait, existing ones stay Ready."""
    cluster, shard, _ = fleet.serving_shard(pg15, start_manager)
    before = fleet.wait_ready(fleet.database("before"))
    assert condition(fleet.get_shard(shard), "Scaling")["status"] == "False"

    fleet.scale(cluster, 4)
    fleet.set_phase(cluster, "Scaling")
    ready = condition(fleet.wait_shard(shard, "ClusterScaling", "is Scaling"), "Ready")
    assert ready["status"] == "False"
    assert "no new databases are placed" in ready["message"] and "keep working" in ready["message"]
    scaling = condition(fleet.get_shard(shard), "Scaling")
    assert (scaling["status"], scaling["reason"]) == ("True", "ClusterScaling")
    during = fleet.database("during")
    _unplaced_waiting(fleet, during, "cloudberry")
    still = fleet.get_database(before["metadata"]["name"])
    assert condition(still, "Ready") == condition(before, "Ready")  # untouched, not even re-stamped

    # Scaling goes on: the condition keeps its start (what dbprovider_shard_scaling_seconds counts from).
    fleet.scale(cluster, 6)
    wait_for(lambda: fleet.get_shard(shard)["metadata"]["generation"] >= 1, what="the shard seen again")
    assert condition(fleet.get_shard(shard), "Scaling")["lastTransitionTime"] == scaling["lastTransitionTime"]

    fleet.set_phase(cluster, RUNNING)
    assert fleet.wait_ready(during, timeout=30)["status"]["shard"] == shard
    wait_for(lambda: fleet.get_shard(shard)["status"].get("databaseCount") == 2, what="databaseCount 2")
    assert condition(fleet.get_shard(shard), "Scaling")["status"] == "False"


def test_engines_never_mix(pg15: PostgresServer, fleet: Fleet, start_manager):
    """Each database goes to a shard of its engine even where the other shard has fewer databases."""
    # Same server behind both shards: only the Shard objects decide. The postgres shard sorts first.
    postgres = fleet.shard(pg15, name=f"cbtest-a-pg-{fleet.suffix}")
    cluster = fleet.cluster(RUNNING)
    cloudberry = fleet.cloudberry_shard(pg15, cluster, name=f"cbtest-b-cb-{fleet.suffix}", client_host="localhost")
    start_manager()
    fleet.wait_shard(postgres, "Ok")
    fleet.wait_shard(cloudberry, "Ok")

    placed = []
    # pg-2 would go to the emptier cloudberry shard and cb-3 to the tie-winning postgres shard if
    # placement ignored the engine.
    for external_id, engine in [
        ("pg-1", "postgres"),
        ("pg-2", "postgres"),
        ("cb-1", "cloudberry"),
        ("cb-2", "cloudberry"),
        ("cb-3", "cloudberry"),
    ]:
        db = fleet.wait_ready(fleet.database(external_id, engine=engine))
        placed.append((external_id, db["status"]["shard"]))
    assert placed == [
        ("pg-1", postgres),
        ("pg-2", postgres),
        ("cb-1", cloudberry),
        ("cb-2", cloudberry),
        ("cb-3", cloudberry),
    ]
    assert fleet.credentials(fleet.databases[2])["host"] == "localhost"  # the cloudberry shard's client block


def test_cloudberry_database_with_only_postgres_shards_is_no_capacity(pg15, fleet: Fleet, start_manager):
    postgres = fleet.shard(pg15)
    start_manager()
    fleet.wait_shard(postgres, "Ok")
    _unplaced_no_capacity(fleet, fleet.database("analytics"), "cloudberry")
    assert fleet.wait_ready(fleet.database("orders", engine="postgres"))["status"]["shard"] == postgres
    wait_for(lambda: fleet.get_shard(postgres)["status"].get("databaseCount") == 1, what="databaseCount 1")


def test_postgres_database_with_only_cloudberry_shards_is_no_capacity(pg15, fleet: Fleet, start_manager):
    cloudberry = fleet.cloudberry_shard(pg15, fleet.cluster(RUNNING))
    start_manager()
    fleet.wait_shard(cloudberry, "Ok")
    _unplaced_no_capacity(fleet, fleet.database("orders", engine="postgres"), "postgres")
    assert fleet.wait_ready(fleet.database("analytics"))["status"]["shard"] == cloudberry
