"""The tenant's two login roles taking turns at rotations with an overlap (reconciler.sql.login_roles),
and every other operation on a tenant handling both."""

from __future__ import annotations

import psycopg
import pytest

from domain.naming import alternate_name
from harness import PostgresServer
from reconciler.sql import login_roles
from reconciler.sql import tenant as tenant_ops
from reconciler.sql.first_login import findings
from reconciler.sql.session import AdminSession, connect_admin
from reconciler.sql.tenant import TenantSpec
from tests.sql.helpers import admin_endpoint, can_connect
from tests.support.postgres import catalog_counts

NEW_PASSWORD = "the-alternate-password-42"


@pytest.fixture
def alternate(admin: AdminSession, provisioned: TenantSpec) -> str:
    """`provisioned`, rotated with an overlap onto its alternate (NEW_PASSWORD); the tenant role still logs in."""
    login_roles.hand_out(admin, provisioned.name, alternate_name(provisioned.name), NEW_PASSWORD, 5)
    return alternate_name(provisioned.name)


class TestOverlap:
    def test_both_credentials_work_until_the_previous_role_is_retired(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec, alternate: str
    ) -> None:
        name = provisioned.name
        assert can_connect(postgres, name, provisioned.password, name)
        old_session = postgres.connect(name, provisioned.password, name)
        try:
            login_roles.retire_login(admin, name, name)

            assert not can_connect(postgres, name, provisioned.password, name)
            assert can_connect(postgres, alternate, NEW_PASSWORD, name)
            assert old_session.execute("SELECT 1").fetchone() == (1,)  # open sessions are left alone
        finally:
            old_session.close()

    def test_the_alternate_acts_as_the_tenant(
        self, postgres: PostgresServer, provisioned: TenantSpec, alternate: str
    ) -> None:
        with postgres.connect(alternate, NEW_PASSWORD, provisioned.name, autocommit=True) as conn:
            users = conn.execute("SELECT session_user, current_user").fetchone()
            conn.execute("CREATE TABLE made_by_alternate (v int)")
            owner = conn.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'made_by_alternate'").fetchone()
        assert users == (alternate, provisioned.name)
        assert owner == (provisioned.name,)
        with postgres.connect(provisioned.name, provisioned.password, provisioned.name, autocommit=True) as conn:
            conn.execute("DROP TABLE made_by_alternate")  # the tenant role owns it

    def test_neither_role_can_alter_the_other(
        self, postgres: PostgresServer, provisioned: TenantSpec, alternate: str
    ) -> None:
        name = provisioned.name
        with postgres.connect(name, provisioned.password, name, autocommit=True) as conn:
            for statement in ("ALTER ROLE {} NOLOGIN", "ALTER ROLE {} CONNECTION LIMIT 100", "ALTER ROLE {} RESET ALL"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(psycopg.sql.SQL(statement).format(psycopg.sql.Identifier(alternate)))
        with postgres.connect(alternate, NEW_PASSWORD, name, autocommit=True) as conn:
            conn.execute("RESET ROLE")
            for statement in ("ALTER ROLE {} NOLOGIN", "ALTER ROLE {} CONNECTION LIMIT 100"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(psycopg.sql.SQL(statement).format(psycopg.sql.Identifier(name)))

    def test_rotating_back_sets_the_tenant_role_and_keeps_the_alternate(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec, alternate: str
    ) -> None:
        name = provisioned.name
        login_roles.retire_login(admin, name, name)

        login_roles.hand_out(admin, name, name, "the-third-password-42", 5)

        assert can_connect(postgres, name, "the-third-password-42", name)
        assert can_connect(postgres, alternate, NEW_PASSWORD, name)
        login_roles.retire_login(admin, name, alternate)
        assert not can_connect(postgres, alternate, NEW_PASSWORD, name)
        assert can_connect(postgres, name, "the-third-password-42", name)

    def test_retiring_with_end_sessions_ends_the_old_roles_sessions(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec, alternate: str
    ) -> None:
        name = provisioned.name
        old_session = postgres.connect(name, provisioned.password, name)
        new_session = postgres.connect(alternate, NEW_PASSWORD, name)
        try:
            login_roles.retire_login(admin, name, name, end_sessions=True)

            with pytest.raises(psycopg.OperationalError):
                old_session.execute("SELECT 1")
            assert new_session.execute("SELECT 1").fetchone() == (1,)
        finally:
            old_session.close()
            new_session.close()

    def test_without_overlap_the_other_role_stops_at_once(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec, alternate: str
    ) -> None:
        name = provisioned.name
        session = postgres.connect(name, provisioned.password, name)
        try:
            login_roles.hand_out(
                admin, name, alternate, "the-fourth-password-42", 5, end_sessions=True, retire_other=True
            )

            with pytest.raises(psycopg.OperationalError):
                session.execute("SELECT 1")
        finally:
            session.close()
        assert not can_connect(postgres, name, provisioned.password, name)
        assert not can_connect(postgres, alternate, NEW_PASSWORD, name)
        assert can_connect(postgres, alternate, "the-fourth-password-42", name)

    def test_making_the_alternate_again_converges(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec, alternate: str
    ) -> None:
        with connect_admin(admin_endpoint(postgres)) as conn:
            login_roles.ensure_alternate(conn, provisioned.name, 5)
            login_roles.ensure_alternate(conn, provisioned.name, 5)
            state = tenant_ops.read_state(conn, provisioned.name)
            assert login_roles.alternate_problems(conn, provisioned.name, state) == []
        assert can_connect(postgres, alternate, NEW_PASSWORD, provisioned.name)


class TestTheRestHandlesBoth:
    def test_connection_limit_applies_to_both(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec, alternate: str
    ) -> None:
        tenant_ops.set_connection_limit(admin, provisioned.name, 1)

        with postgres.connect(alternate, NEW_PASSWORD, provisioned.name):
            with pytest.raises(psycopg.OperationalError, match="too many connections"):
                postgres.connect(alternate, NEW_PASSWORD, provisioned.name)
        with postgres.superuser_connection() as conn:
            limits = conn.execute(
                "SELECT rolconnlimit FROM pg_roles WHERE rolname IN (%s, %s)", (provisioned.name, alternate)
            ).fetchall()
        assert limits == [(1,), (1,)]

    def test_disable_closes_both_and_enable_reopens_only_the_one_handed_out(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec, alternate: str
    ) -> None:
        name = provisioned.name
        session = postgres.connect(alternate, NEW_PASSWORD, name)
        try:
            tenant_ops.disable_tenant(admin, name)
            with pytest.raises(psycopg.OperationalError):
                session.execute("SELECT 1")
        finally:
            session.close()
        assert tenant_ops.tenant_state(admin, name).disabled
        assert not can_connect(postgres, name, provisioned.password, name)
        assert not can_connect(postgres, alternate, NEW_PASSWORD, name)

        tenant_ops.enable_tenant(admin, name, login=alternate)

        assert can_connect(postgres, alternate, NEW_PASSWORD, name)
        assert not can_connect(postgres, name, provisioned.password, name)

    def test_drop_removes_both_roles(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec, alternate: str
    ) -> None:
        session = postgres.connect(alternate, NEW_PASSWORD, provisioned.name)
        try:
            tenant_ops.drop_tenant(admin, provisioned.name)
        finally:
            session.close()
        assert catalog_counts(postgres, provisioned.name) == (0, 0)
        assert catalog_counts(postgres, alternate)[0] == 0

    def test_the_login_check_accepts_the_providers_setting_and_nothing_more(
        self, postgres: PostgresServer, provisioned: TenantSpec, alternate: str
    ) -> None:
        with connect_admin(admin_endpoint(postgres)) as conn:
            assert findings(conn, provisioned.name) == []
        with postgres.superuser_connection() as conn:  # however it got there (a relay, a hand edit)
            conn.execute(
                psycopg.sql.SQL("ALTER ROLE {} SET search_path = evil").format(psycopg.sql.Identifier(alternate))
            )
        with connect_admin(admin_endpoint(postgres)) as conn:
            assert "parameters set for the alternate role other than the provider's" in findings(conn, provisioned.name)
