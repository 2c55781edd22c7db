"""Another tenant's grants cannot keep a tenant from being dropped.

Tenant A (`granter`) grants tenant B's role (`victim`) whatever it may in its own database; B's drop
removes those grants as A, without A's help, and drops the role. A's own objects, data and grants
to anyone else stay. Every test runs on PostgreSQL 18, 16 and 15.
"""

from __future__ import annotations

import secrets
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql

from harness import PostgresServer
from reconciler.sql.errors import SqlFailure
from reconciler.sql.session import AdminEndpoint, AdminSession
from reconciler.sql.tenant import TenantSpec, disable_tenant, drop_tenant, tenant_state
from tests.sql.helpers import as_tenant, can_connect
from tests.support.common import wait_for
from tests.support.postgres import catalog_counts, drop_as_superuser, is_alive


@pytest.fixture
def granter(bystander: TenantSpec, granter: TenantSpec) -> TenantSpec:
    """Tenant A (tests/sql/conftest.py), made after C and so dropped before it: C is granted things too."""
    return granter


def _role(name: str) -> str:
    return sql.Identifier(name).as_string(None)


# What A may grant B's role in A's own database; each returns the SQL (run as A) with {b} for B's role.
GRANTS: dict[str, list[str]] = {
    "database-connect": ["GRANT CONNECT, TEMPORARY ON DATABASE {a} TO {b}"],
    "schema": ["GRANT USAGE, CREATE ON SCHEMA s TO {b}"],
    "table": ["GRANT SELECT, INSERT ON s.t TO {b}"],
    "table-with-grant-option": ["GRANT SELECT ON s.t TO {b} WITH GRANT OPTION"],
    "column": ["GRANT UPDATE (v), SELECT (id) ON s.t TO {b}"],
    "view": ["CREATE VIEW s.vw AS SELECT * FROM s.t", "GRANT SELECT ON s.vw TO {b}"],
    "sequence": ["CREATE SEQUENCE s.q", "GRANT USAGE, SELECT ON SEQUENCE s.q TO {b}"],
    "function": [
        "CREATE FUNCTION s.f(integer, text[], s.t) RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "GRANT EXECUTE ON FUNCTION s.f(integer, text[], s.t) TO {b}",
    ],
    "procedure": ["CREATE PROCEDURE s.p() LANGUAGE sql AS 'SELECT 1'", "GRANT EXECUTE ON PROCEDURE s.p() TO {b}"],
    "type": ["CREATE TYPE s.ty AS (x int)", "GRANT USAGE ON TYPE s.ty TO {b}"],
    "domain": ["CREATE DOMAIN s.dom AS int", "GRANT USAGE ON DOMAIN s.dom TO {b}"],
    "large-object": ["SELECT lo_create(4242)", "GRANT SELECT, UPDATE ON LARGE OBJECT 4242 TO {b}"],
    "default-privileges": [
        "ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO {b}",
        "ALTER DEFAULT PRIVILEGES IN SCHEMA s GRANT USAGE ON SEQUENCES TO {b}",
        "ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO {b}",
        "ALTER DEFAULT PRIVILEGES GRANT USAGE ON TYPES TO {b}",
        "ALTER DEFAULT PRIVILEGES GRANT USAGE ON SCHEMAS TO {b}",
    ],
    "policy": ["ALTER TABLE s.t ENABLE ROW LEVEL SECURITY", "CREATE POLICY only_b ON s.t TO {b} USING (true)"],
    "default-privileges-large-objects": ["ALTER DEFAULT PRIVILEGES GRANT SELECT ON LARGE OBJECTS TO {b}"],  # 18+
    "policy-shared": ["CREATE POLICY b_and_c ON s.t TO {b}, {c} USING (id > 0)"],
}


def _grant(postgres: PostgresServer, granter: TenantSpec, victim: TenantSpec, bystander: TenantSpec, kind: str) -> None:
    names = {"a": _role(granter.name), "b": _role(victim.name), "c": _role(bystander.name)}
    with as_tenant(postgres, granter) as conn:
        for statement in GRANTS[kind]:
            conn.execute(statement.format(**names))
            if statement.startswith(("GRANT", "ALTER DEFAULT")):  # the same to C, which must keep it
                conn.execute(statement.format(**{**names, "b": names["c"]}))


