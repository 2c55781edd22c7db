"""Every documented failure reason (docs/operations.md), caused for real, with the Warning Event it promises.

Each test causes its failure the way it happens on a fleet: a name on the shard taken by someone
else, a Secret in the way, an operator's open transaction holding the tenant role, a DBA session
left on the tenant's database, a wrong admin password, a deleted Shard, a changed install config.
It asserts what an operator sees: the condition's reason, a Warning Event with that reason whose
message is the condition's sanitized message (no password, no SQL, no driver text), the error
metric, and the recovery once the cause is gone. Real kube-apiserver and PostgreSQL 18, and 15
where the pre-16 dialect runs other statements (membership grants on create and drop).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from domain.constants import ANNOTATION_DELETE_REQUESTED_AT, ANNOTATION_ROTATE_REQUESTED_AT, FINALIZER_TENANT
from domain.resources import DATABASES, SHARDS
from harness import PostgresServer
from informers import SECRETS, Rest
from tests.reconciler.causes import foreign_database, retry_now, tenant_of, wait_reason
from tests.reconciler.conftest import (
    NAMESPACE,
    SHARD_SECRETS_NAMESPACE,
    condition,
    controller_parts,
    install_config,
    provisioner_statements,
    secret_data,
    tenant_sql,
)
from tests.support.common import b64, now_stamp, wait_for
from tests.support.postgres import PG_FLAVORS, PostgresPool, drop_as_superuser, login_role, tenant_exists

DIALECT_FLAVORS = [f for f in ("18", "15") if f in PG_FLAVORS]
KEEP = "rectest.example.com/keep"  # another party's finalizer: keeps a finished Database readable
# What a sanitized message never carries: SQL text, driver text, password material.
NOT_IN_MESSAGES = (
    "SELECT ",
    "CREATE ROLE",
    "ALTER ROLE",
    "CREATE DATABASE",
    "ALTER DATABASE",
    "DROP DATABASE",
    "DROP ROLE",
    "GRANT ",
    "REVOKE ",
    "PASSWORD",
    "SCRAM-SHA-256",
    "ERROR",
    "canceling statement",
    "being accessed by other users",
)


@pytest.fixture(params=DIALECT_FLAVORS, ids=[f"pg{f}" for f in DIALECT_FLAVORS])
def dialect_pg(request: pytest.FixtureRequest, postgres_pool: PostgresPool) -> PostgresServer:
    """PostgreSQL 18 and 15: the two SQL dialects (GRANT ... WITH SET from 16 on, plain GRANT before)."""
    return postgres_pool.get(request.param)


@pytest.fixture
def pg18(postgres_pool: PostgresPool) -> PostgresServer:
    return postgres_pool.get("18")


@pytest.fixture
def tenants() -> Iterator[list[tuple[PostgresServer, str]]]:
    """Tenants a test made on a shard; dropped afterwards (the fleet cleanup removes only objects)."""
    made: list[tuple[PostgresServer, str]] = []
    yield made
    for server, name in made:
        drop_as_superuser(server, name)


# -- what the operator sees ------------------------------------------------------------------------


def event_about(admin_rest: Rest, db: dict[str, Any], reason: str, timeout: float = 30) -> dict[str, Any]:
    """The Event of `reason` about this Database object (Events are sent in the background)."""
    uid = db["metadata"]["uid"]

    def probe() -> dict[str, Any] | None:
        items = admin_rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
        found = [e for e in items if e["involvedObject"].get("uid") == uid and e["reason"] == reason]
        return found[0] if found else None

    return wait_for(probe, timeout=timeout, what=f"a {reason} event on {db['metadata']['name']}")


def events_of(admin_rest: Rest, db: dict[str, Any], type_: str) -> list[dict[str, Any]]:
    items = admin_rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    return [e for e in items if e["involvedObject"].get("uid") == db["metadata"]["uid"] and e["type"] == type_]


def assert_warning(admin_rest: Rest, db: dict[str, Any], cond: dict[str, Any], *secrets: str) -> dict[str, Any]:
    """A Warning Event: reason = the condition's reason, message = its sanitized message + who."""
    event = event_about(admin_rest, db, cond["reason"])
    assert event["type"] == "Warning"
    message = event["message"]
    assert message.startswith(cond["message"] + " (")
    spec = db["spec"]
    assert f"consumer={spec['consumer']} externalId={spec['externalId']} shard=" in message
    for text in NOT_IN_MESSAGES:
        assert text not in message, message
    for secret in secrets:
        assert secret not in message and secret not in cond["message"]
    return event


