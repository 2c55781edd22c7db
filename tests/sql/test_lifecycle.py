"""A provisioned tenant over its life: limit, rotation, soft delete (disable / enable), drop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import psycopg
import pytest

from harness import PostgresServer
from reconciler.sql import tenant as tenant_ops
from reconciler.sql.errors import SqlFailure
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import TenantSpec
from tests.sql.helpers import can_connect, run_steps
from tests.support.postgres import catalog_counts


class TestConnectionLimit:
    def test_changes_the_limit_and_nothing_else(self, admin: AdminSession, provisioned: TenantSpec) -> None:
        before = tenant_ops.tenant_state(admin, provisioned.name)

        tenant_ops.set_connection_limit(admin, provisioned.name, 17)

        after = tenant_ops.tenant_state(admin, provisioned.name)
        assert after.connection_limit == 17
        assert after == replace(before, connection_limit=17)

    def test_does_not_re_enable_a_disabled_login(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec
    ) -> None:
        tenant_ops.disable_tenant(admin, provisioned.name)

        tenant_ops.set_connection_limit(admin, provisioned.name, 3)

        state = tenant_ops.tenant_state(admin, provisioned.name)
        assert (state.connection_limit, state.can_login, state.allow_connections) == (3, False, False)
        assert not can_connect(postgres, provisioned.name, provisioned.password, provisioned.name)

    def test_is_enforced_by_the_server(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec
    ) -> None:
        tenant_ops.set_connection_limit(admin, provisioned.name, 1)
        with postgres.connect(provisioned.name, provisioned.password, provisioned.name):
            with pytest.raises(psycopg.OperationalError, match="too many connections"):
                postgres.connect(provisioned.name, provisioned.password, provisioned.name)


class TestRotation:
    def test_the_old_password_stops_working_and_the_new_one_works(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec
    ) -> None:
        tenant_ops.set_password(admin, provisioned.name, "the-rotated-password-42")

        assert not can_connect(postgres, provisioned.name, provisioned.password, provisioned.name)
        assert can_connect(postgres, provisioned.name, "the-rotated-password-42", provisioned.name)
        assert tenant_ops.tenant_state(admin, provisioned.name).provisioned

    def test_a_missing_role_is_reported_not_created(self, admin: AdminSession, tenant: TenantSpec) -> None:
        with pytest.raises(SqlFailure) as failure:
            tenant_ops.set_password(admin, tenant.name, "whatever-password")
        assert str(failure.value) == "rotate failed: not_found"
        assert tenant_ops.tenant_state(admin, tenant.name).absent


class TestSoftDelete:
    def test_disable_ends_open_sessions_and_refuses_new_ones(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec
    ) -> None:
        sessions = [postgres.connect(provisioned.name, provisioned.password, provisioned.name) for _ in range(2)]
        with postgres.unprepared():  # on a shard that lets tenants into postgres: ended there too
            sessions.append(postgres.connect(provisioned.name, provisioned.password, "postgres"))
        try:
            tenant_ops.disable_tenant(admin, provisioned.name)

            for conn in sessions:
                with pytest.raises(psycopg.OperationalError):
                    conn.execute("SELECT 1")
            with pytest.raises(psycopg.OperationalError, match="not permitted to log in"):
                postgres.connect(provisioned.name, provisioned.password, provisioned.name)
            state = tenant_ops.tenant_state(admin, provisioned.name)
            assert state.disabled and state.database_exists and state.public_revoked
        finally:
            for conn in sessions:
                conn.close()

    def test_enable_restores_the_same_credentials(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec
    ) -> None:
        with postgres.connect(provisioned.name, provisioned.password, provisioned.name) as conn:
            conn.execute("CREATE TABLE kept (v int)")
            conn.execute("INSERT INTO kept VALUES (7)")
        tenant_ops.disable_tenant(admin, provisioned.name)

        tenant_ops.enable_tenant(admin, provisioned.name)

        assert tenant_ops.tenant_state(admin, provisioned.name).provisioned
        with postgres.connect(provisioned.name, provisioned.password, provisioned.name) as conn:
            assert conn.execute("SELECT v FROM kept").fetchall() == [(7,)]

    @pytest.mark.parametrize(
        "operation", [tenant_ops.disable_tenant, tenant_ops.enable_tenant], ids=["disable", "enable"]
    )
    def test_repeating_is_harmless(
        self, admin: AdminSession, provisioned: TenantSpec, operation: Callable[[AdminSession, str], None]
    ) -> None:
        operation(admin, provisioned.name)
        first = tenant_ops.tenant_state(admin, provisioned.name)
        operation(admin, provisioned.name)
        assert tenant_ops.tenant_state(admin, provisioned.name) == first

    def test_disabling_a_tenant_that_was_never_created_does_nothing(
        self, admin: AdminSession, tenant: TenantSpec
    ) -> None:
        tenant_ops.disable_tenant(admin, tenant.name)
        assert tenant_ops.tenant_state(admin, tenant.name).absent

    def test_enabling_a_tenant_that_does_not_exist_is_an_error(self, admin: AdminSession, tenant: TenantSpec) -> None:
        with pytest.raises(SqlFailure) as failure:
            tenant_ops.enable_tenant(admin, tenant.name)
        assert failure.value.error_class == "not_found" and failure.value.operation == "enable"


class TestDrop:
    def test_removes_role_and_database_even_with_open_sessions(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec
    ) -> None:
        conn = postgres.connect(provisioned.name, provisioned.password, provisioned.name)
        try:
            tenant_ops.drop_tenant(admin, provisioned.name)
        finally:
            conn.close()
        assert catalog_counts(postgres, provisioned.name) == (0, 0)
        assert tenant_ops.tenant_state(admin, provisioned.name).absent

    @pytest.mark.parametrize("done", range(len(tenant_ops.PROVISIONING_STEPS) + 1))
    def test_converges_from_any_partial_state_and_is_idempotent(
        self, postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec, done: int
    ) -> None:
        run_steps(postgres, tenant, done)

        tenant_ops.drop_tenant(admin, tenant.name)
        tenant_ops.drop_tenant(admin, tenant.name)

        assert catalog_counts(postgres, tenant.name) == (0, 0)

    def test_after_disable(self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec) -> None:
        tenant_ops.disable_tenant(admin, provisioned.name)
        tenant_ops.drop_tenant(admin, provisioned.name)
        assert catalog_counts(postgres, provisioned.name) == (0, 0)

    def test_a_new_tenant_of_the_same_name_starts_from_scratch(
        self, postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec
    ) -> None:
        with postgres.connect(provisioned.name, provisioned.password, provisioned.name) as conn:
            conn.execute("CREATE TABLE old_rows (v int)")
        tenant_ops.drop_tenant(admin, provisioned.name)

        tenant_ops.ensure_tenant(admin, provisioned)

        with postgres.connect(provisioned.name, provisioned.password, provisioned.name) as conn:
            assert conn.execute("SELECT to_regclass('public.old_rows')").fetchone() == (None,)
        assert catalog_counts(postgres, provisioned.name) == (1, 1)
