"""What moving a tenant between shards may rely on: logical replication as the provisioner sees it.

Each test states one fact of PostgreSQL (16 and 18; 15 where the fact is a refusal) for a provisioner
that is not a superuser and a tenant created the product's way (`ensure_tenant`: the provisioner
holds SET, never INHERIT, on the tenant role). The move builds on exactly these:

- the provisioner publishes the tenant's tables as the tenant (`SET ROLE`, `FOR TABLE` list); a
  publication of all tables or of a schema needs a superuser;
- on the target, with `pg_create_subscription` and CREATE on the database, the provisioner itself
  creates the subscription; the tenant cannot; a password is required in the connection string
  (so a server logging DDL logs it; the catalog shows it to superusers only); changes are applied as
  the table owner (the tenant);
- the publisher side logs in as the tenant, which needs REPLICATION; a CREATEROLE provisioner may
  give it only if it has REPLICATION itself (16+), never on 15;
- wal_level=replica lets a publication be created but no subscription start;
- sequences and large objects are not replicated; UPDATE and DELETE of a published table without a
  replica identity fail on the source.

The servers of `logical_pool` run with wal_level=logical; its one-time grants (REPLICATION on the
source's provisioner, pg_create_subscription on the target's) are what a shard's administrators run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import errors as pgerrors
from psycopg import sql

from harness import PostgresServer
from harness.statement_log import StatementLog
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import TenantSpec, ensure_tenant
from tests.sql.conftest import LogicalPool
from tests.sql.helpers import admin_endpoint, new_spec
from tests.support.common import wait_for
from tests.support.postgres import PG_FLAVORS, PostgresPool, drop_as_superuser, login_role

MOVE_FLAVORS = [f for f in PG_FLAVORS if int(f) >= 16]
OLD_FLAVORS = [f for f in PG_FLAVORS if int(f) < 16]
PROVISIONER = PostgresServer.PROVISIONER


def source_grant(source: PostgresServer) -> None:
    """What a source shard's administrators grant once for online moves (idempotent)."""
    with source.superuser_connection() as conn:
        conn.execute(sql.SQL("ALTER ROLE {} REPLICATION").format(sql.Identifier(PROVISIONER)))


def target_grant(target: PostgresServer) -> None:
    """What a target shard's administrators grant once for online moves (idempotent)."""
    with target.superuser_connection() as conn:
        conn.execute(sql.SQL("GRANT pg_create_subscription TO {}").format(sql.Identifier(PROVISIONER)))


@dataclass(frozen=True)
class Pair:
    """A tenant of the same name and password on a source and a target server."""

    source: PostgresServer
    target: PostgresServer
    spec: TenantSpec

    @property
    def name(self) -> str:
        return self.spec.name

    def tenant(self, server: PostgresServer) -> psycopg.Connection:
        """The consumer's own session in its database."""
        return server.connect(self.name, self.spec.password, self.name, autocommit=True)

    def conninfo(self, password: bool = True) -> str:
        """The subscription's connection string: the tenant logging in to its source database."""
        parts = [f"host=127.0.0.1 port={self.source.port} dbname={self.name} user={self.name}"]
        if password:
            parts.append(f"password={self.spec.password}")
        return " ".join(parts)


def provision(server: PostgresServer, spec: TenantSpec) -> None:
    with AdminSession.for_endpoint(admin_endpoint(server)) as admin:
        ensure_tenant(admin, spec)


def provisioner_inside(server: PostgresServer, name: str, *privileges: str) -> psycopg.Connection:
    """The provisioner's session in the tenant's database, let in by the tenant (its owner), which
    also grants it `privileges` on the database (e.g. CREATE, for a subscription)."""
    with server.provisioner_connection() as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(name)))
        for privilege in ("CONNECT", *privileges):
            conn.execute(
                sql.SQL("GRANT {} ON DATABASE {} TO {}").format(
                    sql.SQL(privilege), sql.Identifier(name), sql.Identifier(PROVISIONER)
                )
            )
    return server.provisioner_connection(name)


def drop_replication(pair: Pair) -> None:
    """Subscriptions on the target (they drop their slots on the source), then any slot left."""
    with pair.target.superuser_connection() as conn:
        subs = conn.execute(
            "SELECT s.subname FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid WHERE d.datname = %s",
            (pair.name,),
        ).fetchall()
    if subs:
        with pair.target.superuser_connection(pair.name) as conn:
            for (sub,) in subs:
                name = sql.Identifier(sub)
                try:
                    conn.execute(sql.SQL("DROP SUBSCRIPTION {}").format(name))
                except psycopg.Error:  # its slot was never made (connect = false): let go of it first
                    conn.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(name))
                    conn.execute(sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(name))
                    conn.execute(sql.SQL("DROP SUBSCRIPTION {}").format(name))
    for server in (pair.source, pair.target):
        with server.superuser_connection() as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
                (pair.name,),
            )