def password_of(admin_rest: Rest, name: str) -> str:
    return secret_data(admin_rest, f"{name}-credentials")["password"]


def keep_object(admin_rest: Rest, name: str) -> None:
    """Add another party's finalizer, so the object (and its status) stays after the provider is done."""
    db = admin_rest.get(DATABASES, name, NAMESPACE)
    finalizers = [*(db["metadata"].get("finalizers") or []), KEEP]
    admin_rest.patch(DATABASES, name, {"metadata": {"finalizers": finalizers}}, NAMESPACE)


@contextmanager
def role_locked(server: PostgresServer, role: str) -> Iterator[None]:
    """An operator's open transaction that altered the role: every other ALTER ROLE of it waits."""
    conn = server.superuser_connection()
    conn.autocommit = False
    try:
        conn.execute(sql.SQL("ALTER ROLE {} VALID UNTIL 'infinity'").format(sql.Identifier(role)))
        yield
    finally:
        conn.rollback()
        conn.close()


# -- create ----------------------------------------------------------------------------------------


def test_ensure_failed_when_a_foreign_database_has_the_tenant_name(
    dialect_pg, fleet, start_manager, admin_rest, tenants
):
    fleet.shard(dialect_pg)
    name = fleet.database(f"taken{dialect_pg.major}")
    tenant = tenant_of(admin_rest, name)
    tenants.append((dialect_pg, tenant))
    with foreign_database(dialect_pg, tenant) as owner:
        manager = start_manager()
        db = wait_reason(fleet, name, "EnsureFailed")
        ready = condition(db, "Ready")
        assert (ready["status"], db["status"]["phase"]) == ("False", "Provisioning")
        assert ready["message"] == (
            "create failed: name_taken (a database of this name exists and is not owned by the tenant role)"
        )
        assert_warning(admin_rest, db, ready, password_of(admin_rest, name), dialect_pg.provisioner_password)
        assert manager.errors("database", "EnsureFailed") >= 1
        row = dialect_pg.query("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s", (tenant,))
        assert row == [(owner,)]  # neither taken over nor dropped

    # The operator removes the foreign database. name_taken is terminal (no retry with backoff): the
    # next change of the Database (here an annotation), of its Shard, or the 5-minute requeue finishes it.
    retry_now(admin_rest, name)
    fleet.wait_phase(name, "Ready", timeout=90)
    creds = secret_data(admin_rest, f"{name}-credentials")
    with dialect_pg.connect(creds["user"], creds["password"], creds["database"]) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == (tenant,)


def test_ensure_failed_when_a_foreign_role_has_the_tenant_name(pg18, fleet, start_manager, admin_rest, tenants):
    """From PostgreSQL 16 on the provisioner may alter only roles it created. (Before 16 CREATEROLE
    can alter any non-superuser role: the Shard says so with WeakRoleIsolation.)"""
    fleet.shard(pg18)
    name = fleet.database("role-taken")
    tenant = tenant_of(admin_rest, name)
    tenants.append((pg18, tenant))
    with pg18.superuser_connection() as su:
        su.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 1").format(sql.Identifier(tenant)))

    start_manager()
    db = wait_reason(fleet, name, "EnsureFailed")
    ready = condition(db, "Ready")
    assert ready["message"] == (
        "create failed: name_taken (a role of this name exists that the provider did not make: the provisioner "
        "does not hold ADMIN on the role, so it did not create it)"
    )
    assert_warning(admin_rest, db, ready, password_of(admin_rest, name), pg18.provisioner_password)
    row = pg18.query("SELECT rolconnlimit FROM pg_roles WHERE rolname = %s", (tenant,))
    assert row == [(1,)] and tenant_exists(pg18, tenant) == (True, False)  # the foreign role is untouched


