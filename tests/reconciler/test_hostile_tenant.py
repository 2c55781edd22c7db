"""A hostile tenant against the running controllers: it cannot block another consumer's
create, nor its own disable and drop; a restore cannot adopt another consumer's or a live Database's
tenant; a rotation can end the sessions opened with the old password."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from kubernetes.client.exceptions import ApiException
from psycopg import sql

from domain.constants import ANNOTATION_ROTATE_END_SESSIONS, ANNOTATION_ROTATE_REQUESTED_AT
from domain.resources import DATABASES
from harness import PostgresServer
from informers import SECRETS
from tests.reconciler.conftest import NAMESPACE, install_config, provisioner_statements, secret_data, wait_events
from tests.support.common import condition, wait_for
from tests.support.postgres import is_alive, tenant_exists


def _creds(admin_rest, name: str) -> dict[str, str]:
    return secret_data(admin_rest, f"{name}-credentials")


@contextmanager
def _tenant_session(postgres: PostgresServer, creds: dict[str, str], dbname: str) -> Iterator[psycopg.Connection]:
    conn = postgres.connect(creds["user"], creds["password"], dbname)
    try:
        yield conn
    finally:
        conn.close()


def test_a_tenant_idle_on_template1_does_not_stop_another_consumers_create(postgres, fleet, start_manager, admin_rest):
    fleet.shard(postgres)
    start_manager()
    first = fleet.database(f"tmpl-a{postgres.major}", consumer="rectest-consumer")
    fleet.wait_phase(first, "Ready")
    with postgres.unprepared(), _tenant_session(postgres, _creds(admin_rest, first), "template1") as idle:
        assert idle.execute("SELECT current_database()").fetchone() == ("template1",)

        second = fleet.database(f"tmpl-b{postgres.major}", consumer="rectest-other")

        db = fleet.wait_phase(second, "Ready", timeout=60)
        assert condition(db, "Ready")["status"] == "True"
        assert is_alive(idle)
    creds = _creds(admin_rest, second)
    with postgres.connect(creds["user"], creds["password"], creds["database"]) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (creds["user"],)


def _hold_role(conn: psycopg.Connection, creds: dict[str, str]) -> None:
    """The issue's attack: `BEGIN; ALTER ROLE <self> PASSWORD '<same>';` left open."""
    role, password = sql.Identifier(creds["user"]), sql.Literal(creds["password"])
    conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(role, password))


def _hold_database(conn: psycopg.Connection, creds: dict[str, str]) -> None:
    """An open transaction on the tenant's own database row, from inside that database."""
    conn.execute(sql.SQL("ALTER DATABASE {} CONNECTION LIMIT 3").format(sql.Identifier(creds["database"])))
    conn.execute("CREATE TABLE held (v int)")
    conn.execute("LOCK TABLE held IN ACCESS EXCLUSIVE MODE")


@pytest.mark.parametrize("hold", [_hold_role, _hold_database], ids=["role-lock", "database-lock"])
def test_a_tenant_holding_locks_cannot_stop_its_disable_or_drop(postgres, fleet, start_manager, admin_rest, hold):
    fleet.shard(postgres)
    manager = start_manager(install_config(softDelete={"retention": "4s"}))
    name = fleet.database(f"lock-{hold.__name__[6:]}{postgres.major}")
    tenant = fleet.wait_phase(name, "Ready")["status"]["tenantName"]
    creds = _creds(admin_rest, name)
    with _tenant_session(postgres, creds, creds["database"]) as held:
        hold(held, creds)  # not committed: the lock stays held while the session lives

        fleet.request_delete(name)

        db = fleet.wait_database(
            name, lambda d: (c := condition(d, "TenantDisabled")) is not None and c["status"] == "True", timeout=60
        )
        assert db["status"]["phase"] == "Deleting"
        assert not is_alive(held)
    wait_for(lambda: fleet.get_database(name) is None, timeout=60, what=f"{name} dropped and removed")
    assert tenant_exists(postgres, tenant) == (False, False)
    wait_events(admin_rest, name, {"Disabled", "Dropped"})
    assert manager.errors("database", "DisableFailed") == 0
    assert manager.errors("database", "DropFailed") == 0


