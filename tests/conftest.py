"""Session fixtures: a real kube-apiserver + etcd and real PostgreSQL servers, started once per run.

The helpers and the fixtures the suites share live in tests/support; DBPROVIDER_PG_FLAVORS (see
tests/support/postgres.py) selects the PostgreSQL majors the `postgres` fixture runs over.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import KubeControlPlane, PostgresServer
from tests.support.postgres import PG_FLAVORS, PostgresPool

# Suites whose binaries hack/late-builds.sh may still be building in the background (CI), in the order of
# their builds there: they run after every other test.
LATE_SUITES = ("pulumi", "cluster")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The late suites last, each keeping its own order (a stable sort)."""
    tests_dir = Path(__file__).resolve().parent

    def lateness(item: pytest.Item) -> int:
        parts = item.path.relative_to(tests_dir).parts if item.path.is_relative_to(tests_dir) else ()
        return LATE_SUITES.index(parts[0]) + 1 if parts and parts[0] in LATE_SUITES else 0

    items.sort(key=lateness)


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