# -- credentials -----------------------------------------------------------------------------------


def test_credentials_secret_conflict_when_a_foreign_secret_has_the_name(
    pg18, fleet, start_manager, admin_rest, tenants
):
    fleet.shard(pg18)
    name = fleet.database("secret-taken")
    tenants.append((pg18, tenant_of(admin_rest, name)))
    foreign = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{name}-credentials", "namespace": NAMESPACE},
        "data": {"password": b64("someone-elses-password")},
    }
    created = admin_rest.create(SECRETS, foreign, NAMESPACE)

    start_manager()
    db = wait_reason(fleet, name, "CredentialsSecretConflict")
    ready = condition(db, "Ready")
    assert ready["message"] == f"Secret {name}-credentials is not owned by this Database; it is never overwritten"
    assert_warning(admin_rest, db, ready, "someone-elses-password")
    after = admin_rest.get(SECRETS, f"{name}-credentials", NAMESPACE)
    assert after["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]  # never overwritten
    assert tenant_exists(pg18, db["status"]["tenantName"]) == (False, False)  # no SQL without its own Secret


def test_credentials_secret_conflict_when_the_secret_no_longer_matches(pg18, fleet, start_manager, admin_rest, tenants):
    fleet.shard(pg18)
    start_manager()
    name = fleet.database("secret-edited")
    db = fleet.wait_phase(name, "Ready")
    tenants.append((pg18, db["status"]["tenantName"]))
    password = password_of(admin_rest, name)

    # Someone edits the user key of the credentials Secret.
    admin_rest.patch(SECRETS, f"{name}-credentials", {"data": {"user": b64("someone_else")}}, NAMESPACE)
    db = wait_reason(fleet, name, "CredentialsSecretConflict")
    ready = condition(db, "Ready")
    assert ready["message"] == f"Secret {name}-credentials is inconsistent; it is never overwritten"
    assert db["status"]["phase"] == "Ready"  # the tenant itself is fine: nothing ran on the shard
    assert_warning(admin_rest, db, ready, password)
    with pg18.connect(db["status"]["tenantName"], password, db["status"]["tenantName"]) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


# -- Ready databases -------------------------------------------------------------------------------


def test_set_limit_failed_while_an_open_transaction_holds_the_role(pg18, fleet, start_manager, admin_rest, tenants):
    fleet.shard(pg18)
    manager = start_manager()
    name = fleet.database("limit-locked", size_class="small")
    tenant = fleet.wait_phase(name, "Ready")["status"]["tenantName"]
    tenants.append((pg18, tenant))

    with role_locked(pg18, tenant):
        admin_rest.patch(DATABASES, name, {"spec": {"sizeClass": "large"}}, NAMESPACE)
        db = wait_reason(fleet, name, "SetLimitFailed")  # after the admin session's lock_timeout (10 s)
        ready = condition(db, "Ready")
        assert (ready["status"], ready["message"]) == ("False", "set limit failed: lock_timeout")
        assert (db["status"]["phase"], db["status"]["appliedConnectionLimit"]) == ("Ready", 5)
        assert_warning(admin_rest, db, ready, password_of(admin_rest, name))
        assert manager.errors("database", "SetLimitFailed") >= 1

    # The transaction ends: the retry applies the new limit.
    fleet.wait_database(
        name,
        lambda d: d["status"].get("appliedConnectionLimit") == 50 and condition(d, "Ready")["status"] == "True",
        timeout=60,
    )
    assert pg18.query("SELECT rolconnlimit FROM pg_roles WHERE rolname = %s", (tenant,)) == [(50,)]


def test_a_rotation_waits_with_shard_not_ready_when_the_admin_secret_breaks(
    pg18, fleet, start_manager, admin_rest, tenants
):
    shard = fleet.shard(pg18)
    start_manager()
    name = fleet.database("admin-broken")
    db = fleet.wait_phase(name, "Ready")
    tenants.append((pg18, db["status"]["tenantName"]))

    # The admin password in the Secret is wrong (a botched rotation): the Shard is not Ready.
    admin_secret, admin_namespace = fleet.admin_secret_of(shard)
    admin_rest.patch(SECRETS, admin_secret, {"data": {"password": b64("wrong-admin-password")}}, admin_namespace)
    fleet.wait_shard(shard, "AdminAuthFailed")
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    admin_rest.patch(DATABASES, name, {"metadata": {"annotations": {ANNOTATION_ROTATE_REQUESTED_AT: stamp}}}, NAMESPACE)
    db = wait_reason(fleet, name, "ShardNotReady")
    ready = condition(db, "Ready")
    assert ready["message"] == (
        f"shard {shard} is not Ready (AdminAuthFailed); waiting, the work goes on when it is Ready"
    )
    assert db["status"]["phase"] == "Ready"  # its tenant still works with the old password
    assert_warning(admin_rest, db, ready, "wrong-admin-password", pg18.provisioner_password)

    # The admin Secret is fixed: the Shard is Ready again and the rotation is applied.
    admin_rest.patch(SECRETS, admin_secret, {"data": {"password": b64(pg18.provisioner_password)}}, admin_namespace)
    db = fleet.wait_database(name, lambda d: d["status"].get("rotationApplied") == stamp, timeout=90)
    assert condition(db, "Ready")["status"] == "True"
    creds = secret_data(admin_rest, f"{name}-credentials")
    with pg18.connect(creds["user"], creds["password"], creds["database"]) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_shard_not_found_when_the_shard_object_is_deleted(pg18, fleet, start_manager, admin_rest, tenants):
    shard = fleet.shard(pg18)
    start_manager()
    name = fleet.database("shard-gone")
    db = fleet.wait_phase(name, "Ready")
    tenants.append((pg18, db["status"]["tenantName"]))

    admin_rest.delete(SHARDS, shard)  # deletionProtection is off in this install
    db = wait_reason(fleet, name, "ShardNotFound")
    ready = condition(db, "Ready")
    assert (db["status"]["phase"], ready["message"]) == ("Failed", f"shard {shard} not found")
    assert_warning(admin_rest, db, ready, password_of(admin_rest, name))


@pytest.mark.parametrize(
    ("config", "reason", "message"),
    [
        pytest.param(
            {"sizeClasses": {"large": {"connectionLimit": 50}}},
            "UnknownSizeClass",
            "size class 'small' is no longer configured",
            id="class-removed",
        ),
        pytest.param(
            {"sizeClasses": {"small": {"connectionLimit": 7}}},
            "ConfigChanged",
            "install config resolves connection limit 7, the role has 5; change spec.sizeClass to apply a new limit",
            id="limit-changed",
        ),
    ],
)
def test_connection_limit_drift_is_reported_without_sql(
    logged_pg, fleet, start_manager, admin_rest, tenants, config, reason, message
):
    fleet.shard(logged_pg)
    manager = start_manager()
    name = fleet.database(f"drift-{reason.lower()}", size_class="small")
    tenant = fleet.wait_phase(name, "Ready")["status"]["tenantName"]
    tenants.append((logged_pg, tenant))
    manager.stop()
    before = len(provisioner_statements(logged_pg))

    start_manager(install_config(**config))  # the install config changed underneath
    db = wait_reason(fleet, name, reason, "ConnectionLimitDrift")
    drift = condition(db, "ConnectionLimitDrift")
    assert (drift["status"], drift["message"]) == ("True", message)
    assert db["status"]["phase"] == "Ready" and condition(db, "Ready")["status"] == "True"
    assert db["status"]["appliedConnectionLimit"] == 5
    assert_warning(admin_rest, db, drift, password_of(admin_rest, name))
    assert tenant_sql(provisioner_statements(logged_pg)[before:]) == []  # not even a catalog read


def test_placement_failures_are_warned(fleet, start_manager, admin_rest):
    """No shard at all (NoCapacity) and a class that is not configured (InvalidSizeClass)."""
    start_manager()
    unplaced = fleet.database("nowhere")
    invalid = fleet.database("bad-size", size_class="gigantic")
    db = wait_reason(fleet, unplaced, "NoCapacity")
    ready = condition(db, "Ready")
    assert ready["message"] == (
        "no accepting, ready postgres shard below maxDatabases with room for 10 connections; retrying every 5 minutes"
    )
    assert_warning(admin_rest, db, ready)
    db = wait_reason(fleet, invalid, "InvalidSizeClass")
    ready = condition(db, "Ready")
    assert (db["status"]["phase"], ready["message"]) == ("Failed", "size class 'gigantic' is not in sizeClasses")
    assert_warning(admin_rest, db, ready)


# -- soft delete -----------------------------------------------------------------------------------


def test_disable_failed_while_an_open_transaction_holds_the_role(pg18, fleet, start_manager, admin_rest, tenants):
    fleet.shard(pg18)
    manager = start_manager(install_config(softDelete={"retention": "1h"}))
    name = fleet.database("disable-locked")
    tenant = fleet.wait_phase(name, "Ready")["status"]["tenantName"]
    tenants.append((pg18, tenant))
    password = password_of(admin_rest, name)

    with role_locked(pg18, tenant):
        fleet.request_delete(name)
        db = wait_reason(fleet, name, "DisableFailed")
        ready = condition(db, "Ready")
        assert (db["status"]["phase"], ready["message"]) == ("Deleting", "disable failed: lock_timeout")
        assert condition(db, "TenantDisabled") is None
        assert_warning(admin_rest, db, ready, password)
        assert manager.errors("database", "DisableFailed") >= 1

    # The transaction ends: the retry disables the tenant; nothing is dropped (retention 1h).
    db = fleet.wait_database(name, lambda d: (condition(d, "TenantDisabled") or {}).get("status") == "True")
    assert condition(db, "Ready")["reason"] == "Deleting"
    with pytest.raises(psycopg.OperationalError):
        pg18.connect(tenant, password, tenant)
    assert tenant_exists(pg18, tenant) == (True, True)


def test_drop_failed_while_a_session_holds_the_database_then_tenant_dropped(
    dialect_pg, fleet, start_manager, admin_rest, tenants
):
    fleet.shard(dialect_pg)
    manager = start_manager()  # retention 0: the drop follows the disable at once
    name = fleet.database(f"drop-busy{dialect_pg.major}")
    tenant = fleet.wait_phase(name, "Ready")["status"]["tenantName"]
    tenants.append((dialect_pg, tenant))
    password = password_of(admin_rest, name)
    keep_object(admin_rest, name)

    # A DBA's session on the tenant's database: the tenant's own sessions are ended, this one is not.
    dba = dialect_pg.superuser_connection(dbname=tenant)
    try:
        fleet.request_delete(name)
        db = wait_reason(fleet, name, "DropFailed")
        ready = condition(db, "Ready")
        assert (db["status"]["phase"], ready["message"]) == ("Deleting", "drop failed: object_in_use")
        assert condition(db, "TenantDisabled")["status"] == "True"
        assert condition(db, "TenantDropped") is None
        assert_warning(admin_rest, db, ready, password, dialect_pg.provisioner_password)
        assert manager.errors("database", "DropFailed") >= 1
        assert tenant_exists(dialect_pg, tenant) == (True, True)
        assert FINALIZER_TENANT in db["metadata"]["finalizers"]  # held until the drop is done
    finally:
        dba.close()

    # The session ends: the retry drops database and role.
    db = fleet.wait_database(name, lambda d: (condition(d, "TenantDropped") or {}).get("status") == "True", 90)
    assert db["status"]["phase"] == "Deleted"
    assert tenant_exists(dialect_pg, tenant) == (False, False)
    dropped = event_about(admin_rest, db, "Dropped")
    assert dropped["type"] == "Normal"
    # Then the provider lets go: its finalizer removed, the object deleted (only KEEP still holds it).
    fleet.wait_database(
        name, lambda d: FINALIZER_TENANT not in d["metadata"]["finalizers"] and d["metadata"].get("deletionTimestamp")
    )


def test_tenant_dropped_out_of_band_completes_the_delete(pg18, fleet, start_manager, admin_rest, tenants):
    fleet.shard(pg18)
    start_manager()
    name = fleet.database("dropped-by-dba")
    db = fleet.wait_phase(name, "Ready")
    tenant = db["status"]["tenantName"]
    tenants.append((pg18, tenant))
    keep_object(admin_rest, name)
    drop_as_superuser(pg18, tenant)  # a DBA dropped the tenant by hand

    fleet.request_delete(name)
    db = fleet.wait_database(name, lambda d: (condition(d, "TenantDropped") or {}).get("status") == "True")
    assert db["status"]["phase"] == "Deleted"
    assert event_about(admin_rest, db, "Dropped")["type"] == "Normal"
    # Disable and drop found the tenant gone: nothing to fail on.
    warnings = [e["reason"] for e in events_of(admin_rest, db, "Warning")]
    assert "DisableFailed" not in warnings and "DropFailed" not in warnings


# -- the Shard -------------------------------------------------------------------------------------


def test_shard_reports_provisioner_invalid_for_a_role_without_createdb(pg18, fleet, start_manager):
    with login_role(pg18, "nocreatedb", "LOGIN CREATEROLE") as (role, password):
        listed = {"namespace": SHARD_SECRETS_NAMESPACE, "name": fleet.admin_secrets.secret(role, password)}
        shard = fleet.shard(pg18, secret_ref=listed)
        start_manager()
        ready = condition(fleet.wait_shard(shard, "ProvisionerInvalid"), "Ready")
        assert ready["status"] == "False"
        assert ready["message"] == "the provisioner role lacks CREATEDB"
        name = fleet.database("no-createdb-shard")
        # A shard that is not Ready gets no placement; the database waits (transient, not NoCapacity).
        db = wait_reason(fleet, name, "ShardsUnavailable")
        assert not db["status"].get("shard") and db["status"]["phase"] == "Provisioning"


# -- a finished delete seen through a stale cache --------------------------------------------------


def test_finishing_a_delete_that_another_replica_finished_is_no_error(fleet, provider_client, admin_rest):
    """The cache still shows a dropped Database whose removal (by the previous leader) it has not
    seen yet: removing the finalizer gets 404, which means done, not a reconcile error."""
    name = fleet.database("finished-elsewhere")
    key = f"{NAMESPACE}/{name}"
    stamp = now_stamp()
    admin_rest.patch(
        DATABASES,
        name,
        {"metadata": {"finalizers": [FINALIZER_TENANT], "annotations": {ANNOTATION_DELETE_REQUESTED_AT: stamp}}},
        NAMESPACE,
    )
    dropped = {
        "type": "TenantDropped",
        "status": "True",
        "reason": "Dropped",
        "message": "database and role dropped",
        "lastTransitionTime": stamp,
    }
    status = {"shard": "rectest-elsewhere", "tenantName": "t_elsewhere", "phase": "Deleted", "conditions": [dropped]}
    admin_rest.patch(DATABASES, name, {"status": status}, NAMESPACE, subresource="status")

    with controller_parts(provider_client) as parts:
        databases = parts.databases
        wait_for(lambda: (databases.get(key) or {}).get("status", {}).get("phase") == "Deleted", what="cached")
        databases.stop()  # the removal below never reaches this cache
        admin_rest.patch(DATABASES, name, {"metadata": {"finalizers": None}}, NAMESPACE)
        admin_rest.delete(DATABASES, name, NAMESPACE)
        wait_for(lambda: fleet.get_database(name) is None, what="the database removed")
        controller = parts.controller()

        assert controller.reconcile(key) is None  # no exception: no error counted, no retry
