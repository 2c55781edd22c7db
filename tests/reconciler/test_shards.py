"""Each Shard Ready reason comes from a real cause; databaseCount follows the Databases."""

from __future__ import annotations

import socket
import time

import pytest

from harness import PostgresServer
from informers import SECRETS
from tests.reconciler.conftest import condition, install_config


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ready(fleet, name: str, reason: str, timeout: float = 30):
    def check(shard):
        ready = condition(shard, "Ready")
        return ready is not None and ready["reason"] == reason

    from tests.support.common import wait_for

    return wait_for(lambda: (s := fleet.get_shard(name)) and check(s) and s, timeout=timeout, what=f"{name} {reason}")


@pytest.fixture
def pg16(postgres_pool) -> PostgresServer:
    return postgres_pool.get("16")


@pytest.mark.parametrize("sslmode", ["require", "disable"])  # TLS by default; disable where the install allows it
def test_healthy_shard_is_ready_ok(pg16, fleet, start_manager, sslmode):
    name = fleet.shard(pg16, sslmode=sslmode)
    start_manager(install_config(shardTLS={"cleartextShards": [name]} if sslmode == "disable" else {}))
    shard = _ready(fleet, name, "Ok")
    assert condition(shard, "Ready")["status"] == "True"
    assert condition(shard, "AdminAuthFailed")["status"] == "False"
    assert condition(shard, "Unreachable")["status"] == "False"
    assert condition(shard, "WeakRoleIsolation")["status"] == "False"
    assert shard["status"]["serverVersion"].startswith("16.")
    assert shard["status"]["databaseCount"] == 0
    assert shard["status"]["timeline"] == _timeline(pg16)


def test_checks_that_find_the_shard_as_it_was_write_nothing(pg16, fleet, start_manager):
    """The status is written back from the parsed Shard only where it changed: the checks of a healthy
    shard (every 2 s here) leave the object alone, so watchers and the apiserver see no churn."""
    name = fleet.shard(pg16)
    start_manager(install_config())
    _ready(fleet, name, "Ok")
    time.sleep(2.5)  # the check after the first: anything it still settles is written now
    before = fleet.get_shard(name)
    time.sleep(7)  # three more checks
    after = fleet.get_shard(name)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["status"] == before["status"] and condition(after, "Ready")["reason"] == "Ok"


def test_wrong_password_is_admin_auth_failed(pg16, fleet, start_manager):
    name = fleet.shard(pg16, password="not-the-password")
    start_manager()
    shard = _ready(fleet, name, "AdminAuthFailed")
    assert condition(shard, "Ready")["status"] == "False"
    assert condition(shard, "AdminAuthFailed")["status"] == "True"
    assert "not-the-password" not in str(shard)
    assert "password authentication" not in str(shard)  # a sanitized class, never driver text


def test_closed_port_is_unreachable(pg16, fleet, start_manager):
    name = fleet.shard(pg16, port=_closed_port())
    start_manager()
    shard = _ready(fleet, name, "Unreachable")
    assert condition(shard, "Unreachable")["status"] == "True"
    assert condition(shard, "Ready")["message"].endswith("failed: unreachable")


def test_deleted_secret_is_admin_secret_invalid_at_the_next_check(pg16, fleet, start_manager, admin_rest):
    name = fleet.shard(pg16)
    start_manager()
    _ready(fleet, name, "Ok")
    admin_rest.delete(SECRETS, *fleet.admin_secret_of(name))
    shard = _ready(fleet, name, "AdminSecretInvalid")
    assert "not found" in condition(shard, "Ready")["message"]


def test_secret_without_password_key_is_admin_secret_invalid(pg16, fleet, start_manager, admin_rest):
    name = fleet.shard(pg16)
    secret, namespace = fleet.admin_secret_of(name)
    admin_rest.patch(SECRETS, secret, {"data": {"password": None}}, namespace)
    start_manager()
    shard = _ready(fleet, name, "AdminSecretInvalid")
    assert "lacks key 'password'" in condition(shard, "Ready")["message"]