@pytest.fixture(params=MOVE_FLAVORS, ids=[f"pg{f}" for f in MOVE_FLAVORS])
def pair(request: pytest.FixtureRequest, logical_pool: LogicalPool) -> Iterator[Pair]:
    source, target = logical_pool.source(request.param), logical_pool.target(request.param)
    source_grant(source)
    target_grant(target)
    made = Pair(source, target, new_spec())
    provision(source, made.spec)
    provision(target, made.spec)
    yield made
    drop_replication(made)
    drop_as_superuser(source, made.name)
    drop_as_superuser(target, made.name)


SCHEMA = (
    "CREATE TABLE t1 (id bigserial PRIMARY KEY, body text NOT NULL)",
    "CREATE TABLE t2 (id bigint PRIMARY KEY, payload bytea)",
)


def create_schema(conn: psycopg.Connection, target: bool = False) -> None:
    """The tenant's tables; on the target t1 has one more column recording who applied each row."""
    for statement in SCHEMA:
        conn.execute(statement)
    if target:
        conn.execute("ALTER TABLE t1 ADD COLUMN applied_by text DEFAULT current_user")


def publish(pair: Pair, tables: str = "t1, t2") -> None:
    """As the provisioner: SET ROLE tenant; CREATE PUBLICATION ... FOR TABLE <tables>."""
    with provisioner_inside(pair.source, pair.name) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(pair.name)))
        conn.execute(sql.SQL("CREATE PUBLICATION move FOR TABLE " + tables))


def give_replication(pair: Pair) -> None:
    """The provisioner (holding REPLICATION itself) gives it to the tenant role on the source."""
    with pair.source.provisioner_connection() as conn:
        conn.execute(sql.SQL("ALTER ROLE {} REPLICATION").format(sql.Identifier(pair.name)))


def subscribe(pair: Pair, **options: str) -> None:
    """As the provisioner, in the tenant's target database: CREATE SUBSCRIPTION to the source."""
    with provisioner_inside(pair.target, pair.name, "CREATE") as conn:
        create_subscription(conn, pair, **options)


def create_subscription(conn: psycopg.Connection, pair: Pair, password: bool = True, **options: str) -> None:
    statement = sql.SQL("CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION move").format(
        sql.Identifier(f"move_{pair.name}"), sql.Literal(pair.conninfo(password))
    )
    if options:
        statement += sql.SQL(" WITH ({})").format(
            sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.SQL(k), sql.Literal(v)) for k, v in options.items())
        )
    conn.execute(statement)


def rows(server: PostgresServer, name: str, query: str) -> list[tuple[object, ...]]:
    with server.superuser_connection(name) as conn:
        return conn.execute(query).fetchall()


def replicated(pair: Pair) -> None:
    """Wait until the target's t1 and t2 hold what the source's hold (compared by content)."""

    def same() -> bool:
        want = (
            rows(pair.source, pair.name, "SELECT id, body FROM t1 ORDER BY id"),
            rows(pair.source, pair.name, "SELECT id, payload FROM t2 ORDER BY id"),
        )
        have = (
            rows(pair.target, pair.name, "SELECT id, body FROM t1 ORDER BY id"),
            rows(pair.target, pair.name, "SELECT id, payload FROM t2 ORDER BY id"),
        )
        return want == have

    wait_for(same, 60, "the target to hold the source's rows")


# -- publications ------------------------------------------------------------------------------


def test_the_provisioner_publishes_the_tenants_tables_as_the_tenant(pair: Pair) -> None:
    with pair.tenant(pair.source) as conn:
        create_schema(conn)
    publish(pair)
    owner = rows(
        pair.source,
        pair.name,
        "SELECT pg_get_userbyid(pubowner), puballtables FROM pg_publication WHERE pubname = 'move'",
    )
    assert owner == [(pair.name, False)]
    tables = rows(pair.source, pair.name, "SELECT tablename FROM pg_publication_tables ORDER BY 1")
    assert tables == [("t1",), ("t2",)]


@pytest.mark.parametrize("scope", ["ALL TABLES", "TABLES IN SCHEMA public"])
def test_publishing_all_tables_or_a_schema_needs_a_superuser(
    postgres: PostgresServer, tenant: TenantSpec, scope: str
) -> None:
    provision(postgres, tenant)
    with postgres.connect(tenant.name, tenant.password, tenant.name, autocommit=True) as conn:
        create_schema(conn)
    with provisioner_inside(postgres, tenant.name) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(tenant.name)))
        with pytest.raises(pgerrors.InsufficientPrivilege):
            conn.execute(sql.SQL("CREATE PUBLICATION everything FOR " + scope))
    assert postgres.query("SELECT count(*) FROM pg_publication", dbname=tenant.name) == [(0,)]


