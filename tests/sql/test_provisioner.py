"""The admin role: which roles the provider accepts as provisioner, per PostgreSQL major."""

from __future__ import annotations

import pytest
from psycopg import sql

from harness import PostgresServer
from reconciler.sql.errors import SqlFailure
from reconciler.sql.provisioner import dialect_problem, inspect_provisioner
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import TenantSpec, ensure_tenant, tenant_state
from tests.sql.helpers import admin_endpoint, new_spec
from tests.support.postgres import drop_as_superuser, login_role


def test_the_seed_provisioner_is_accepted(postgres: PostgresServer, admin: AdminSession) -> None:
    info = inspect_provisioner(admin)

    assert info.major == postgres.major
    assert (info.role, info.superuser, info.createdb, info.createrole, info.can_login) == (
        postgres.PROVISIONER,
        False,
        True,
        True,
        True,
    )
    assert dialect_problem(info) is None
    # Before 16 CREATEROLE reaches every non-superuser role: the Shard shows that weaker guarantee.
    assert info.weak_createrole is (postgres.major < 16)


@pytest.mark.parametrize(
    ("attributes", "problem"),
    [
        pytest.param("LOGIN SUPERUSER", "is a superuser; it needs only LOGIN CREATEDB CREATEROLE", id="superuser"),
        pytest.param("LOGIN CREATEROLE NOINHERIT", "lacks CREATEDB", id="no-createdb"),
        pytest.param("LOGIN CREATEDB NOINHERIT", "lacks CREATEROLE", id="no-createrole"),
        pytest.param("LOGIN NOINHERIT", "lacks CREATEDB and CREATEROLE", id="neither"),
        pytest.param("LOGIN CREATEDB CREATEROLE INHERIT", "must be NOINHERIT", id="inherit"),
    ],
)
def test_unfit_admin_roles_are_named_with_the_reason(postgres: PostgresServer, attributes: str, problem: str) -> None:
    with login_role(postgres, "prov", attributes) as (user, password):
        with AdminSession.for_endpoint(admin_endpoint(postgres, user, password)) as session:
            found = dialect_problem(inspect_provisioner(session))

    if problem == "must be NOINHERIT" and postgres.major >= 16:
        assert found is None  # from 16 on the grant itself says INHERIT FALSE
    else:
        assert found is not None and problem in found


def test_a_provisioner_that_would_inherit_tenant_privileges_is_refused_before_16(
    postgres: PostgresServer, tenant: TenantSpec
) -> None:
    with login_role(postgres, "prov", "LOGIN CREATEDB CREATEROLE INHERIT") as (user, password):
        try:
            with AdminSession.for_endpoint(admin_endpoint(postgres, user, password)) as session:
                if postgres.major >= 16:
                    ensure_tenant(session, tenant)
                    assert tenant_state(session, tenant.name).provisioned
                    _assert_inherits_nothing(postgres, user, tenant.name)
                    return
                with pytest.raises(SqlFailure) as failure:
                    ensure_tenant(session, tenant)
                state = tenant_state(session, tenant.name)
            [(member,)] = postgres.query("SELECT pg_has_role(%s, %s, 'MEMBER')", (user, tenant.name))
        finally:
            drop_as_superuser(postgres, tenant.name)

    assert failure.value.error_class == "invalid_provisioner"
    assert not failure.value.retryable
    assert str(failure.value).startswith("create failed: invalid_provisioner (before PostgreSQL 16 the provisioner")
    assert "NOINHERIT" in str(failure.value)
    # Refused before the membership: the role exists, the provisioner is no member, no database.
    assert state.role_exists and not state.database_exists and not member


def test_from_16_a_self_grant_with_inherit_is_refused(postgres_16_plus: PostgresServer) -> None:
    """createrole_self_grant = 'set, inherit' would make the creator inherit each new role."""
    postgres = postgres_16_plus
    tenant = new_spec()
    with login_role(postgres, "prov", "LOGIN CREATEDB CREATEROLE") as (user, password):
        with postgres.superuser_connection() as su:
            su.execute(sql.SQL("ALTER ROLE {} SET createrole_self_grant = 'set, inherit'").format(sql.Identifier(user)))
        try:
            with AdminSession.for_endpoint(admin_endpoint(postgres, user, password)) as session:
                with pytest.raises(SqlFailure) as failure:
                    ensure_tenant(session, tenant)
                assert not tenant_state(session, tenant.name).database_exists
        finally:
            drop_as_superuser(postgres, tenant.name)
    assert failure.value.error_class == "invalid_provisioner"
    assert "inherits the tenant role's privileges" in str(failure.value)


def _assert_inherits_nothing(server: PostgresServer, provisioner: str, tenant: str) -> None:
    assert server.query("SELECT pg_has_role(%s, %s, 'USAGE')", (provisioner, tenant)) == [(False,)]
