"""Keldon coordinator failover and scaling: SQL waits and is retried, never failed for good, and
resumes by itself once the DatabaseCluster is Running again; existing databases keep working."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from domain.resources import DATABASES, SHARDS
from harness import PostgresServer
from reconciler.fleet_metrics import FleetCollector
from tests.cloudberry.conftest import NAMESPACE, RUNNING, Fleet, condition, tenant_connection
from tests.support.common import wait_for
from tests.support.in_process_manager import InProcessManager


def _phases_seen(manager: InProcessManager) -> list[str | None]:
    """Every Database phase the manager's cache sees from now on (watch events, in order)."""
    seen: list[str | None] = []

    def record(event_type: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None:
            seen.append((new.get("status") or {}).get("phase"))

    manager.manager.informers.informer(DATABASES, NAMESPACE).add_handler(record, replay=False)
    return seen


@contextlib.contextmanager
def pg_database_locked(server: PostgresServer) -> Iterator[None]:
    """Hold pg_database in EXCLUSIVE mode: catalog reads go on, CREATE DATABASE waits for the lock."""
    with server.superuser_connection() as su:
        su.execute("BEGIN")
        su.execute("LOCK TABLE pg_catalog.pg_database IN EXCLUSIVE MODE")
        try:
            yield
        finally:
            su.execute("ROLLBACK")


@contextlib.contextmanager
def coordinator_refusing_provisioner(server: PostgresServer) -> Iterator[None]:
    """The failover as the provisioner sees it: its sessions are cut and new ones are refused."""
    with server.superuser_connection() as su:
        su.execute(f"ALTER ROLE {server.PROVISIONER} CONNECTION LIMIT 0")
        try:
            su.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [server.PROVISIONER]
            )
            yield
        finally:
            su.execute(f"ALTER ROLE {server.PROVISIONER} CONNECTION LIMIT -1")


def _provisioner_waiting_on_lock(server: PostgresServer) -> bool:
    [(waiting,)] = server.query(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND wait_event_type = 'Lock'", [server.PROVISIONER]
    )
    return waiting > 0