def test_a_table_of_another_owner_cannot_be_published_as_the_tenant(pair: Pair) -> None:
    with pair.tenant(pair.source) as conn:
        create_schema(conn)
    with pair.source.superuser_connection(pair.name) as conn:
        conn.execute("CREATE TABLE foreign_owned (id int PRIMARY KEY)")
    with pytest.raises(pgerrors.InsufficientPrivilege):
        publish(pair, "t1, foreign_owned")


# -- subscriptions -----------------------------------------------------------------------------


def test_the_provisioner_subscribes_and_changes_are_applied_as_the_tenant(pair: Pair) -> None:
    with pair.tenant(pair.source) as conn:
        create_schema(conn)
        conn.execute("INSERT INTO t1 (body) SELECT 'row ' || g FROM generate_series(1, 50) g")
        conn.execute("INSERT INTO t2 VALUES (1, 'x'), (2, decode(repeat('ab', 4096), 'hex'))")
    with pair.tenant(pair.target) as conn:
        create_schema(conn, target=True)
    publish(pair)
    give_replication(pair)
    subscribe(pair)

    replicated(pair)
    with pair.tenant(pair.source) as conn:
        conn.execute("INSERT INTO t1 (body) VALUES ('after the copy')")
        conn.execute("UPDATE t1 SET body = 'changed' WHERE id = 7")
        conn.execute("DELETE FROM t2 WHERE id = 1")
    replicated(pair)

    assert rows(pair.target, pair.name, "SELECT DISTINCT applied_by FROM t1") == [(pair.name,)]
    owner = rows(pair.target, pair.name, "SELECT pg_get_userbyid(subowner), subpasswordrequired FROM pg_subscription")
    assert owner == [(PROVISIONER, True)]


def test_the_tenant_itself_may_not_create_a_subscription(pair: Pair) -> None:
    with provisioner_inside(pair.target, pair.name, "CREATE") as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(pair.name)))
        with pytest.raises(pgerrors.InsufficientPrivilege):
            create_subscription(conn, pair, connect="false")


def test_a_subscription_needs_create_on_the_database(pair: Pair) -> None:
    with provisioner_inside(pair.target, pair.name) as conn, pytest.raises(pgerrors.InsufficientPrivilege):
        create_subscription(conn, pair, connect="false")


def test_a_subscription_of_the_provisioner_needs_a_password(pair: Pair) -> None:
    with provisioner_inside(pair.target, pair.name, "CREATE") as conn:
        with pytest.raises(psycopg.Error, match="password is required"):
            create_subscription(conn, pair, password=False, connect="false")
        with pytest.raises(pgerrors.InsufficientPrivilege):
            create_subscription(conn, pair, connect="false", password_required="false")


def test_the_subscription_statement_carries_the_password_which_only_a_superuser_can_read_back(pair: Pair) -> None:
    """The connection string is part of CREATE SUBSCRIPTION: a server logging DDL logs the tenant's
    password. In the catalog, pg_subscription.subconninfo is hidden from every role but superusers."""
    log = StatementLog(pair.target)
    subscribe(pair, connect="false")
    assert pair.spec.password in log.text()
    for conn in (pair.tenant(pair.target), pair.target.provisioner_connection(pair.name)):
        with conn, pytest.raises(pgerrors.InsufficientPrivilege):
            conn.execute("SELECT subconninfo FROM pg_subscription")
    assert rows(pair.target, pair.name, "SELECT subconninfo FROM pg_subscription") == [(pair.conninfo(),)]


@pytest.mark.parametrize("flavor", OLD_FLAVORS)
def test_before_16_only_a_superuser_may_subscribe(flavor: str, postgres_pool: PostgresPool) -> None:
    target = postgres_pool.get(flavor)
    spec = new_spec()
    provision(target, spec)
    try:
        roles = target.query("SELECT count(*) FROM pg_roles WHERE rolname = 'pg_create_subscription'")
        assert roles == [(0,)]  # the role PostgreSQL 16 added
        with provisioner_inside(target, spec.name, "CREATE") as conn, pytest.raises(pgerrors.InsufficientPrivilege):
            conn.execute(
                sql.SQL("CREATE SUBSCRIPTION s CONNECTION {} PUBLICATION p WITH (connect = false)").format(
                    sql.Literal(f"host=127.0.0.1 dbname={spec.name} user={spec.name} password=x")
                )
            )
    finally:
        drop_as_superuser(target, spec.name)


# -- the replication connection ----------------------------------------------------------------


