"""Leadership fences shard SQL: an AdminSession built with a fence checks it before each attempt
and before every statement, so a replica that lost its Lease sends nothing more, even in the
middle of an operation (a paused leader waking up mid-provisioning)."""

from __future__ import annotations

import pytest
from psycopg import sql

from harness import PostgresServer
from reconciler.sql.session import AdminEndpoint, AdminSession, run_operation
from reconciler.sql.tenant import TenantSpec, ensure_tenant
from tests.support.postgres import catalog_counts


class Deposed(Exception):
    """What the manager's fence raises (ControllerStopping); any exception type passes through."""


class Lease:
    def __init__(self) -> None:
        self.held = True
        self.checks = 0

    def fence(self) -> None:
        self.checks += 1
        if not self.held:
            raise Deposed("not leading")


def test_a_lost_lease_stops_an_operation_between_two_statements(
    postgres: PostgresServer, endpoint: AdminEndpoint, tenant: TenantSpec
) -> None:
    lease = Lease()

    def body(conn) -> None:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(tenant.name)))
        lease.held = False  # the Lease is lost (or the renew deadline passed) right here
        conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(tenant.name)))

    with AdminSession.for_endpoint(endpoint, fence=lease.fence) as session:
        with pytest.raises(Deposed):
            run_operation(session, "ensure", body)
    can_login = postgres.query("SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", (tenant.name,))
    assert can_login == [(False,)]  # the first statement ran, the second was never sent


def test_a_replica_without_the_lease_does_not_even_connect(
    postgres: PostgresServer, endpoint: AdminEndpoint, tenant: TenantSpec
) -> None:
    lease = Lease()
    lease.held = False
    with AdminSession.for_endpoint(endpoint, fence=lease.fence) as session:
        with pytest.raises(Deposed):
            ensure_tenant(session, tenant)
        assert session.connects == 0
    assert catalog_counts(postgres, tenant.name) == (0, 0)


def test_a_leading_replica_runs_every_statement_through_the_fence(
    postgres: PostgresServer, endpoint: AdminEndpoint, tenant: TenantSpec
) -> None:
    lease = Lease()
    with AdminSession.for_endpoint(endpoint, fence=lease.fence) as session:
        ensure_tenant(session, tenant)
    assert catalog_counts(postgres, tenant.name) == (1, 1)
    assert lease.checks > 5  # one per attempt and one per statement of the provisioning steps
