"""Provisioning a tenant: what the tenant gets, what nobody else gets, and convergence after a crash."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors, sql

from harness import PostgresServer
from reconciler.sql.errors import SqlFailure
from reconciler.sql.session import AdminSession, connect_admin
from reconciler.sql.tenant import PROVISIONING_STEPS, TenantSpec, ensure_tenant, read_state, tenant_state
from tests.sql.helpers import (
    admin_endpoint,
    can_connect,
    new_spec,
    run_steps,
)
from tests.support.postgres import catalog_counts, drop_as_superuser, login_role


def _acl(server: PostgresServer, name: str) -> tuple[bool, str | None]:
    """(datallowconn, datacl) as the superuser sees them; (False, None) without a database."""
    rows = server.query("SELECT datallowconn, datacl::text FROM pg_database WHERE datname = %s", (name,))
    return (rows[0][0], rows[0][1]) if rows else (False, None)


class TestTheTenantGets:
    def test_its_credentials_connect_over_tcp_and_it_can_create_tables(
        self, postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
    ) -> None:
        ensure_tenant(admin, tenant)

        with postgres.connect(tenant.name, tenant.password, tenant.name) as conn:
            assert conn.execute("SELECT current_user, current_database()").fetchone() == (tenant.name, tenant.name)
            conn.execute("CREATE TABLE notes (body text)")
            conn.execute("INSERT INTO notes VALUES ('mine')")
            assert conn.execute("SELECT body FROM notes").fetchall() == [("mine",)]
        state = tenant_state(admin, tenant.name)
        assert state.provisioned
        assert state.connection_limit == tenant.connection_limit

    def test_the_database_acl_names_only_the_tenant(
        self, postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
    ) -> None:
        ensure_tenant(admin, tenant)

        allow, acl = _acl(postgres, tenant.name)
        assert allow is True
        # Owner's privileges (CONNECT, CREATE, TEMPORARY) granted by itself; no PUBLIC ("=...") entry.
        assert acl == f"{{{tenant.name}=CTc/{tenant.name}}}"


class TestNobodyElseGets:
    @pytest.mark.parametrize("who", ["unrelated_login_role", "provisioner"])
    def test_cannot_connect_to_the_tenant_database(
        self, postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec, who: str
    ) -> None:
        ensure_tenant(admin, tenant)

        if who == "provisioner":
            user, password = postgres.PROVISIONER, postgres.provisioner_password
            assert not can_connect(postgres, user, password, tenant.name)
        else:
            with login_role(postgres, "stranger") as (user, password):
                assert can_connect(postgres, user, password, "postgres")  # the role itself works
                with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
                    postgres.connect(user, password, tenant.name)

    def test_provisioner_does_not_hold_the_tenants_privileges(
        self, postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
    ) -> None:
        """It cannot connect; and even let in, it could not read tenant tables without SET ROLE."""
        ensure_tenant(admin, tenant)
        with postgres.connect(tenant.name, tenant.password, tenant.name) as conn:
            conn.execute("CREATE TABLE secret_rows (v text)")
            conn.execute("INSERT INTO secret_rows VALUES ('tenant data')")

        [(usage, member)] = postgres.query(
            "SELECT pg_has_role(current_user, %s, 'USAGE'), pg_has_role(current_user, %s, 'MEMBER')",
            (tenant.name, tenant.name),
            as_=postgres.PROVISIONER,
        )
        # Member (it needs SET ROLE for owner-only statements), but inherits nothing.
        assert (usage, member) == (False, True)

        # Let it in (a superuser's act, which the provider never does) to show it still cannot read.
        with postgres.superuser_connection() as su:
            su.execute(
                sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                    sql.Identifier(tenant.name), sql.Identifier(postgres.PROVISIONER)
                )
            )
        with postgres.provisioner_connection(tenant.name) as conn:
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute("SELECT v FROM public.secret_rows")
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute("CREATE TABLE public.intruder (v text)")

    def test_the_database_stays_closed_until_public_is_revoked(
        self, postgres: PostgresServer, tenant: TenantSpec
    ) -> None:
        """Run the steps one by one; at no point does it accept connections while PUBLIC may connect."""
        observed = []
        with connect_admin(admin_endpoint(postgres)) as conn:
            for step in PROVISIONING_STEPS:
                step(conn, tenant)
                observed.append((step.__name__, read_state(conn, tenant.name), _acl(postgres, tenant.name)))
                if step.__name__ == "ensure_database":
                    assert not can_connect(postgres, tenant.name, tenant.password, tenant.name)

        for name, state, (allow, acl) in observed:
            assert allow == state.allow_connections, name
            if allow:
                assert state.public_revoked and acl is not None and "=Tc/" not in acl, name
        by_step = {name: state for name, state, _ in observed}
        created = by_step["ensure_database"]
        assert created.database_exists and not created.allow_connections and not created.public_revoked
        assert by_step["open_database"].provisioned


class TestConvergence:
    @pytest.mark.parametrize("done", range(len(PROVISIONING_STEPS) + 1))
    def test_a_crash_after_any_step_converges_on_the_next_pass(
        self, postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec, done: int
    ) -> None:
        run_steps(postgres, tenant, done)

        ensure_tenant(admin, tenant)
        ensure_tenant(admin, tenant)

        assert catalog_counts(postgres, tenant.name) == (1, 1)
        assert tenant_state(admin, tenant.name).provisioned
        assert _acl(postgres, tenant.name) == (True, f"{{{tenant.name}=CTc/{tenant.name}}}")
        assert can_connect(postgres, tenant.name, tenant.password, tenant.name)

    def test_a_crash_between_revoking_public_and_opening_converges(
        self, postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
    ) -> None:
        run_steps(postgres, tenant, 3)
        with connect_admin(admin_endpoint(postgres)) as conn:
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(tenant.name)))
            conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(tenant.name)))

        ensure_tenant(admin, tenant)

        assert tenant_state(admin, tenant.name).provisioned
        assert _acl(postgres, tenant.name) == (True, f"{{{tenant.name}=CTc/{tenant.name}}}")

    def test_a_public_grant_added_later_is_revoked_by_the_next_pass(
        self, postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
    ) -> None:
        ensure_tenant(admin, tenant)
        with postgres.superuser_connection() as su:
            su.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO PUBLIC").format(sql.Identifier(tenant.name)))
        assert not tenant_state(admin, tenant.name).public_revoked

        ensure_tenant(admin, tenant)

        assert tenant_state(admin, tenant.name).provisioned
        with login_role(postgres, "stranger") as (user, password):
            assert not can_connect(postgres, user, password, tenant.name)

    def test_a_role_left_by_a_crashed_attempt_is_made_to_match_the_spec(
        self, postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
    ) -> None:
        """The crashed attempt had another password and limit: the next pass applies the spec's."""
        earlier = TenantSpec(tenant.name, "an-earlier-password", 1)
        run_steps(postgres, earlier, 3)

        ensure_tenant(admin, tenant)

        assert tenant_state(admin, tenant.name).connection_limit == tenant.connection_limit
        assert can_connect(postgres, tenant.name, tenant.password, tenant.name)
        assert not can_connect(postgres, tenant.name, earlier.password, tenant.name)

    def test_tenants_do_not_interfere(self, postgres: PostgresServer, admin: AdminSession) -> None:
        first, second = new_spec(), new_spec()
        try:
            ensure_tenant(admin, first)
            ensure_tenant(admin, second)
            assert not can_connect(postgres, first.name, first.password, second.name)
            assert not can_connect(postgres, second.name, second.password, first.name)
        finally:
            drop_as_superuser(postgres, first.name, second.name)


class TestRefusals:
    def test_a_database_of_that_name_owned_by_another_role_is_never_adopted(
        self, postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
    ) -> None:
        with postgres.superuser_connection() as su:
            su.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(tenant.name)))

        with pytest.raises(SqlFailure) as failure:
            ensure_tenant(admin, tenant)

        assert failure.value.error_class == "name_taken"
        assert str(failure.value).startswith("create failed: name_taken")
        owner = postgres.query("SELECT datdba::regrole::text FROM pg_database WHERE datname = %s", (tenant.name,))
        assert owner == [("postgres",)]