def _references(postgres: PostgresServer, role: str) -> int:
    """pg_shdepend rows naming the role, in every database (what keeps DROP ROLE from working)."""
    [(count,)] = postgres.query(
        "SELECT count(*) FROM pg_shdepend WHERE refobjid = (SELECT oid FROM pg_roles WHERE rolname = %s)", (role,)
    )
    return int(count)


def _acl_snapshot(postgres: PostgresServer, database: str, without: str) -> dict[str, object]:
    """Everything A's database says about privileges and policies, minus what names `without`."""
    # A NULL ACL is the default one: compare it as such (a REVOKE may write the default out).
    queries = {
        "database": "SELECT datacl::text[] FROM pg_database WHERE datname = current_database()",
        "relations": "SELECT relname, coalesce(relacl, acldefault("
        "CASE relkind WHEN 'S' THEN 's' ELSE 'r' END::\"char\", relowner))::text[]"
        " FROM pg_class WHERE relnamespace = 's'::regnamespace ORDER BY 1",
        "columns": "SELECT attname, attacl::text[] FROM pg_attribute WHERE attrelid = 's.t'::regclass"
        " AND attacl IS NOT NULL ORDER BY 1",
        "routines": "SELECT proname, coalesce(proacl, acldefault('f', proowner))::text[]"
        " FROM pg_proc WHERE pronamespace = 's'::regnamespace ORDER BY 1",
        "types": "SELECT typname, coalesce(typacl, acldefault('T', typowner))::text[]"
        " FROM pg_type WHERE typnamespace = 's'::regnamespace ORDER BY 1",
        "schema": "SELECT coalesce(nspacl, acldefault('n', nspowner))::text[] FROM pg_namespace WHERE nspname = 's'",
        "large objects": "SELECT oid, coalesce(lomacl, acldefault('L', lomowner))::text[]"
        " FROM pg_largeobject_metadata ORDER BY 1",
        "defaults": "SELECT defaclobjtype, defaclnamespace::regnamespace::text, defaclacl::text[] FROM pg_default_acl"
        " ORDER BY 1, 2",
        "policies": "SELECT polname, polroles::regrole[]::text[] FROM pg_policy ORDER BY 1",
    }

    def strip(row: tuple[object, ...]) -> tuple[object, ...] | None:
        """The row without the entries naming `without`; None when they were all it had (it goes)."""
        kept: list[object] = []
        for value in row:
            if isinstance(value, list):
                value = [v for v in value if not (isinstance(v, str) and without in v)] if value else value
                if value == []:
                    return None
            kept.append(value)
        return tuple(kept)

    with postgres.superuser_connection(database) as su:
        return {
            key: [row for row in map(strip, su.execute(query).fetchall()) if row is not None]
            for key, query in queries.items()
        }


@pytest.mark.parametrize("kind", sorted(GRANTS))
def test_the_drop_removes_what_another_tenant_granted_and_nothing_else(
    postgres: PostgresServer,
    admin: AdminSession,
    granter: TenantSpec,
    victim: TenantSpec,
    bystander: TenantSpec,
    kind: str,
) -> None:
    if kind == "default-privileges-large-objects" and postgres.major < 18:
        with pytest.raises(psycopg.errors.SyntaxError):  # nothing to clean up before 18: it cannot be granted
            _grant(postgres, granter, victim, bystander, kind)
        return
    _grant(postgres, granter, victim, bystander, kind)
    assert _references(postgres, victim.name) > 1  # more than its own database: DROP ROLE alone would fail
    before = _acl_snapshot(postgres, granter.name, without=victim.name)

    drop_tenant(admin, victim.name)

    assert catalog_counts(postgres, victim.name) == (0, 0)
    assert _acl_snapshot(postgres, granter.name, without=victim.name) == before  # C's grants, A's own: kept
    with as_tenant(postgres, granter) as conn:
        assert conn.execute("SELECT id, v FROM s.t").fetchall() == [(1, "a's row")]
    assert tenant_state(admin, granter.name).provisioned
    _provisioner_has_no_connect(postgres, granter.name)


def _provisioner_has_no_connect(postgres: PostgresServer, database: str) -> None:
    [(acl,)] = postgres.query("SELECT datacl::text[] FROM pg_database WHERE datname = %s", (database,))
    assert not [item for item in acl if item.startswith(f"{postgres.PROVISIONER}=")]


