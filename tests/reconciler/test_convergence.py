"""A crash between any two provisioning statements converges; a Ready database runs no SQL on resync;
a client-block change rewrites Secrets without SQL; size classes, drift and resize behave as documented."""

from __future__ import annotations

import pytest

from domain.credentials import Endpoint, build_secret, new_password
from domain.naming import tenant_name
from domain.resources import DATABASES, SHARDS
from harness import PostgresServer
from informers import SECRETS
from reconciler.sql.session import AdminEndpoint, AdminSession
from reconciler.sql.tenant import PROVISIONING_STEPS, OwnerRecord, TenantSpec, read_state
from tests.reconciler.conftest import (
    NAMESPACE,
    condition,
    install_config,
    provisioner_statements,
    secret_data,
    tenant_sql,
)
from tests.support.common import b64, wait_for


@pytest.mark.parametrize("steps_done", range(len(PROVISIONING_STEPS) + 1))
def test_crash_after_any_statement_converges(postgres: PostgresServer, fleet, start_manager, admin_rest, steps_done):
    """Recreate exactly what a manager killed after `steps_done` steps leaves behind, then restart one."""
    shard = fleet.shard(postgres)
    name = fleet.database(f"crash{postgres.major}-{steps_done}")
    db = admin_rest.get(DATABASES, name, NAMESPACE)
    tenant = tenant_name(db["spec"]["externalId"], db["metadata"]["uid"])
    # The placement and the Secret were persisted before any SQL, as the manager does.
    admin_rest.patch(DATABASES, name, {"metadata": {"finalizers": ["db.bnerd.com/tenant"]}}, NAMESPACE)
    admin_rest.patch(
        DATABASES,
        name,
        {"status": {"shard": shard, "tenantName": tenant, "phase": "Provisioning"}},
        NAMESPACE,
        subresource="status",
    )
    db = admin_rest.get(DATABASES, name, NAMESPACE)
    password = new_password()
    admin_rest.create(SECRETS, build_secret(db, tenant, password, Endpoint("pg.example.com", 6432, "require")))
    endpoint = AdminEndpoint("127.0.0.1", postgres.port, postgres.PROVISIONER, postgres.provisioner_password)
    with AdminSession.for_endpoint(endpoint) as session:
        conn = session.connection()
        owner = OwnerRecord(db["spec"]["consumer"], db["metadata"]["uid"])  # in step 1, as the manager writes it
        for step in PROVISIONING_STEPS[:steps_done]:
            step(conn, TenantSpec(tenant, password, 10, owner))

    start_manager()
    fleet.wait_phase(name, "Ready")
    with postgres.superuser_connection() as su:
        roles = su.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (tenant,)).fetchone()[0]
        dbs = su.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (tenant,)).fetchone()[0]
        state = read_state(su, tenant)
    assert (roles, dbs) == (1, 1)
    assert state.provisioned
    creds = secret_data(admin_rest, f"{name}-credentials")
    assert creds["password"] == password
    with postgres.connect(creds["user"], creds["password"], creds["database"]) as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0] == tenant


def test_ready_databases_run_no_sql_on_restart_and_client_change(logged_pg, fleet, start_manager, admin_rest):
    shard = fleet.shard(logged_pg, client_host="localhost")
    manager = start_manager()
    names = [fleet.database(f"quiet-{i}") for i in range(3)]
    for name in names:
        fleet.wait_phase(name, "Ready")
    wait_for(
        lambda: all(manager.controllers.databases.settled(f"{NAMESPACE}/{name}") for name in names),
        what="the controller done with them (ownership recorded)",
    )
    manager.stop()
    before = len(provisioner_statements(logged_pg))

    # A restarted manager resyncs every Ready database: no statement reaches the shard for them, and
    # what the controller left is what the resync's fast path (reconciler/database/settled.py) takes
    # for settled, so the start hands none of them to a worker. It finds them settled while the lists
    # page in (reconciler/database/early.py), and its resync takes those verdicts.
    restarted = start_manager()
    early = restarted.controllers.databases.early
    # (The namespace may hold other tests' Databases too: at least these.)
    wait_for(lambda: early.taken >= len(names), what="the verdicts reached on the list pages taken by the resync")
    assert early.found >= len(names)
    wait_for(
        lambda: all(restarted.controllers.databases.settled(f"{NAMESPACE}/{name}") for name in names),
        what="the Ready databases recognised as settled on the caches",
    )
    admin_rest.patch(SHARDS, shard, {"spec": {"client": {"host": "10.1.2.3", "port": 5433, "sslmode": "verify-full"}}})
    for name in names:
        wait_for(
            lambda name=name: secret_data(admin_rest, f"{name}-credentials")["host"] == "10.1.2.3",
            what=f"{name} endpoint rewritten",
        )
        creds = secret_data(admin_rest, f"{name}-credentials")
        assert (creds["port"], creds["sslmode"]) == ("5433", "verify-full")
    # Only the Shard controller's periodic health check may have run: not even a catalog read
    # (those are parameterized, logged as `execute`) for a Ready database.
    after = provisioner_statements(logged_pg)[before:]
    assert tenant_sql(after) == [], after


