"""The preflight of an online move (reconciler.sql.move_preflight, `dbprovider move check`'s core) on
real servers: a shard prepared for online moves, the harness' default shards (wal_level=replica, no
grants), PostgreSQL 15, and a tenant database holding what logical replication would not carry."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from psycopg import sql

from dbprovider.clitools import EXIT_FINDINGS, EXIT_INVALID, EXIT_OK
from dbprovider.move_check import Shards, check_move
from harness import PostgresServer
from reconciler.sql import move_preflight as preflight
from reconciler.sql.session import AdminSession, connect_admin
from reconciler.sql.tenant import TenantSpec, ensure_tenant
from tests.sql.conftest import LogicalPool
from tests.sql.helpers import admin_endpoint, new_spec
from tests.sql.test_move_privileges import MOVE_FLAVORS, source_grant, target_grant
from tests.support.postgres import drop_as_superuser


@pytest.fixture(params=MOVE_FLAVORS, ids=[f"pg{f}" for f in MOVE_FLAVORS])
def prepared(request: pytest.FixtureRequest, logical_pool: LogicalPool) -> PostgresServer:
    """A shard whose administrators did what online moves need (both directions)."""
    server = logical_pool.source(request.param)
    source_grant(server)
    target_grant(server)
    return server


def obstacles(server: PostgresServer) -> list[str]:
    with connect_admin(admin_endpoint(server)) as conn:
        return [o.code for o in preflight.shard_obstacles(preflight.read_shard(conn))]


def test_a_prepared_shard_has_no_obstacle(prepared: PostgresServer) -> None:
    assert obstacles(prepared) == []


def test_a_shard_without_the_settings_and_grants_says_what_it_lacks(postgres: PostgresServer) -> None:
    if postgres.major < preflight.ONLINE_MAJOR:
        assert obstacles(postgres) == [preflight.SERVER_VERSION]
    else:
        assert obstacles(postgres) == [
            preflight.WAL_LEVEL,
            preflight.REPLICATION_ATTRIBUTE,
            preflight.CREATE_SUBSCRIPTION,
        ]


@pytest.mark.parametrize("flavor", MOVE_FLAVORS)
def test_a_shard_logging_the_provisioners_statements_is_told_to_stop(flavor: str, logical_pool: LogicalPool) -> None:
    """CREATE SUBSCRIPTION carries the tenant's password: a shard that logs the provisioner's statements
    (here log_statement = all for the whole server) must stop doing so for that role."""
    logged = logical_pool.target(flavor)
    source_grant(logged)
    target_grant(logged)
    found = obstacles(logged)
    assert found == [preflight.STATEMENT_LOGGING]
    with connect_admin(admin_endpoint(logged)) as conn:
        message = preflight.shard_obstacles(preflight.read_shard(conn))[0].message
    assert "log_statement = all" in message
    assert "SET log_statement = 'none'" in message


def test_slots_in_use_count_against_the_headroom(prepared: PostgresServer) -> None:
    slot = f"preflight_{new_spec().name}"
    with connect_admin(admin_endpoint(prepared)) as conn:
        before = preflight.read_shard(conn)
    with prepared.superuser_connection() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    try:
        with connect_admin(admin_endpoint(prepared)) as conn:
            after = preflight.read_shard(conn)
        assert after.used_replication_slots == before.used_replication_slots + 1
        full = preflight.ShardFacts(**{**vars(after), "max_replication_slots": after.used_replication_slots})
        assert [o.code for o in preflight.shard_obstacles(full)] == [preflight.REPLICATION_SLOTS]
        busy = preflight.ShardFacts(**{**vars(after), "used_wal_senders": after.max_wal_senders})
        assert [o.code for o in preflight.shard_obstacles(busy)] == [preflight.WAL_SENDERS]
    finally:
        with prepared.superuser_connection() as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def test_enabled_subscriptions_count_against_the_logical_replication_workers(prepared: PostgresServer) -> None:
    """Each enabled subscription on a shard (a move's, a stream back's, or the administrators' own)
    takes a logical replication worker while it runs; the provisioner sees how many there are."""
    sub = f"preflight_{new_spec().name}"
    with connect_admin(admin_endpoint(prepared)) as conn:
        before = preflight.read_shard(conn)
    conninfo = f"host=127.0.0.1 port={prepared.port} dbname=postgres"
    with prepared.superuser_connection() as conn:
        conn.execute(
            sql.SQL("CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION nothing WITH (connect = false)").format(
                sql.Identifier(sub), sql.Literal(conninfo)
            )
        )
        conn.execute(sql.SQL("ALTER SUBSCRIPTION {} ENABLE").format(sql.Identifier(sub)))
    try:
        with connect_admin(admin_endpoint(prepared)) as conn:
            after = preflight.read_shard(conn)
        assert after.enabled_subscriptions == before.enabled_subscriptions + 1
        assert preflight.shard_obstacles(after) == []
        full = preflight.ShardFacts(**{**vars(after), "max_logical_replication_workers": after.enabled_subscriptions})
        (found,) = preflight.shard_obstacles(full)
        assert found.code == preflight.LOGICAL_WORKERS
        assert "raise max_logical_replication_workers" in found.message
        if after.major >= 18:  # each running subscription also tracks its progress in a replication origin
            assert after.max_active_replication_origins is not None
            spent = preflight.ShardFacts(
                **{**vars(after), "max_active_replication_origins": after.enabled_subscriptions}
            )
            assert [o.code for o in preflight.shard_obstacles(spent)] == [preflight.REPLICATION_ORIGINS]
        else:
            assert after.max_active_replication_origins is None
    finally:
        with prepared.superuser_connection() as conn:
            for statement in ("ALTER SUBSCRIPTION {} DISABLE", "ALTER SUBSCRIPTION {} SET (slot_name = NONE)"):
                conn.execute(sql.SQL(statement).format(sql.Identifier(sub)))
            conn.execute(sql.SQL("DROP SUBSCRIPTION {}").format(sql.Identifier(sub)))


@pytest.fixture
def tenant_on(prepared: PostgresServer) -> Iterator[TenantSpec]:
    spec = new_spec()
    with AdminSession.for_endpoint(admin_endpoint(prepared)) as admin:
        ensure_tenant(admin, spec)
    yield spec
    drop_as_superuser(prepared, spec.name)


def test_a_database_with_keyless_tables_and_large_objects_is_refused_and_left_as_it_was(
    prepared: PostgresServer, tenant_on: TenantSpec
) -> None:
    with prepared.connect(tenant_on.name, tenant_on.password, tenant_on.name, autocommit=True) as conn:
        conn.execute("CREATE TABLE keyed (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE full_identity (v int)")
        conn.execute("ALTER TABLE full_identity REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE keyless (v int)")
        conn.execute("CREATE SCHEMA app")
        conn.execute("CREATE TABLE app.log (line text)")
        conn.execute("CREATE UNLOGGED TABLE scratch (v int)")
        conn.execute("SELECT lo_from_bytea(0, 'x'), lo_from_bytea(0, 'y')")
    with connect_admin(admin_endpoint(prepared)) as conn:
        with preflight.tenant_database(conn, tenant_on.name) as inside:
            assert preflight.tables_without_replica_identity(inside) == ["app.log", "public.keyless"]
            assert preflight.large_object_count(inside) == 2
            found = preflight.database_obstacles(inside, preflight.available_extensions(conn))
        assert [o.code for o in found] == [preflight.REPLICA_IDENTITY, preflight.LARGE_OBJECTS]
        assert "app.log, public.keyless" in found[0].message
        connect = conn.execute(
            "SELECT has_database_privilege(current_user, %s, 'CONNECT')", (tenant_on.name,)
        ).fetchone()
    assert connect == (False,)  # the provisioner was let in for the login only


def test_an_extension_the_target_lacks_is_named(prepared: PostgresServer, tenant_on: TenantSpec) -> None:
    with prepared.superuser_connection(tenant_on.name) as conn:
        available = {name for (name,) in conn.execute("SELECT name FROM pg_available_extensions")}
        extension = next(iter(sorted(available - {"plpgsql"})), None)
        if extension is None:
            pytest.fail("the server offers no extension besides plpgsql")
        conn.execute(sql.SQL("CREATE EXTENSION {} CASCADE").format(sql.Identifier(extension)))
    with connect_admin(admin_endpoint(prepared)) as conn, preflight.tenant_database(conn, tenant_on.name) as inside:
        on_target = preflight.available_extensions(conn) - {extension}
        found = preflight.database_obstacles(inside, on_target)
        assert preflight.database_obstacles(inside, preflight.available_extensions(conn)) == []
    assert [o.code for o in found] == [preflight.EXTENSION_MISSING]
    assert extension in found[0].message


def online_lines(out: io.StringIO) -> list[str]:
    """What `move check` printed about the online path (its offline lines left out)."""
    return [line for line in out.getvalue().splitlines() if not line.startswith("offline")]


def test_move_check_reports_each_obstacle_and_exits_non_zero(
    prepared: PostgresServer, postgres_16_plus: PostgresServer, tenant_on: TenantSpec
) -> None:
    with prepared.connect(tenant_on.name, tenant_on.password, tenant_on.name, autocommit=True) as conn:
        conn.execute("CREATE TABLE keyless (v int)")
    out = io.StringIO()
    shards = Shards(admin_endpoint(prepared), admin_endpoint(postgres_16_plus), tenant_on.name)
    assert check_move(("old", "new"), shards, "orders", out) == EXIT_FINDINGS
    # The online path's lines; the offline path's (the client tools where this runs) are tests/cli's.
    lines = online_lines(out)
    assert lines == [
        "shard new: wal_level is replica: set wal_level = logical (needs a server restart) [wal_level]",
        "shard new: the provisioner role provisioner lacks REPLICATION: a superuser runs ALTER ROLE provisioner "
        "REPLICATION [replication_attribute]",
        "shard new: the provisioner role provisioner is not a member of pg_create_subscription: a superuser runs "
        "GRANT pg_create_subscription TO provisioner [create_subscription]",
        "database orders: 1 table(s) without a primary key or replica identity (public.keyless): add a primary "
        "key, or ALTER TABLE ... REPLICA IDENTITY FULL [replica_identity]",
        "online move not possible: 4 obstacle(s)",
    ]


def test_move_check_between_prepared_shards_says_an_online_move_is_possible(
    prepared: PostgresServer, tenant_on: TenantSpec
) -> None:
    out = io.StringIO()
    endpoint = admin_endpoint(prepared)
    assert check_move(("a", "b"), Shards(endpoint, endpoint, tenant_on.name), "orders", out) == EXIT_OK
    assert online_lines(out) == ["online move possible from shard a to shard b"]


def test_move_check_of_an_unreachable_shard_says_so_without_secrets(prepared: PostgresServer) -> None:
    out = io.StringIO()
    wrong = admin_endpoint(prepared, password="not-the-password")
    assert check_move(("a", "b"), Shards(admin_endpoint(prepared), wrong), None, out) == EXIT_INVALID
    assert out.getvalue() == "error: shard b: cannot log in (auth_failed)\n"
    assert "not-the-password" not in out.getvalue()


def test_a_table_name_cannot_forge_a_line_of_the_report(prepared: PostgresServer, tenant_on: TenantSpec) -> None:
    with prepared.connect(tenant_on.name, tenant_on.password, tenant_on.name, autocommit=True) as conn:
        conn.execute('CREATE TABLE "x\nonline move possible" (v int)')
    with connect_admin(admin_endpoint(prepared)) as conn, preflight.tenant_database(conn, tenant_on.name) as inside:
        assert preflight.tables_without_replica_identity(inside) == ['public."x\\u000aonline move possible"']