def test_all_of_it_at_once_and_what_the_victim_built_there(
    postgres: PostgresServer, admin: AdminSession, granter: TenantSpec, victim: TenantSpec, bystander: TenantSpec
) -> None:
    """B's role also owns objects in A's database (A let it create them), and A built on them."""
    for kind in GRANTS:
        if kind == "default-privileges-large-objects" and postgres.major < 18:
            continue
        _grant(postgres, granter, victim, bystander, kind)
    with as_tenant(postgres, victim, granter.name) as conn:
        conn.execute("CREATE TABLE s.b_table (id int)")
        conn.execute("GRANT SELECT ON s.t TO PUBLIC")  # with A's grant option
    with as_tenant(postgres, granter) as conn:
        conn.execute("CREATE VIEW s.on_b AS SELECT * FROM s.b_table")

    drop_tenant(admin, victim.name)

    assert catalog_counts(postgres, victim.name) == (0, 0)
    with as_tenant(postgres, granter) as conn:
        assert conn.execute("SELECT to_regclass('s.b_table'), to_regclass('s.on_b')").fetchone() == (None, None)
        assert conn.execute("SELECT count(*) FROM s.t").fetchone() == (1,)
        public = conn.execute("SELECT has_table_privilege('public', 's.t', 'SELECT')").fetchone()[0]
        assert not public  # B's own grant went with B's grant option
    with as_tenant(postgres, bystander, granter.name) as conn:
        assert conn.execute("SELECT v FROM s.t").fetchall() == [("a's row",)]


def test_a_disabled_granter_stays_disabled(
    postgres: PostgresServer, admin: AdminSession, granter: TenantSpec, victim: TenantSpec, bystander: TenantSpec
) -> None:
    """A soft-deleted A (NOLOGIN, database closed) is let in for the cleanup and closed again."""
    _grant(postgres, granter, victim, bystander, "table")
    disable_tenant(admin, granter.name)
    before = tenant_state(admin, granter.name)

    drop_tenant(admin, victim.name)

    assert catalog_counts(postgres, victim.name) == (0, 0)
    assert tenant_state(admin, granter.name) == before and before.disabled
    _provisioner_has_no_connect(postgres, granter.name)
    assert not can_connect(postgres, granter.name, granter.password, granter.name)


def test_a_granter_that_limited_its_database_to_no_connections_gets_its_limit_back(
    postgres: PostgresServer, admin: AdminSession, granter: TenantSpec, victim: TenantSpec, bystander: TenantSpec
) -> None:
    """The owner may set its database's CONNECTION LIMIT (it cannot close the database it is in)."""
    _grant(postgres, granter, victim, bystander, "schema")
    with as_tenant(postgres, granter) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} CONNECTION LIMIT 0").format(sql.Identifier(granter.name)))

    drop_tenant(admin, victim.name)

    assert catalog_counts(postgres, victim.name) == (0, 0)
    row = postgres.query("SELECT datconnlimit, datallowconn FROM pg_database WHERE datname = %s", (granter.name,))
    assert row == [(0, True)]
    _provisioner_has_no_connect(postgres, granter.name)


@pytest.fixture
def short_lock_admin(endpoint: AdminEndpoint) -> Iterator[AdminSession]:
    """The provisioner with a 1 s lock_timeout, so a held lock costs seconds, not the default 10."""
    with AdminSession.for_endpoint(endpoint, lock_timeout="1s") as session:
        yield session


def test_a_granter_holding_its_grant_open_is_ended_and_the_drop_completes(
    postgres: PostgresServer, short_lock_admin: AdminSession, granter: TenantSpec, victim: TenantSpec
) -> None:
    """A grants again in a transaction it keeps open: the role's lock and A's catalog rows stay held."""
    with as_tenant(postgres, granter) as conn:
        conn.execute(sql.SQL("GRANT SELECT ON s.t TO {}").format(sql.Identifier(victim.name)))
    holder = postgres.connect(granter.name, granter.password, granter.name)  # not autocommit
    try:
        holder.execute("CREATE TABLE s.more (id int)")
        holder.execute(sql.SQL("GRANT SELECT ON s.more, s.t TO {}").format(sql.Identifier(victim.name)))

        drop_tenant(short_lock_admin, victim.name)

        assert not is_alive(holder)
    finally:
        holder.close()
    assert catalog_counts(postgres, victim.name) == (0, 0)
    with as_tenant(postgres, granter) as conn:
        assert conn.execute("SELECT to_regclass('s.more')").fetchone() == (None,)  # rolled back with it
        assert conn.execute("SELECT count(*) FROM s.t").fetchone() == (1,)


