"""Session fixtures: a real kube-apiserver + etcd and real PostgreSQL servers, started once per run.

The helpers and the fixtures the suites share live in tests/support; DBPROVIDER_PG_FLAVORS (see
tests/support/postgres.py) selects the PostgreSQL majors the `postgres` fixture runs over.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness import KubeControlPlane, PostgresServer
from tests.support.postgres import PG_FLAVORS, PostgresPool


@pytest.fixture(scope="session")
def kube() -> Iterator[KubeControlPlane]:
    """One control plane for the whole run; tests isolate themselves by namespace and name."""
    with KubeControlPlane() as control_plane:
        yield control_plane


@pytest.fixture(scope="session")
def postgres_pool() -> Iterator[PostgresPool]:
    pool = PostgresPool()
    yield pool
    pool.close()


@pytest.fixture(scope="session", params=PG_FLAVORS, ids=[f"pg{f}" for f in PG_FLAVORS])
def postgres(request: pytest.FixtureRequest, postgres_pool: PostgresPool) -> PostgresServer:
    """Each test using this runs once per PostgreSQL major (18, 16, 15)."""
    return postgres_pool.get(request.param)
