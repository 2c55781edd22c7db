"""The pre-16 dialect on PostgreSQL 15 (Cloudberry 2.x is PostgreSQL 14 based): the provisioner must
be NOINHERIT, and every isolation guarantee still holds."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from harness import PostgresServer
from tests.cloudberry.conftest import RUNNING, Fleet, condition, tenant_connection


@contextlib.contextmanager
def provisioner_inherits(server: PostgresServer) -> Iterator[None]:
    """A mis-created provisioner (INHERIT); NOINHERIT is restored whatever happens (the server is shared)."""
    with server.superuser_connection() as su:
        su.execute(f"ALTER ROLE {server.PROVISIONER} INHERIT")
    try:
        yield
    finally:
        with server.superuser_connection() as su:
            su.execute(f"ALTER ROLE {server.PROVISIONER} NOINHERIT")


def test_inherit_provisioner_is_refused_and_gets_no_placements(pg15: PostgresServer, fleet: Fleet, start_manager):
    shard = fleet.cloudberry_shard(pg15, fleet.cluster(RUNNING))
    with provisioner_inherits(pg15):
        start_manager()
        refused = fleet.wait_shard(shard, "ProvisionerInherits")
        ready = condition(refused, "Ready")
        assert ready["status"] == "False"
        assert "must be NOINHERIT (ALTER ROLE provisioner NOINHERIT)" in ready["message"]
        assert "gain the privileges of every tenant role" in ready["message"]
        assert condition(refused, "WeakRoleIsolation")["status"] == "True"
        assert refused["status"]["serverVersion"].startswith("15.")

        waiting = fleet.database("refused")
        db = fleet.wait_reason(waiting, "Provisioning", "ShardsUnavailable")  # waits for the shard
        assert not db["status"].get("shard") and not db["status"].get("tenantName")
        # Still refused at the next checks (every 2 s here), and still nothing placed.
        fleet.wait_shard(shard, "ProvisionerInherits")
        assert not fleet.get_database(waiting)["status"].get("shard")

    # NOINHERIT again: Ready at the next check, and the waiting database is placed at once.
    fleet.wait_shard(shard, "Ok")
    assert fleet.wait_ready(waiting, timeout=30)["status"]["shard"] == shard


@pytest.fixture
def public_role(pg15: PostgresServer) -> Iterator[tuple[str, str]]:
    """An unrelated LOGIN role: what PUBLIC may do, it may do."""
    role, password = "cbtest_public", "cbtest-public-pw"
    with pg15.superuser_connection() as su:
        su.execute(f"DROP ROLE IF EXISTS {role}")
        su.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    yield role, password
    with pg15.superuser_connection() as su:
        su.execute(f"DROP ROLE IF EXISTS {role}")


def test_isolation_holds_on_the_pre16_dialect(pg15: PostgresServer, fleet: Fleet, start_manager, public_role):
    cluster, _, _ = fleet.serving_shard(pg15, start_manager)
    name = fleet.database("isolated")
    db = fleet.wait_ready(name)
    tenant = db["status"]["tenantName"]

    # The tenant's credentials work and name the shard's client endpoint.
    creds = fleet.credentials(name)
    assert creds["database"] == creds["user"] == tenant
    assert (creds["host"], creds["port"], creds["sslmode"]) == ("127.0.0.1", str(pg15.port), "require")
    with tenant_connection(pg15, creds) as conn:
        conn.execute("CREATE TABLE private (v text)")
        conn.execute("INSERT INTO private VALUES ('tenant data')")
        conn.commit()
        assert conn.execute("SELECT v FROM private").fetchone()[0] == "tenant data"

    # Neither PUBLIC (an unrelated role) nor the provisioner can connect to the tenant database.
    role, password = public_role
    with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
        pg15.connect(role, password, tenant)
    with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
        pg15.provisioner_connection(tenant)

    with pg15.superuser_connection() as su:
        row = su.execute(
            """
            SELECT has_database_privilege('public', d.oid, 'CONNECT'),
                   has_database_privilege('public', d.oid, 'TEMPORARY'),
                   has_database_privilege(%(p)s, d.oid, 'CONNECT'),
                   pg_has_role(%(p)s, %(t)s, 'MEMBER'),
                   pg_has_role(%(p)s, %(t)s, 'USAGE'),
                   (SELECT rolinherit FROM pg_roles WHERE rolname = %(p)s)
              FROM pg_database d WHERE d.datname = %(t)s
            """,
            {"p": pg15.PROVISIONER, "t": tenant},
        ).fetchone()
    # PUBLIC: nothing. Provisioner: a NOINHERIT member (SET ROLE for owner-only DDL), no privileges of its own.
    assert row == (False, False, False, True, False, False)

    # Even let into the database, the provisioner cannot read the tenant's tables.
    grant = sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
        sql.Identifier(tenant), sql.Identifier(pg15.PROVISIONER)
    )
    with pg15.superuser_connection() as su:
        su.execute(grant)
    try:
        with pg15.provisioner_connection(tenant) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table private"):
                conn.execute("SELECT v FROM private")
    finally:
        revoke = sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(
            sql.Identifier(tenant), sql.Identifier(pg15.PROVISIONER)
        )
        with pg15.superuser_connection() as su:
            su.execute(revoke)