# -- restore-tenant --------------------------------------------------------------------------------


def _refused(fleet, name: str) -> dict:
    return fleet.wait_database(
        name,
        lambda d: (
            (d.get("status") or {}).get("phase") == "Failed"
            and (condition(d, "Ready") or {}).get("reason") == "RestoreRefused"
        ),
        what=f"{name} refused",
    )


def _tenant_writes(logged_pg: PostgresServer, before: int, tenant: str) -> list[str]:
    """Statements of the provisioner since `before` that changed something about the tenant."""
    return [
        s.text
        for s in provisioner_statements(logged_pg)[before:]
        if s.mentions(tenant) and s.keyword not in ("SELECT", "BEGIN", "ROLLBACK")
    ]


@pytest.mark.parametrize("victim_state", ["live", "released"])
def test_restore_refuses_another_consumers_tenant(logged_pg, fleet, start_manager, admin_rest, victim_state):
    shard = fleet.shard(logged_pg)
    start_manager()
    victim = fleet.database(f"victim-{victim_state}", consumer="rectest-consumer")
    status = fleet.wait_phase(victim, "Ready")["status"]
    creds = _creds(admin_rest, victim)
    if victim_state == "released":  # its object is gone (held, then its finalizer removed), the tenant stays
        admin_rest.delete(DATABASES, victim, NAMESPACE)
        fleet.wait_database(victim, lambda d: (c := condition(d, "DeletionHeld")) is not None and c["status"] == "True")
        admin_rest.patch(DATABASES, victim, {"metadata": {"finalizers": None}}, NAMESPACE)
        wait_for(lambda: fleet.get_database(victim) is None, what="victim object released")
    before = len(provisioner_statements(logged_pg))

    thief = f"rectest-thief-{victim_state}"
    fleet.restore(thief, "rectest-intruder", f"thief-{victim_state}", shard, status["tenantName"])

    db = _refused(fleet, thief)
    message = condition(db, "Ready")["message"]
    assert "nothing was changed" in message
    assert ("owns tenant" in message) if victim_state == "live" else ("another consumer" in message)
    assert not db["status"].get("shard") and not db["status"].get("tenantName")
    wait_events(admin_rest, thief, {"RestoreRefused"})
    assert _tenant_writes(logged_pg, before, status["tenantName"]) == []
    with pytest.raises(ApiException) as no_secret:  # no credentials were made for the refused Database
        admin_rest.get(SECRETS, f"{thief}-credentials", NAMESPACE)
    assert no_secret.value.status == 404
    with logged_pg.connect(creds["user"], creds["password"], creds["database"]) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the victim's password still works

    # Deleting the refused Database drops nothing.
    fleet.request_delete(thief)
    wait_for(lambda: fleet.get_database(thief) is None, what="refused Database removed")
    assert tenant_exists(logged_pg, status["tenantName"]) == (True, True)


def test_restore_is_refused_while_the_owning_database_is_held(postgres, fleet, start_manager, admin_rest):
    """A held Database still owns its tenant: restoring a second one onto it would share it."""
    shard = fleet.shard(postgres)
    start_manager()
    owner = fleet.database(f"held-owner{postgres.major}")
    status = fleet.wait_phase(owner, "Ready")["status"]
    admin_rest.delete(DATABASES, owner, NAMESPACE)  # held by the finalizer: the object stays
    fleet.wait_database(owner, lambda d: (c := condition(d, "DeletionHeld")) is not None and c["status"] == "True")

    twin = f"rectest-twin{postgres.major}"
    fleet.restore(twin, "rectest-consumer", f"twin{postgres.major}", shard, status["tenantName"])

    db = _refused(fleet, twin)
    assert "owns tenant" in condition(db, "Ready")["message"]


# -- rotation and the sessions of the old password ------------------------------------------------


