"""Fixtures for the shard SQL: admin sessions, tenants that clean up after themselves, a logged server.

Every test runs against the real PostgreSQL servers of the session fixture `postgres` (18, 16, 15).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from harness import PostgresServer
from reconciler.move.tools import ClientTools
from reconciler.sql.session import AdminEndpoint, AdminSession
from reconciler.sql.tenant import TenantSpec, ensure_tenant
from tests.sql.helpers import admin_endpoint, as_tenant, new_spec
from tests.support.postgres import PG_FLAVORS, PostgresPool, client_tools_root, drop_as_superuser


@pytest.fixture
def endpoint(postgres: PostgresServer) -> AdminEndpoint:
    return admin_endpoint(postgres)


@pytest.fixture
def admin(endpoint: AdminEndpoint) -> Iterator[AdminSession]:
    """An AdminSession of the provisioner with its own application_name (to find its backend)."""
    with AdminSession.for_endpoint(endpoint, application_name=f"sqltest-{uuid.uuid4().hex[:8]}") as session:
        yield session


MODERN_FLAVORS = [f for f in PG_FLAVORS if int(f) >= 16]


@pytest.fixture(scope="session", params=MODERN_FLAVORS, ids=[f"pg{f}" for f in MODERN_FLAVORS])
def postgres_16_plus(request: pytest.FixtureRequest, postgres_pool: PostgresPool) -> PostgresServer:
    """Only the servers with the PostgreSQL 16 role model (createrole_self_grant, GRANT ... WITH SET)."""
    return postgres_pool.get(request.param)


@pytest.fixture
def tenant(postgres: PostgresServer) -> Iterator[TenantSpec]:
    """A fresh tenant spec; whatever the test created under its name is dropped afterwards."""
    spec = new_spec()
    yield spec
    drop_as_superuser(postgres, spec.name)


@pytest.fixture
def provisioned(admin: AdminSession, tenant: TenantSpec) -> TenantSpec:
    """`tenant`, provisioned."""
    ensure_tenant(admin, tenant)
    return tenant


# -- tenants of different consumers on one server: A grants, B is dropped, C looks on ----------------


def _provisioned(postgres: PostgresServer, admin: AdminSession) -> Iterator[TenantSpec]:
    spec = new_spec()
    ensure_tenant(admin, spec)
    yield spec
    drop_as_superuser(postgres, spec.name)


@pytest.fixture
def granter(postgres: PostgresServer, admin: AdminSession, victim: TenantSpec) -> Iterator[TenantSpec]:
    """Tenant A, with a table of its own (`s.t`, one row) in a schema of its own (dropped before the
    victim: the victim's role can only be dropped without A's grants)."""
    for spec in _provisioned(postgres, admin):
        with as_tenant(postgres, spec) as conn:
            conn.execute("CREATE SCHEMA s")
            conn.execute("CREATE TABLE s.t (id int, v text)")
            conn.execute("INSERT INTO s.t VALUES (1, 'a''s row')")
        yield spec


@pytest.fixture
def victim(postgres: PostgresServer, admin: AdminSession) -> Iterator[TenantSpec]:
    """Tenant B, whose DELETE must end with its role dropped."""
    yield from _provisioned(postgres, admin)


@pytest.fixture
def bystander(postgres: PostgresServer, admin: AdminSession) -> Iterator[TenantSpec]:
    """Tenant C, to whom A grants the same things (those grants must stay; see tests/sql/test_foreign_grants.py)."""
    yield from _provisioned(postgres, admin)


# -- a server that logs every statement --------------------------------------------------------


@pytest.fixture(scope="session")
def _logged_servers() -> Iterator[PostgresPool]:
    servers = PostgresPool(log_statements=True)
    yield servers
    servers.close()


@pytest.fixture
def logged_postgres(postgres: PostgresServer, _logged_servers: PostgresPool) -> PostgresServer:
    """A second server of the same major as `postgres`, started with log_statement=all."""
    return _logged_servers.get(str(postgres.major))


# -- servers configured for logical replication (moving a tenant between shards) ---------------


class LogicalPool:
    """Two servers per major started with wal_level=logical: a move's source and its target (which
    logs every statement, for tests of what a subscription's statements carry)."""

    # Each completed move keeps its stream back through the rollback window: a subscription (a
    # logical replication worker) on the source and a slot with a WAL sender on the target.
    SETTINGS = {
        "wal_level": "logical",
        "max_replication_slots": "16",
        "max_wal_senders": "16",
        "max_logical_replication_workers": "16",
        "max_worker_processes": "24",
    }

    def __init__(self) -> None:
        self._sources = PostgresPool(settings=self.SETTINGS)
        self._targets = PostgresPool(log_statements=True, settings=self.SETTINGS)

    def source(self, flavor: str) -> PostgresServer:
        return self._sources.get(flavor)

    def target(self, flavor: str) -> PostgresServer:
        return self._targets.get(flavor)

    def close(self) -> None:
        self._sources.close()
        self._targets.close()


@pytest.fixture(scope="session")
def logical_pool() -> Iterator[LogicalPool]:
    pool = LogicalPool()
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def client_tools(tmp_path_factory: pytest.TempPathFactory) -> ClientTools:
    """The client tools of the majors of this run, laid out as the image lays them out (one directory
    per major), and nothing else: a move picks its tools there."""
    root = client_tools_root(tmp_path_factory.mktemp("client-tools"), *PG_FLAVORS)
    return ClientTools(root=root, search_path=False)