def test_size_class_change_runs_one_alter_role_and_drift_is_reported(logged_pg, fleet, start_manager, admin_rest):
    fleet.shard(logged_pg)
    manager = start_manager()
    name = fleet.database("resize", size_class="small")
    db = fleet.wait_phase(name, "Ready")
    tenant = db["status"]["tenantName"]
    assert db["status"]["appliedConnectionLimit"] == 5

    # The operator changes spec.sizeClass: exactly one ALTER ROLE ... CONNECTION LIMIT.
    before = len(provisioner_statements(logged_pg))
    admin_rest.patch(DATABASES, name, {"spec": {"sizeClass": "large"}}, NAMESPACE)
    fleet.wait_database(name, lambda d: d["status"].get("appliedConnectionLimit") == 50)
    ddl = [s.text for s in provisioner_statements(logged_pg)[before:] if s.text.upper().startswith("ALTER ROLE")]
    assert len(ddl) == 1 and "CONNECTION LIMIT 50" in ddl[0] and "LOGIN" not in ddl[0].upper()
    assert logged_pg.query("SELECT rolconnlimit FROM pg_roles WHERE rolname = %s", (tenant,)) == [(50,)]

    # The install config changes underneath: the database stays Ready and reports drift, no SQL.
    manager.stop()
    before = len(provisioner_statements(logged_pg))
    start_manager(install_config(sizeClasses={"large": {"connectionLimit": 80}}))
    db = fleet.wait_database(name, lambda d: condition(d, "ConnectionLimitDrift") is not None)
    drift = condition(db, "ConnectionLimitDrift")
    assert (drift["status"], drift["reason"]) == ("True", "ConfigChanged")
    assert db["status"]["phase"] == "Ready"
    assert tenant_sql(provisioner_statements(logged_pg)[before:]) == []


def test_unknown_size_class_at_create_is_invalid(postgres_pool, fleet, start_manager):
    fleet.shard(postgres_pool.get("18"))
    start_manager()
    name = fleet.database("bad-class", size_class="gigantic")
    db = fleet.wait_phase(name, "Failed")
    assert condition(db, "Ready")["reason"] == "InvalidSizeClass"
    assert not db["status"].get("shard")


def test_password_never_in_status_or_events(postgres_pool, fleet, start_manager, admin_rest):
    fleet.shard(postgres_pool.get("18"))
    start_manager()
    name = fleet.database("no-leak")
    db = fleet.wait_phase(name, "Ready")
    password = secret_data(admin_rest, f"{name}-credentials")["password"]

    def our_events():
        items = admin_rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")
        reasons = {e["reason"] for e in items["items"] if e["involvedObject"]["name"] == name}
        return items if {"Created", "Ready"} <= reasons else None

    events = wait_for(our_events, what="the Created and Ready events")  # recorded just after the status
    assert password not in str(db)
    assert password not in str(events)
    assert b64(password) not in str(events)
    reasons = {e["reason"] for e in events["items"] if e["involvedObject"]["name"] == name}
    assert {"Created", "Ready"} <= reasons
    messages = [e["message"] for e in events["items"] if e["involvedObject"]["name"] == name]
    assert all("consumer=rectest-consumer" in m and "externalId=no-leak" in m for m in messages)
