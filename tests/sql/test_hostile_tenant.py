"""What a hostile tenant can try on its own connections, and why it blocks neither the provider nor
another tenant: sessions on template1, objects planted there, locks held on its own role
or database across disable and drop, sessions kept through a password rotation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql

from harness import PostgresServer
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import (
    TenantSpec,
    disable_tenant,
    drop_tenant,
    ensure_tenant,
    set_password,
    tenant_state,
)
from tests.sql.helpers import can_connect, new_spec
from tests.support.postgres import catalog_counts, drop_as_superuser, is_alive


@pytest.fixture
def other_tenant(postgres: PostgresServer) -> Iterator[TenantSpec]:
    """A second consumer's tenant, created by the test."""
    spec = new_spec()
    yield spec
    drop_as_superuser(postgres, spec.name)


class TestTemplate:
    def test_a_tenant_session_on_template1_does_not_block_another_create(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec, other_tenant: TenantSpec
    ) -> None:
        with postgres.unprepared(), postgres.connect(provisioned.name, provisioned.password, "template1") as idle:
            assert idle.execute("SELECT current_database()").fetchone() == ("template1",)

            ensure_tenant(admin, other_tenant)

            assert tenant_state(admin, other_tenant.name).provisioned
            assert is_alive(idle)  # nothing of the provider touched the tenant's session
        with postgres.connect(other_tenant.name, other_tenant.password, other_tenant.name) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (other_tenant.name,)

    def test_objects_planted_in_template1_do_not_reach_a_later_tenant(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec, other_tenant: TenantSpec
    ) -> None:
        # Before PostgreSQL 15 (and on Cloudberry) PUBLIC may CREATE in public; grant it here to be that
        # server, unprepared.
        with postgres.superuser_connection("template1") as su:
            su.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        try:
            with (
                postgres.unprepared(),
                postgres.connect(provisioned.name, provisioned.password, "template1") as planter,
            ):
                planter.execute("CREATE TABLE public.planted (v text)")
                planter.execute("CREATE FUNCTION public.lower(text) RETURNS text LANGUAGE sql AS 'SELECT $1'")
                planter.commit()

            ensure_tenant(admin, other_tenant)

            with postgres.connect(other_tenant.name, other_tenant.password, other_tenant.name) as conn:
                assert conn.execute("SELECT to_regclass('public.planted')").fetchone() == (None,)
                assert conn.execute(
                    "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                    " WHERE n.nspname = 'public'"
                ).fetchone() == (0,)
        finally:
            with postgres.superuser_connection("template1") as su:
                su.execute("DROP TABLE IF EXISTS public.planted")
                su.execute("DROP FUNCTION IF EXISTS public.lower(text)")
                su.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")


# -- locks a tenant holds on its own objects ------------------------------------------------------


def _hold_role_lock(conn: psycopg.Connection, spec: TenantSpec) -> None:
    """The issue's attack: an open transaction that re-set the tenant's own password."""
    conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(spec.name), sql.Literal(spec.password)))


def _hold_database_lock(conn: psycopg.Connection, spec: TenantSpec) -> None:
    """An open transaction that changed the tenant's own database row (the owner may)."""
    conn.execute(sql.SQL("ALTER DATABASE {} CONNECTION LIMIT 7").format(sql.Identifier(spec.name)))


def _hold_table_lock(conn: psycopg.Connection, spec: TenantSpec) -> None:
    """A session inside the tenant database holding an exclusive lock on one of its tables."""
    conn.execute("CREATE TABLE IF NOT EXISTS held (v int)")
    conn.execute("LOCK TABLE held IN ACCESS EXCLUSIVE MODE")


HOLDERS: dict[str, tuple[Callable[[psycopg.Connection, TenantSpec], None], str]] = {
    "role-row": (_hold_role_lock, "tenant"),
    "database-row": (_hold_database_lock, "tenant"),
    "table-in-tenant-db": (_hold_table_lock, "tenant"),
}


@contextmanager
def _holding(postgres: PostgresServer, spec: TenantSpec, holder: str) -> Iterator[psycopg.Connection]:
    """A real tenant session with an open transaction that holds the lock (closed at the end)."""
    hold, where = HOLDERS[holder]
    conn = postgres.connect(spec.name, spec.password, spec.name if where == "tenant" else where)
    try:
        hold(conn, spec)  # not committed: the transaction stays open
        yield conn
    finally:
        conn.close()


def _statement_blocks(postgres: PostgresServer, statement: sql.Composable) -> bool:
    """Whether `statement` by a superuser with a short lock_timeout hits the held lock (rolled back)."""
    with postgres.superuser_connection() as su:
        su.autocommit = False
        su.execute("SET LOCAL lock_timeout = '300ms'")
        try:
            su.execute(statement)
        except psycopg.errors.LockNotAvailable:
            return True
        finally:
            su.rollback()
    return False