@contextmanager
def _granting_in_a_loop(postgres: PostgresServer, granter: TenantSpec, victim: TenantSpec) -> Iterator[list[int]]:
    """A's sessions granting B's role SELECT on one of 20 tables after another, as fast as they can,
    logging in again whenever a session is ended; yields [grants made] and stops when the block ends."""
    with as_tenant(postgres, granter) as conn:
        for i in range(20):
            conn.execute(f"CREATE TABLE s.t{i} (v int)")
    stop, made = threading.Event(), [0]

    def loop() -> None:
        while not stop.is_set():
            try:
                with as_tenant(postgres, granter) as conn:
                    while not stop.is_set():
                        table = sql.Identifier("s", f"t{made[0] % 20}")
                        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(table, sql.Identifier(victim.name)))
                        made[0] += 1
            except psycopg.Error:
                continue  # ended by the provider, or the role is gone: log in again

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        wait_for(lambda: made[0] > 50, timeout=30, what="the granting loop to run")
        yield made
    finally:
        stop.set()
        thread.join(10)


def test_a_granter_granting_in_a_loop_cannot_keep_the_role_alive(
    postgres: PostgresServer, admin: AdminSession, granter: TenantSpec, victim: TenantSpec
) -> None:
    with _granting_in_a_loop(postgres, granter, victim) as made:
        before = made[0]

        drop_tenant(admin, victim.name)

        assert made[0] > before  # A kept granting while the drop ran
    assert catalog_counts(postgres, victim.name) == (0, 0)
    assert tenant_state(admin, granter.name).provisioned


@pytest.fixture
def operator_database(postgres: PostgresServer) -> Iterator[tuple[str, str]]:
    """A database of a role the provider did not create (an operator's), and that role's password."""
    name, password = f"ops_{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(18)
    with postgres.superuser_connection() as su:
        su.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(name), sql.Literal(password)))
        su.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(name)))
    yield name, password
    drop_as_superuser(postgres, name)


def test_a_grant_by_a_role_the_provider_did_not_create_is_reported_and_left_alone(
    postgres: PostgresServer, admin: AdminSession, victim: TenantSpec, operator_database: tuple[str, str]
) -> None:
    ops, password = operator_database
    with postgres.connect(ops, password, ops, autocommit=True) as conn:
        conn.execute("CREATE TABLE ops_table (id int)")
        conn.execute(sql.SQL("GRANT SELECT ON ops_table TO {}").format(sql.Identifier(victim.name)))

    with pytest.raises(SqlFailure) as failure:
        drop_tenant(admin, victim.name)

    assert failure.value.error_class == "dependent_objects" and not failure.value.retryable
    assert str(failure.value).startswith("drop failed: dependent_objects (1 grant(s) or object(s) in 1 database(s)")
    assert victim.name not in str(failure.value) and ops not in str(failure.value)
    with postgres.connect(ops, password, ops) as conn:
        granted = conn.execute("SELECT relacl::text FROM pg_class WHERE relname = 'ops_table'").fetchone()[0]
    assert victim.name in granted  # the operator's grant was not touched
    assert catalog_counts(postgres, victim.name) == (1, 0)  # the database is gone, the closed role stays

    with postgres.connect(ops, password, ops, autocommit=True) as conn:
        conn.execute(sql.SQL("REVOKE ALL ON ops_table FROM {}").format(sql.Identifier(victim.name)))
    drop_tenant(admin, victim.name)
    assert catalog_counts(postgres, victim.name) == (0, 0)


def test_a_connect_grant_left_by_an_interrupted_drop_is_revoked_by_the_next(
    postgres: PostgresServer, admin: AdminSession, granter: TenantSpec, victim: TenantSpec
) -> None:
    with postgres.provisioner_connection() as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(granter.name)))
        conn.execute(
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                sql.Identifier(granter.name), sql.Identifier(postgres.PROVISIONER)
            )
        )

    drop_tenant(admin, victim.name)

    _provisioner_has_no_connect(postgres, granter.name)


def test_tenants_cannot_grant_their_role_to_another(
    postgres: PostgresServer, granter: TenantSpec, victim: TenantSpec
) -> None:
    """Role membership is not one of the grants to clean up: on 15, 16 and 18 a tenant has no ADMIN on itself."""
    with as_tenant(postgres, granter) as conn:
        for option in ("", " WITH ADMIN OPTION"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(
                    sql.SQL("GRANT {} TO {}" + option).format(sql.Identifier(granter.name), sql.Identifier(victim.name))
                )