def test_pre16_shard_reports_weaker_role_isolation_and_refuses_inherit(postgres_pool, fleet, start_manager):
    pg15 = postgres_pool.get("15")
    name = fleet.shard(pg15)
    start_manager()
    shard = _ready(fleet, name, "Ok")
    weak = condition(shard, "WeakRoleIsolation")
    assert weak["status"] == "True" and weak["reason"] == "ServerBefore16"
    with pg15.superuser_connection() as su:
        su.execute("ALTER ROLE provisioner INHERIT")
    try:
        shard = _ready(fleet, name, "ProvisionerInherits")
        assert "NOINHERIT" in condition(shard, "Ready")["message"]
    finally:
        with pg15.superuser_connection() as su:
            su.execute("ALTER ROLE provisioner NOINHERIT")
    _ready(fleet, name, "Ok")


def test_database_count_follows_placements(pg16, fleet, start_manager):
    name = fleet.shard(pg16)
    start_manager()
    _ready(fleet, name, "Ok")
    dbs = [fleet.database(f"count-{i}") for i in range(3)]
    for db in dbs:
        fleet.wait_phase(db, "Ready")
    from tests.support.common import wait_for

    wait_for(lambda: fleet.get_shard(name)["status"].get("databaseCount") == 3, what="databaseCount 3")


def _timeline(server: PostgresServer) -> int:
    return int(server.query("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)")[0][0], 16)


def test_a_timeline_change_seen_after_a_restart_verifies_every_ready_database_once(
    pg16, fleet, start_manager, admin_rest
):
    """What a manager that restarts meets after a failover lost the last commits: the primary's timeline is
    not the one the Shard recorded. Each Ready database is verified: a tenant gone is provisioned again with
    the password its consumer has, a password the server lost is set again, and the timeline recorded."""
    from psycopg import sql

    from domain.constants import ANNOTATION_ROTATE_OVERLAP, ANNOTATION_ROTATE_REQUESTED_AT
    from domain.naming import alternate_name
    from domain.resources import DATABASES, SHARDS
    from tests.reconciler.conftest import NAMESPACE, event_reasons, wait_events
    from tests.sql.helpers import can_connect
    from tests.support.common import now_stamp, wait_for

    name = fleet.shard(pg16)
    manager = start_manager()
    timeline = _timeline(pg16)
    wait_for(
        lambda: (fleet.get_shard(name).get("status") or {}).get("timeline") == timeline, what="the timeline recorded"
    )
    kept, lost = fleet.database("timeline-kept"), fleet.database("timeline-lost")
    # Two more whose alternate login role is handed out (a rotation with a 1 s overlap, since ended).
    alt_kept, alt_lost = fleet.database("timeline-alt-kept"), fleet.database("timeline-alt-lost")
    for db in (kept, lost, alt_kept, alt_lost):
        fleet.wait_phase(db, "Ready")
    for db in (alt_kept, alt_lost):
        annotations = {ANNOTATION_ROTATE_REQUESTED_AT: (stamp := now_stamp()), ANNOTATION_ROTATE_OVERLAP: "1"}
        admin_rest.patch(DATABASES, db, {"metadata": {"annotations": annotations}}, NAMESPACE)
        fleet.wait_database(
            db,
            lambda d, s=stamp: d["status"].get("rotationApplied") == s and not d["status"].get("retireLoginAt"),
            60,
            "the rotation and its overlap's end",
        )
    manager.stop()
    creds = {db: fleet.credentials(db) for db in (kept, lost, alt_kept, alt_lost)}
    assert creds[alt_kept]["user"] != creds[alt_kept]["database"]  # the alternate is handed out
    with pg16.superuser_connection() as su:  # as the promoted replica would lack them
        for gone in (lost, alt_lost):
            tenant = creds[gone]["database"]
            su.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(tenant)))
            su.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(alternate_name(tenant))))
            su.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(tenant)))
        for rotated in (kept, alt_kept):
            su.execute(sql.SQL("ALTER ROLE {} PASSWORD 'lost-rotation'").format(sql.Identifier(creds[rotated]["user"])))
    admin_rest.patch(SHARDS, name, {"status": {"timeline": timeline + 1}}, subresource="status")

    start_manager()
    wait_for(
        lambda: (fleet.get_shard(name).get("status") or {}).get("timeline") == timeline, 60, "the timeline verified"
    )
    for db, login in creds.items():
        assert fleet.credentials(db) == login
        assert fleet.get_database(db)["status"]["phase"] == "Ready"
        with pg16.connect(login["user"], login["password"], login["database"]) as conn:
            assert conn.execute("SELECT session_user").fetchone() == (login["user"],)
    for db in (alt_kept, alt_lost):  # the tenant role itself stays retired
        assert not can_connect(pg16, creds[db]["database"], creds[db]["password"], creds[db]["database"])
    wait_events(admin_rest, lost, {"TenantRecreated"})
    wait_events(admin_rest, alt_lost, {"TenantRecreated"})
    assert "TenantRecreated" not in event_reasons(admin_rest, kept)
    assert "TenantRecreated" not in event_reasons(admin_rest, alt_kept)