def _role_exists(server: PostgresServer, role: str) -> bool:
    return bool(server.query("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]))


def test_provisioning_during_coordinator_failover_is_retried_and_completes(
    pg15: PostgresServer, fleet: Fleet, start_manager
):
    cluster, shard, manager = fleet.serving_shard(pg15, start_manager)
    phases = _phases_seen(manager)

    with pg_database_locked(pg15):
        # Placed and half provisioned: the role exists, CREATE DATABASE is in flight (waiting).
        name = fleet.database("mid-failover")
        db = fleet.wait_reason(name, "Provisioning", "Provisioning")
        assert db["status"]["shard"] == shard
        wait_for(lambda: _provisioner_waiting_on_lock(pg15), what="CREATE DATABASE to wait on the lock")
        assert _role_exists(pg15, db["status"]["tenantName"])

        fleet.set_phase(cluster, "CoordinatorFailover")
        fleet.wait_shard(shard, "ClusterNotRunning", "(phase CoordinatorFailover)")
        with coordinator_refusing_provisioner(pg15):
            db = fleet.wait_reason(name, "Provisioning", "ShardNotReady")
            assert condition(db, "Ready")["message"] == (
                f"shard {shard} is not Ready (ClusterNotRunning); waiting, the work goes on when it is Ready"
            )
            # It waits for the failover to end: no retries spent, no errors counted, still Provisioning.
            errors = manager.errors("database", "EnsureFailed")
            db = fleet.get_database(name)
            assert (db["status"]["phase"], condition(db, "Ready")["reason"]) == ("Provisioning", "ShardNotReady")
            assert manager.errors("database", "ShardNotReady") == 0
            assert manager.errors("database", "EnsureFailed") == errors

    # The promoted coordinator serves: Keldon reports Running, the provider reconnects and finishes.
    fleet.set_phase(cluster, RUNNING)
    fleet.wait_shard(shard, "Ok")
    db = fleet.wait_ready(name, timeout=30)
    assert db["status"]["shard"] == shard
    assert set(phases) <= {None, "Provisioning", "Ready"}, phases  # never Failed on the way
    with tenant_connection(pg15, fleet.credentials(name)) as conn:
        assert conn.execute("SELECT current_database() = current_user").fetchone()[0]


def test_scaling_keeps_databases_ready_and_working_and_retries_their_sql(
    pg15: PostgresServer, fleet: Fleet, start_manager
):
    cluster, shard, _ = fleet.serving_shard(pg15, start_manager)
    name = fleet.database("scaled")
    before = fleet.wait_ready(name)
    old = fleet.credentials(name)
    with tenant_connection(pg15, old) as conn:
        conn.execute("CREATE TABLE facts (v int)")
        conn.execute("INSERT INTO facts VALUES (1)")
        conn.commit()

    fleet.scale(cluster, 4)
    fleet.set_phase(cluster, "Scaling")
    fleet.wait_shard(shard, "ClusterScaling", "is Scaling")
    # The database stays Ready (its condition untouched) and its tenant keeps working.
    assert condition(fleet.get_database(name), "Ready") == condition(before, "Ready")
    with tenant_connection(pg15, old) as conn:
        conn.execute("INSERT INTO facts VALUES (2)")
        conn.commit()

    # SQL it needs meanwhile (a rotation) waits for the cluster, the phase stays Ready.
    requested = fleet.request_rotation(name)
    db = fleet.wait_reason(name, "Ready", "ShardNotReady")
    assert "(ClusterScaling)" in condition(db, "Ready")["message"]
    assert "rotationApplied" not in db["status"]
    with tenant_connection(pg15, old) as conn:  # the role was not touched yet
        conn.execute("SELECT 1")

    fleet.set_phase(cluster, RUNNING)
    fleet.wait_shard(shard, "Ok")
    db = fleet.wait_database(
        name,
        lambda d: condition(d, "Ready")["status"] == "True" and d["status"].get("rotationApplied") == requested,
        timeout=30,
        what="the rotation to be applied",
    )
    assert condition(db, "Ready")["reason"] == "Provisioned"
    new = fleet.credentials(name)
    assert new["password"] != old["password"]
    with tenant_connection(pg15, new) as conn:
        assert conn.execute("SELECT count(*) FROM facts").fetchone()[0] == 2
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        tenant_connection(pg15, old)
    wait_for(lambda: fleet.get_shard(shard)["status"].get("databaseCount") == 1, what="databaseCount 1")


def test_fleet_metrics_cover_the_cloudberry_shard(pg15: PostgresServer, fleet: Fleet, start_manager):
    cluster = fleet.cluster(RUNNING)
    shard = fleet.cloudberry_shard(pg15, cluster, max_databases=7)
    manager = start_manager()
    informers = manager.manager.informers
    registry = CollectorRegistry()
    registry.register(FleetCollector(informers.informer(SHARDS).list, informers.informer(DATABASES, NAMESPACE).list))

    def sample(metric: str, **labels: str) -> float | None:
        """The sum of the samples whose labels include these (the reason label is left open)."""
        wanted = {"shard": shard, **labels}
        values = [
            s.value
            for family in registry.collect()
            for s in family.samples
            if s.name == metric and wanted.items() <= s.labels.items()
        ]
        return sum(values) if values else None

    fleet.wait_shard(shard, "Ok")
    fleet.wait_ready(fleet.database("measured"))
    wait_for(lambda: sample("dbprovider_shard_ready") == 1.0, what="shard_ready 1")
    wait_for(lambda: sample("dbprovider_shard_databases") == 1.0, what="shard_databases 1")
    assert sample("dbprovider_shard_max_databases") == 7.0

    fleet.set_phase(cluster, "CoordinatorFailover")
    wait_for(lambda: sample("dbprovider_shard_ready") == 0.0, what="shard_ready 0 during failover")
    assert sample("dbprovider_databases", phase="Ready") == 1.0  # the database itself is unaffected
    assert sample("dbprovider_shard_databases") == 1.0

    fleet.set_phase(cluster, RUNNING)
    wait_for(lambda: sample("dbprovider_shard_ready") == 1.0, what="shard_ready 1 after failover")
