"""Session fixtures: a real kube-apiserver + etcd and real PostgreSQL servers, started once per run.

DBPROVIDER_PG_FLAVORS (default "18,16,15") selects the PostgreSQL majors the `postgres` fixture
runs over.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from harness import KubeControlPlane, PostgresServer

PG_FLAVORS = [f.strip() for f in os.environ.get("DBPROVIDER_PG_FLAVORS", "18,16,15").split(",") if f.strip()]


@pytest.fixture(scope="session")
def kube() -> Iterator[KubeControlPlane]:
    """One control plane for the whole run; tests isolate themselves by namespace and name."""
    with KubeControlPlane() as control_plane:
        yield control_plane


class PostgresPool:
    """Starts each PostgreSQL flavor at most once per run and stops them all at the end."""

    def __init__(self) -> None:
        self._servers: dict[str, PostgresServer] = {}

    def get(self, flavor: str) -> PostgresServer:
        if flavor not in self._servers:
            self._servers[flavor] = PostgresServer(flavor).start()
        return self._servers[flavor]

    def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()


@pytest.fixture(scope="session")
def postgres_pool() -> Iterator[PostgresPool]:
    pool = PostgresPool()
    yield pool
    pool.close()


@pytest.fixture(scope="session", params=PG_FLAVORS, ids=[f"pg{f}" for f in PG_FLAVORS])
def postgres(request: pytest.FixtureRequest, postgres_pool: PostgresPool) -> PostgresServer:
    """Each test using this runs once per PostgreSQL major (18, 16, 15)."""
    return postgres_pool.get(request.param)