def test_the_publisher_login_needs_replication_on_the_tenant_role(pair: Pair) -> None:
    with pair.tenant(pair.source) as conn:
        create_schema(conn)
    with pair.tenant(pair.target) as conn:
        create_schema(conn)
    publish(pair)
    with pytest.raises(psycopg.Error, match="permission denied to start WAL sender"):
        subscribe(pair)
    give_replication(pair)
    subscribe(pair)
    assert rows(pair.source, "postgres", "SELECT count(*) FROM pg_replication_slots") != [(0,)]


@pytest.mark.parametrize("provisioner_has_it", [False, True])
def test_a_createrole_provisioner_gives_replication_only_if_it_has_it_from_16_on(
    postgres: PostgresServer, provisioner_has_it: bool
) -> None:
    attributes = "LOGIN CREATEROLE" + (" REPLICATION" if provisioner_has_it else "")
    spec = new_spec()
    with login_role(postgres, "mvprov", attributes) as (user, password):
        with postgres.connect(user, password, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(spec.name)))
            alter = sql.SQL("ALTER ROLE {} REPLICATION").format(sql.Identifier(spec.name))
            if postgres.major >= 16 and provisioner_has_it:
                conn.execute(alter)
            else:
                with pytest.raises(pgerrors.InsufficientPrivilege):
                    conn.execute(alter)
        granted = postgres.query("SELECT rolreplication FROM pg_roles WHERE rolname = %s", (spec.name,))
        assert granted == [(postgres.major >= 16 and provisioner_has_it,)]
        drop_as_superuser(postgres, spec.name)


def test_wal_level_replica_takes_a_publication_but_starts_no_subscription(
    postgres_16_plus: PostgresServer, logical_pool: LogicalPool
) -> None:
    source, target = postgres_16_plus, logical_pool.target(str(postgres_16_plus.major))
    assert source.query("SHOW wal_level") == [("replica",)]
    target_grant(target)
    made = Pair(source, target, new_spec())
    provision(source, made.spec)
    provision(target, made.spec)
    try:
        with made.tenant(source) as conn:
            create_schema(conn)
        with made.tenant(target) as conn:
            create_schema(conn)
        with source.superuser_connection() as conn:  # this fact is about wal_level, not about the grant
            conn.execute(sql.SQL("ALTER ROLE {} REPLICATION").format(sql.Identifier(made.name)))
        publish(made)
        assert rows(source, made.name, "SELECT count(*) FROM pg_publication") == [(1,)]
        with pytest.raises(psycopg.Error, match="wal_level"):
            subscribe(made)
    finally:
        drop_replication(made)
        drop_as_superuser(source, made.name)
        drop_as_superuser(target, made.name)


# -- what logical replication does not carry ---------------------------------------------------


def test_sequences_and_large_objects_are_not_replicated(pair: Pair) -> None:
    with pair.tenant(pair.source) as conn:
        create_schema(conn)
        conn.execute("INSERT INTO t1 (body) SELECT 'row ' || g FROM generate_series(1, 20) g")
        conn.execute("SELECT lo_from_bytea(0, 'a large object')")
    with pair.tenant(pair.target) as conn:
        create_schema(conn)
    publish(pair)
    give_replication(pair)
    subscribe(pair)
    replicated(pair)

    assert rows(pair.source, pair.name, "SELECT last_value, is_called FROM t1_id_seq") == [(20, True)]
    assert rows(pair.target, pair.name, "SELECT last_value, is_called FROM t1_id_seq") == [(1, False)]
    assert rows(pair.source, pair.name, "SELECT count(*) FROM pg_largeobject_metadata") == [(1,)]
    assert rows(pair.target, pair.name, "SELECT count(*) FROM pg_largeobject_metadata") == [(0,)]


def test_update_and_delete_of_a_published_table_without_replica_identity_fail(pair: Pair) -> None:
    with pair.tenant(pair.source) as conn:
        create_schema(conn)
        conn.execute("CREATE TABLE keyless (v int)")
        conn.execute("INSERT INTO keyless VALUES (1)")
    publish(pair, "t1, keyless")
    with pair.tenant(pair.source) as conn:
        conn.execute("INSERT INTO keyless VALUES (2)")  # inserts need no identity
        for change in ("UPDATE keyless SET v = 3", "DELETE FROM keyless"):
            with pytest.raises(pgerrors.ObjectNotInPrerequisiteState, match="replica identity"):
                conn.execute(change)
        conn.execute("ALTER TABLE keyless REPLICA IDENTITY FULL")
        conn.execute("UPDATE keyless SET v = 3")
    assert rows(pair.source, pair.name, "SELECT v FROM keyless") == [(3,), (3,)]