@pytest.mark.parametrize("end_sessions", [False, True], ids=["sessions-kept", "sessions-ended"])
def test_rotation_ends_old_sessions_only_when_asked(postgres, fleet, start_manager, admin_rest, end_sessions):
    fleet.shard(postgres)
    start_manager()
    name = fleet.database(f"rot-end-{int(end_sessions)}-{postgres.major}")
    fleet.wait_phase(name, "Ready")
    old = _creds(admin_rest, name)
    stamp = "2026-12-01T06:00:00.000001Z"
    annotations = {ANNOTATION_ROTATE_REQUESTED_AT: stamp}
    if end_sessions:
        annotations[ANNOTATION_ROTATE_END_SESSIONS] = stamp
    with _tenant_session(postgres, old, old["database"]) as session:
        admin_rest.patch(DATABASES, name, {"metadata": {"annotations": annotations}}, NAMESPACE)
        fleet.wait_database(name, lambda d: d["status"].get("rotationApplied") == stamp)

        assert is_alive(session) is not end_sessions
    new = _creds(admin_rest, name)
    assert new["password"] != old["password"]
    with postgres.connect(new["user"], new["password"], new["database"]) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


# -- another tenant's grants ---------------------------------------------------------------------------


def test_another_tenants_grants_do_not_keep_a_database_from_being_dropped(postgres, fleet, start_manager, admin_rest):
    """A grants B's role what it may in A's own database and keeps granting while B is deleted: B's
    DELETE ends in Deleted (the object goes), and A's objects and data stay."""
    fleet.shard(postgres)
    manager = start_manager()
    granter = fleet.database(f"grants-a{postgres.major}", consumer="rectest-consumer")
    victim = fleet.database(f"grants-b{postgres.major}", consumer="rectest-other")
    fleet.wait_phase(granter, "Ready")
    victim_tenant = fleet.wait_phase(victim, "Ready")["status"]["tenantName"]
    a = _creds(admin_rest, granter)
    b = sql.Identifier(victim_tenant)
    with postgres.connect(a["user"], a["password"], a["database"], autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.execute("INSERT INTO orders VALUES (1), (2)")
        for statement in (
            "GRANT CONNECT ON DATABASE {a} TO {b}",
            "GRANT USAGE ON SCHEMA public TO {b}",
            "GRANT SELECT ON orders TO {b} WITH GRANT OPTION",
            "ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO {b}",
            "ALTER TABLE orders ENABLE ROW LEVEL SECURITY",
            "CREATE POLICY for_b ON orders TO {b} USING (true)",
        ):
            conn.execute(sql.SQL(statement).format(a=sql.Identifier(a["database"]), b=b))
    stop, made = threading.Event(), [0]

    def keep_granting() -> None:
        while not stop.is_set():
            try:
                with postgres.connect(a["user"], a["password"], a["database"], autocommit=True) as conn:
                    while not stop.is_set():
                        conn.execute(sql.SQL("GRANT INSERT ON orders TO {}").format(b))
                        made[0] += 1
                        time.sleep(0.01)
            except psycopg.Error:
                continue

    thread = threading.Thread(target=keep_granting, daemon=True)
    thread.start()
    try:
        wait_for(lambda: made[0] > 5, what="A granting")
        fleet.request_delete(victim)

        wait_for(lambda: fleet.get_database(victim) is None, timeout=90, what=f"{victim} dropped and removed")
    finally:
        stop.set()
        thread.join(10)
    assert tenant_exists(postgres, victim_tenant) == (False, False)
    wait_events(admin_rest, victim, {"Dropped"})
    assert manager.errors("database", "DropFailed") == 0
    with postgres.connect(a["user"], a["password"], a["database"]) as conn:
        assert conn.execute("SELECT id FROM orders ORDER BY id").fetchall() == [(1,), (2,)]
        assert conn.execute("SELECT count(*) FROM pg_policy").fetchone() == (0,)  # the policy only B had
    assert condition(fleet.get_database(granter), "Ready")["status"] == "True"
