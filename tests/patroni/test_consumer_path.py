"""The consumer path through pgBouncer on a Patroni shard, as consumers of a Percona cluster have it.

Each test runs on PostgreSQL 18 behind pgBouncer in transaction pool mode and on PostgreSQL 16
behind pgBouncer in session pool mode. The provider reaches the primary through the primary
endpoint; consumers (and the Ready login) go through pgBouncer, which learns every tenant role
through its auth_query in the tenant's own database.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack

import psycopg
import pytest

from domain.constants import ANNOTATION_ROTATE_END_SESSIONS, ANNOTATION_ROTATE_REQUESTED_AT
from domain.resources import DATABASES
from harness.patroni import PatroniShard
from tests.patroni.conftest import NAMESPACE, Fleet, connect, ready_database, works
from tests.support.common import condition, wait_for

pytestmark = pytest.mark.server


@pytest.fixture(params=["patroni18", "patroni16"])
def cluster(request: pytest.FixtureRequest) -> PatroniShard:
    """PostgreSQL 18 with pgBouncer in transaction mode; 16 with pgBouncer in session mode."""
    shard: PatroniShard = request.getfixturevalue(request.param)
    return shard


def rotate(fleet: Fleet, name: str, end_sessions: bool) -> None:
    stamp = fleet.annotate_now(name, ANNOTATION_ROTATE_REQUESTED_AT)
    if end_sessions:
        annotations = {ANNOTATION_ROTATE_END_SESSIONS: stamp}
        fleet.rest.patch(DATABASES, name, {"metadata": {"annotations": annotations}}, NAMESPACE)
    fleet.wait_database(name, lambda db: db["status"].get("rotationApplied") == stamp, timeout=60)


def tenant_backends(cluster: PatroniShard, user: str) -> int:
    """Server sessions of `user` on the primary (what the role's CONNECTION LIMIT counts)."""
    return int(cluster.query("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (user,))[0][0])


def test_a_new_tenant_logs_in_through_pgbouncer_right_after_ready(
    cluster: PatroniShard, fleet: Fleet, start_manager
) -> None:
    name = ready_database(fleet, cluster, start_manager, "orders")
    creds = fleet.credentials(name)
    assert (creds["host"], int(creds["port"])) == ("127.0.0.1", cluster.client_port)  # pgBouncer
    with connect(creds) as conn:
        conn.execute("CREATE TABLE hello (id int)")
        conn.execute("INSERT INTO hello VALUES (1)")
        assert conn.execute("SELECT current_user, count(*) FROM hello GROUP BY 1").fetchone() == (creds["user"], 1)


def test_without_the_pooler_declared_no_tenant_turns_ready(
    patroni18: PatroniShard, fleet: Fleet, start_manager
) -> None:
    """A tenant database copied from template0 has no auth function and refuses pgBouncer's auth_user:
    the Ready login through pgBouncer fails, so the database stays Provisioning and says why."""
    cluster = patroni18
    fleet.patroni_shard(cluster, pooler=False)
    start_manager()
    name = fleet.database("no-pooler")
    db = fleet.wait_reason(name, "Provisioning", "LoginFailed", timeout=120)
    assert f"127.0.0.1:{cluster.client_port}" in condition(db, "Ready")["message"]


def test_a_rotated_password_works_through_pgbouncer_and_the_old_one_stops(
    cluster: PatroniShard, fleet: Fleet, start_manager
) -> None:
    name = ready_database(fleet, cluster, start_manager, "rotated")
    old = fleet.credentials(name)
    with connect(old) as conn:
        assert works(conn)  # pgBouncer now holds a server connection of the role (idle in its pool)
    rotate(fleet, name, end_sessions=False)
    new = fleet.credentials(name)
    assert new["password"] != old["password"]
    with connect(new) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (new["user"],)
    with pytest.raises(psycopg.OperationalError):
        connect(new, password=old["password"]).close()


def test_terminate_sessions_ends_the_sessions_held_through_pgbouncer(
    cluster: PatroniShard, fleet: Fleet, start_manager
) -> None:
    name = ready_database(fleet, cluster, start_manager, "terminated")
    old = fleet.credentials(name)
    with connect(old) as held:
        held.execute("BEGIN")
        held.execute("SELECT 1")  # inside a transaction: the server connection is this client's
        assert tenant_backends(cluster, old["user"]) >= 1
        rotate(fleet, name, end_sessions=True)
        wait_for(lambda: tenant_backends(cluster, old["user"]) == 0, timeout=30, what="the role's sessions to end")
        assert not works(held)
    with connect(fleet.credentials(name)) as conn:
        assert works(conn)


def test_in_transaction_mode_an_idle_client_outlives_terminate_sessions_until_pgbouncer_kills_it(
    patroni18: PatroniShard, fleet: Fleet, start_manager
) -> None:
    """docs/api.md: between transactions a client of pgBouncer in transaction mode holds no server session,
    so `terminateSessions` has nothing of it to end: it stays connected to pgBouncer, and its next
    transactions run on the server connections pgBouncer opens for the logins with the new password. The
    shard's administrators end it with `KILL <database>`, then `RESUME <database>`, on pgBouncer's admin
    console."""
    cluster = patroni18
    name = ready_database(fleet, cluster, start_manager, "idle-client")
    old = fleet.credentials(name)
    with connect(old) as idle:
        assert works(idle)  # authenticated by pgBouncer; its server connection went back to the pool
        rotate(fleet, name, end_sessions=True)
        wait_for(lambda: tenant_backends(cluster, old["user"]) == 0, timeout=30, what="the role's sessions to end")
        new = fleet.credentials(name)
        with connect(new) as fresh:
            assert works(fresh)
            assert works(idle), "the idle client was cut off by terminateSessions"
            database = old["database"]
            cluster.pgbouncer_admin(f"KILL {database}")
            cluster.pgbouncer_admin(f"RESUME {database}")
            assert not works(idle)
            assert not works(fresh)  # KILL ends every client of the database
    with connect(new) as conn:
        assert works(conn)
    with pytest.raises(psycopg.OperationalError):
        connect(new, password=old["password"]).close()


def test_the_roles_connection_limit_holds_through_the_pool(cluster: PatroniShard, fleet: Fleet, start_manager) -> None:
    name = ready_database(fleet, cluster, start_manager, "limited", size_class="small")  # connectionLimit 5
    creds = fleet.credentials(name)
    with ExitStack() as stack:
        busy = [stack.enter_context(connect(creds)) for _ in range(5)]
        for conn in busy:
            conn.execute("BEGIN")
            conn.execute("SELECT 1")  # each holds a server connection of its own
        assert tenant_backends(cluster, creds["user"]) == 5
        outcome: list[str] = []

        def sixth() -> None:
            try:
                with connect(creds) as conn:
                    conn.execute("SELECT 1")
                outcome.append("ran")
            except psycopg.Error:
                outcome.append("refused")

        thread = threading.Thread(target=sixth, daemon=True)
        thread.start()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not outcome:
            assert tenant_backends(cluster, creds["user"]) <= 5
            time.sleep(0.2)
        assert outcome in ([], ["refused"])  # waiting in pgBouncer's queue, or refused: never a sixth backend
        stack.close()  # the five leave (session mode keeps a server connection for a client's whole session)
        thread.join(timeout=150)
        assert outcome == ["ran"] or outcome == ["refused"]
    assert tenant_backends(cluster, creds["user"]) <= 5


def test_soft_delete_and_drop_complete_while_pgbouncer_holds_idle_server_connections(
    cluster: PatroniShard, fleet: Fleet, start_manager
) -> None:
    name = ready_database(fleet, cluster, start_manager, "dropped")
    creds = fleet.credentials(name)
    for _ in range(3):
        with connect(creds) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS t (id int)")
    assert tenant_backends(cluster, creds["user"]) >= 1  # idle in pgBouncer's pool, the client is gone
    reasons: list[str] = []
    fleet.request_delete(name)  # retention 0: disabled, then dropped at once

    def gone() -> bool:
        db = fleet.get_database(name)
        if db is None:
            return True
        ready = condition(db, "Ready")
        if ready is not None:
            reasons.append(ready["reason"])
        return False

    wait_for(gone, timeout=120, what=f"{name} to be dropped and deleted")
    assert "DropFailed" not in reasons
    databases = cluster.query("SELECT count(*) FROM pg_database WHERE datname = %s", (creds["database"],))
    roles = cluster.query("SELECT count(*) FROM pg_roles WHERE rolname = %s", (creds["user"],))
    assert (databases[0][0], roles[0][0]) == (0, 0)
    with pytest.raises(psycopg.OperationalError):
        connect(creds).close()
