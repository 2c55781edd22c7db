"""Session fixtures: a real kube-apiserver + etcd and real PostgreSQL servers, started once per run.

The helpers and the fixtures the suites share live in tests/support; DBPROVIDER_PG_FLAVORS (see
tests/support/postgres.py) selects the PostgreSQL majors the `postgres` fixture runs over.

Tiers: a test that uses a fixture starting a server (SERVER_FIXTURES, directly or through another
fixture) is marked `server` here; a test that starts one itself carries `pytest.mark.server`.
`make test-fast` runs the rest (`-m "not server"`) with harness.process.NO_SERVERS_ENV set, so a test
that starts a server without the mark fails there instead of slowing the inner loop.

`make test` runs everything but the SERIAL_SUITES on two pytest-xdist workers (each with its own session
servers: ports are chosen at run time, so they never meet), then the serial suites alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import KubeControlPlane, PostgresServer
from harness.process import wait_for_background_builds
from tests.support.postgres import PG_FLAVORS, PostgresPool

# Fixtures that start a kube-apiserver, PostgreSQL, or both (the suites' own ones included).
SERVER_FIXTURES = frozenset(
    {
        "kube",
        "postgres_pool",
        "logged_pg",
        "clusters",
        "stack",
        "compacting_kube",
        "node",
        "cluster",
        "logical_pool",
        "patroni18",
        "patroni16",
    }
)
# Suites that kill or pause processes and measure recovery (a Patroni switchover, failover or lost DCS among
# them), run a real Prometheus on its own clock, or roll pods on a one-node Kubernetes while a client counts
# failed calls: `make test` runs them after the others, alone on the machine, never beside another worker.
SERIAL_SUITES = frozenset({"faults", "alerts", "cluster", "patroni"})
# Suites that need no server but build a wheel and a virtualenv (about 40 s of CPU): in `make test`, not in
# the inner loop (`make test-fast` leaves out `slow`).
SLOW_SUITES = frozenset({"packaging"})
# Suites whose binaries hack/late-builds.sh may still be building in the background (CI), in the order of
# their builds there, each with the builds it needs: they run after every other test of their pytest run.
LATE_BUILDS_OF = {"pulumi": ("pulumi",), "cluster": ("pulumi", "node", "coredns", "image", "pause")}
LATE_SUITES = tuple(LATE_BUILDS_OF)
TESTS = Path(__file__).resolve().parent


def _suite(item: pytest.Item) -> str | None:
    parts = item.path.relative_to(TESTS).parts if item.path.is_relative_to(TESTS) else ()
    return parts[0] if parts else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers (server, serial) by fixtures and suite; the late suites last, each in its own order."""
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)
        if _suite(item) in SERIAL_SUITES:
            item.add_marker(pytest.mark.serial)
        if _suite(item) in SLOW_SUITES:
            item.add_marker(pytest.mark.slow)

    def lateness(item: pytest.Item) -> int:
        suite = _suite(item)
        return LATE_SUITES.index(suite) + 1 if suite in LATE_SUITES else 0

    items.sort(key=lateness)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """A late suite's test first waits for its background builds, before pytest-timeout (whose hook runs
    inside this one) starts the test's clock: a cold build is the machine's time, not the test's. Without
    this a cold CI run failed every tests/pulumi test after 600 s of waiting for the Pulumi build."""
    builds = LATE_BUILDS_OF.get(_suite(item) or "")
    if builds:
        wait_for_background_builds(builds)
    yield


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