def test_a_timeline_change_repeats_the_soft_deletes_and_drops_a_failover_lost(pg16, fleet, start_manager, admin_rest):
    """A failover may also lose a soft delete's disable, a recovery's enable or a drop. After a new timeline
    the tenant of a soft-deleted database is disabled again, a recovered one enabled again, and a tenant
    dropped before the failover (its Database gone) dropped again; a tenant the Shard does not remember as
    dropped is left alone, and so is a database of a dropped tenant's name that another role owns. A
    database whose deletion is held (no SQL while held) does not hold the timeline up."""
    from datetime import UTC, datetime, timedelta

    from psycopg import sql

    from domain.constants import ANNOTATION_DELETE_REQUESTED_AT
    from domain.resources import DATABASES, SHARDS
    from domain.timefmt import format_time
    from reconciler.sql.tenant import TenantSpec, disable_tenant, drop_tenant, enable_tenant, ensure_tenant
    from tests.reconciler.conftest import NAMESPACE, event_reasons, wait_events
    from tests.sql.helpers import can_connect
    from tests.support.common import wait_for
    from tests.support.postgres import tenant_exists

    def disabled(db):
        return (condition(db, "TenantDisabled") or {}).get("status") == "True"

    config = install_config(softDelete={"retention": "1h"})
    name = fleet.shard(pg16)
    manager = start_manager(config)
    timeline = _timeline(pg16)
    wait_for(
        lambda: (fleet.get_shard(name).get("status") or {}).get("timeline") == timeline, what="the timeline recorded"
    )
    deleted, dropped, taken, recovered, held = (
        fleet.database(f"lost-{what}") for what in ("delete", "drop", "taken", "recovery", "held")
    )
    tenant = {db: fleet.wait_phase(db, "Ready")["status"]["tenantName"] for db in (deleted, dropped, taken, recovered)}
    creds = {db: fleet.credentials(db) for db in (deleted, recovered)}
    for db in (deleted, recovered):
        fleet.request_delete(db)
        fleet.wait_database(db, disabled, 60, "the tenant disabled")
    # Asked for two hours ago: their retention is over, they are dropped at once.
    long_ago = format_time(datetime.now(UTC) - timedelta(hours=2))
    for db in (dropped, taken):
        annotations = {ANNOTATION_DELETE_REQUESTED_AT: long_ago}
        admin_rest.patch(DATABASES, db, {"metadata": {"annotations": annotations}}, NAMESPACE)
        wait_for(lambda db=db: fleet.get_database(db) is None, 60, "the dropped database gone")
    admin_rest.patch(
        DATABASES, recovered, {"metadata": {"annotations": {ANNOTATION_DELETE_REQUESTED_AT: None}}}, NAMESPACE
    )
    fleet.wait_phase(recovered, "Ready")
    fleet.wait_phase(held, "Ready")
    admin_rest.delete(DATABASES, held, NAMESPACE)  # without the delete annotation: held
    fleet.wait_database(held, lambda d: (condition(d, "DeletionHeld") or {}).get("status") == "True")
    remembered = (fleet.get_shard(name).get("status") or {}).get("droppedTenants") or []
    assert [entry["name"] for entry in remembered] == [tenant[dropped], tenant[taken]]
    manager.stop()

    unrelated = TenantSpec(name=f"t_unrelated_{name.replace('-', '_')[-20:]}", password="unrelated", connection_limit=2)
    with pg16.provisioner_connection() as conn:  # the new primary as the failover left it
        enable_tenant(conn, tenant[deleted])  # the disable lost
        disable_tenant(conn, tenant[recovered])  # the recovery lost
        ensure_tenant(conn, TenantSpec(name=tenant[dropped], password="orphan", connection_limit=2))  # the drop
        ensure_tenant(conn, unrelated)  # not remembered as dropped: never the provider's to drop
    with pg16.superuser_connection() as su:  # somebody else's database under a dropped tenant's name
        su.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(*map(sql.Identifier, (tenant[taken], unrelated.name))))
    try:
        assert can_connect(pg16, tenant[deleted], creds[deleted]["password"], tenant[deleted])
        admin_rest.patch(SHARDS, name, {"status": {"timeline": timeline + 1}}, subresource="status")

        start_manager(config)
        wait_for(
            lambda: (fleet.get_shard(name).get("status") or {}).get("timeline") == timeline,
            60,
            "the timeline verified",
        )
        assert not can_connect(pg16, tenant[deleted], creds[deleted]["password"], tenant[deleted])
        assert tenant_exists(pg16, tenant[deleted]) == (True, True)  # disabled, kept for its retention
        assert tenant_exists(pg16, tenant[dropped]) == (False, False)
        assert tenant_exists(pg16, unrelated.name) == (True, True)
        assert tenant_exists(pg16, tenant[taken]) == (False, True)
        login = creds[recovered]
        with pg16.connect(login["user"], login["password"], login["database"]) as conn:
            assert conn.execute("SELECT session_user").fetchone() == (login["user"],)
        wait_events(admin_rest, deleted, {"TenantDisabledAgain"})
        wait_events(admin_rest, recovered, {"TenantEnabledAgain"})
        assert "TenantRecreated" not in event_reasons(admin_rest, recovered)
    finally:
        with pg16.superuser_connection() as su:
            su.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(tenant[taken])))
        with pg16.provisioner_connection() as conn:
            drop_tenant(conn, unrelated.name)


def test_a_drop_is_remembered_on_the_shard_for_remember_drops_only(pg16, fleet, start_manager):
    """The record of a drop (the tenant's name and the time, nothing secret) goes from the Shard's status
    once softDelete.rememberDrops has passed."""
    from tests.support.common import wait_for

    name = fleet.shard(pg16)
    start_manager(install_config(softDelete={"retention": "0", "rememberDrops": "8s"}), shard_ping_interval=1.0)
    db = fleet.database("remembered")
    tenant = fleet.wait_phase(db, "Ready")["status"]["tenantName"]

    def remembered() -> list[dict[str, str]]:
        return (fleet.get_shard(name).get("status") or {}).get("droppedTenants") or []

    fleet.request_delete(db)
    entries = wait_for(remembered, 30, "the drop remembered")
    assert [sorted(entry) for entry in entries] == [["droppedAt", "name"]] and entries[0]["name"] == tenant
    wait_for(lambda: fleet.get_database(db) is None, 30, "the database dropped")
    wait_for(lambda: not remembered(), 30, "the drop forgotten")