@pytest.mark.parametrize("holder", ["role-row", "database-row"])
def test_the_held_locks_really_block_the_statements_of_disable(
    postgres: PostgresServer, provisioned: TenantSpec, holder: str
) -> None:
    """Control: without ending the tenant's sessions, NOLOGIN / ALLOW_CONNECTIONS false would wait."""
    name = sql.Identifier(provisioned.name)
    statement = {
        "role-row": sql.SQL("ALTER ROLE {} NOLOGIN").format(name),
        "database-row": sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(name),
    }[holder]
    with _holding(postgres, provisioned, holder):
        assert _statement_blocks(postgres, statement)


def _disabled(postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec) -> None:
    state = tenant_state(admin, tenant.name)
    assert state.disabled and state.database_exists
    assert not can_connect(postgres, tenant.name, tenant.password, tenant.name)
    assert not can_connect(postgres, tenant.name, tenant.password, "postgres")


def _dropped(postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec) -> None:
    assert catalog_counts(postgres, tenant.name) == (0, 0)


@pytest.mark.parametrize("holder", sorted(HOLDERS))
class TestLocksHeldByTheTenant:
    @pytest.mark.parametrize(
        ("operation", "outcome"), [(disable_tenant, _disabled), (drop_tenant, _dropped)], ids=["disable", "drop"]
    )
    def test_the_operation_ends_the_holder_and_completes(
        self,
        postgres: PostgresServer,
        admin: AdminSession,
        provisioned: TenantSpec,
        holder: str,
        operation: Callable[[AdminSession, str], None],
        outcome: Callable[[PostgresServer, AdminSession, TenantSpec], None],
    ) -> None:
        with _holding(postgres, provisioned, holder) as held:
            operation(admin, provisioned.name)

            assert not is_alive(held)
        outcome(postgres, admin, provisioned)


# -- rotation ---------------------------------------------------------------------------------------


class TestRotationAndOpenSessions:
    def test_sessions_opened_with_the_old_password_survive_a_rotation(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec
    ) -> None:
        with postgres.connect(provisioned.name, provisioned.password, provisioned.name) as old:
            set_password(admin, provisioned.name, "the-new-password-after-a-leak")

            assert old.execute("SELECT current_user").fetchone() == (provisioned.name,)
        assert not can_connect(postgres, provisioned.name, provisioned.password, provisioned.name)

    def test_end_sessions_cuts_them_off_and_the_new_password_works(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec
    ) -> None:
        old = [
            postgres.connect(provisioned.name, provisioned.password, provisioned.name),
            postgres.connect(provisioned.name, provisioned.password, provisioned.name),
        ]
        try:
            set_password(admin, provisioned.name, "the-new-password-after-a-leak", end_sessions=True)

            assert not any(is_alive(conn) for conn in old)
        finally:
            for conn in old:
                conn.close()
        assert can_connect(postgres, provisioned.name, "the-new-password-after-a-leak", provisioned.name)
        assert tenant_state(admin, provisioned.name).provisioned


def test_what_a_tenant_left_in_the_admin_database_does_not_stop_its_drop(
    postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec
) -> None:
    """On an unprepared shard: default privileges anyone may set (and objects where PUBLIC may
    create) depend on the role."""
    with postgres.superuser_connection() as su:
        su.execute("CREATE SCHEMA IF NOT EXISTS open_to_all")
        su.execute("GRANT CREATE, USAGE ON SCHEMA open_to_all TO PUBLIC")
    try:
        with postgres.unprepared(), postgres.connect(provisioned.name, provisioned.password, "postgres") as conn:
            conn.execute("ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO PUBLIC")
            conn.execute(sql.SQL("CREATE TABLE open_to_all.{} (v int)").format(sql.Identifier(provisioned.name)))
            conn.commit()

        drop_tenant(admin, provisioned.name)

        assert catalog_counts(postgres, provisioned.name) == (0, 0)
    finally:
        with postgres.superuser_connection() as su:
            su.execute("DROP SCHEMA open_to_all CASCADE")


def test_on_a_prepared_shard_a_tenant_reaches_only_its_own_database_and_the_provider_still_works(
    postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
) -> None:
    """Every harness server is prepared as docs/sql.md says (harness/postgres.py)."""
    ensure_tenant(admin, tenant)

    assert can_connect(postgres, tenant.name, tenant.password, tenant.name)
    for elsewhere in ("postgres", "template1"):
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            postgres.connect(tenant.name, tenant.password, elsewhere)
    with postgres.connect(tenant.name, tenant.password, tenant.name) as session:
        disable_tenant(admin, tenant.name)
        assert not is_alive(session)
    drop_tenant(admin, tenant.name)
    assert catalog_counts(postgres, tenant.name) == (0, 0)


def test_unprepared_lets_a_tenant_into_postgres_and_template1_for_its_block_only(
    postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec
) -> None:
    """Control of the test above: the same tenant, on the server as initdb leaves it."""
    with postgres.unprepared():
        for elsewhere in ("postgres", "template1"):
            assert can_connect(postgres, provisioned.name, provisioned.password, elsewhere)
    for elsewhere in ("postgres", "template1"):
        assert not can_connect(postgres, provisioned.name, provisioned.password, elsewhere)
