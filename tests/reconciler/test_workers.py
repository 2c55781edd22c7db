"""The Database workers per shard, on the real apiserver and PostgreSQL: a shard gets at most
`workersPerShard` sessions of the provider, a database's SQL runs in its shard's lane (placement in
a lane of its own, with no SQL), and a hung shard holds only its own lane's workers."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from psycopg import sql

from domain.constants import UNPLACED
from domain.resources import SHARDS
from harness import PostgresServer
from harness.background import Background
from reconciler.runtime import Controller, current_slot
from tests.reconciler.conftest import install_config
from tests.support.common import condition, wait_for
from tests.support.in_process_manager import InProcessManager


def _database_controller(manager: InProcessManager) -> Controller:
    return next(c for c in manager.manager.controllers if c.name == "database")


def _ready(fleet, name: str) -> bool:
    cond = condition(fleet.get_shard(name), "Ready")
    return bool(cond and cond["status"] == "True")


@pytest.fixture
def second_provisioner(postgres_pool) -> Iterator[tuple[str, str]]:
    """Another provisioner role on the PostgreSQL 18 server, so two shards' sessions tell apart."""
    pg = postgres_pool.get("18")
    role, password = f"prov_{secrets.token_hex(4)}", secrets.token_urlsafe(16)
    with pg.superuser_connection() as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN CREATEDB CREATEROLE PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)
            )
        )
        # A prepared shard (docs/sql.md) lets only its provisioners connect to `postgres`.
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE postgres TO {}").format(sql.Identifier(role)))
    yield role, password


class SessionWatch(Background):
    """Samples pg_stat_activity: the most sessions each role held at once, and which sessions sent
    tenant SQL (anything but the Shard controller's check)."""

    def __init__(self, server: PostgresServer, roles: tuple[str, ...]) -> None:
        super().__init__()
        self.server = server
        self.roles = roles
        self.peak: Counter[str] = Counter()
        self.tenant_sessions: dict[str, set[int]] = {role: set() for role in roles}

    def run(self) -> None:
        with self.server.superuser_connection() as conn:
            while not self.stopping.is_set():
                rows = conn.execute(
                    "SELECT usename, pid, query FROM pg_stat_activity WHERE usename = ANY(%s)", (list(self.roles),)
                ).fetchall()
                for role, count in Counter(role for role, _, _ in rows).items():
                    self.peak[role] = max(self.peak[role], count)
                for role, pid, query in rows:
                    if query and "server_version_num" not in query:
                        self.tenant_sessions[role].add(pid)
                self.stopping.wait(0.01)


def test_a_shard_gets_at_most_workers_per_shard_sessions_and_its_sql_runs_in_its_lane(
    postgres_pool, fleet, start_manager, second_provisioner
) -> None:
    pg = postgres_pool.get("18")
    role, password = second_provisioner
    a = fleet.shard(pg, max_databases=40)
    b_secret = {"namespace": fleet.release.shard_secrets_namespace, "name": fleet.admin_secrets.secret(role, password)}
    b = fleet.shard(pg, max_databases=40, secret_ref=b_secret)
    manager = start_manager(install_config(workersPerShard=2, workersTotal=8))
    wait_for(lambda: _ready(fleet, a) and _ready(fleet, b), what="both shards Ready")

    lanes_of_sql: list[tuple[str | None, str]] = []  # (lane of the worker, shard the SQL went to)
    shard_sql = manager.controllers.databases.sql
    open_session = shard_sql.session

    def recording_session(database, shard, phase, reason):  # a spy: records, then does the real thing
        slot = current_slot()
        lanes_of_sql.append((slot.lane if slot else None, shard["metadata"]["name"]))
        return open_session(database, shard, phase, reason)

    shard_sql.session = recording_session  # type: ignore[method-assign]
    with SessionWatch(pg, (pg.PROVISIONER, role)) as sessions:
        with ThreadPoolExecutor(8) as pool:  # a burst: every lane busy at once
            names = list(pool.map(lambda i: fleet.database(f"lanes-{i}"), range(24)))
        for name in names:
            fleet.wait_phase(name, "Ready", timeout=120)
    placed = Counter(fleet.get_database(name)["status"]["shard"] for name in names)

    assert placed == {a: 12, b: 12}
    assert lanes_of_sql and all(lane == shard for lane, shard in lanes_of_sql), set(lanes_of_sql)
    # Two Database workers' sessions per shard at most (eight workers in all), plus the Shard
    # controller's check when it happens to run at that moment; and no more than two over the whole
    # burst: a session belongs to a lane slot, not to whichever of the eight workers holds the slot.
    assert 1 <= sessions.peak[pg.PROVISIONER] <= 3 and 1 <= sessions.peak[role] <= 3, sessions.peak
    assert all(1 <= len(pids) <= 2 for pids in sessions.tenant_sessions.values()), sessions.tenant_sessions
    assert _database_controller(manager).queue.lane_stats().get(UNPLACED, (0, 0))[1] == 0


def test_a_hung_shard_holds_only_its_own_lanes_workers(postgres_pool, fleet, start_manager, admin_rest) -> None:
    """Three workers, two per shard. Four databases wait on a hung shard: two of them hold their
    lane's two workers, connecting to a server that never answers (each attempt until its connect
    timeout), the other two wait in the lane. The healthy shard's databases are provisioned with the
    third worker meanwhile: all of them are Ready before any hung pass has given up. With one queue
    for all, three hung passes would hold all three workers, and nothing would be Ready before one
    of them gave up and recorded its failure."""
    with PostgresServer("18") as hung_server:
        hung = fleet.shard(hung_server, max_databases=4)
        healthy = fleet.shard(postgres_pool.get("18"), max_databases=20, accepting=False)
        manager = start_manager(install_config(workersPerShard=2, workersTotal=3))
        wait_for(lambda: _ready(fleet, hung) and _ready(fleet, healthy), what="both shards Ready")
        hung_server.freeze()
        stuck = [fleet.database(f"hung-{i}") for i in range(4)]  # placed on the hung shard (still Ready)
        for name in stuck:
            fleet.wait_database(name, lambda db: (db.get("status") or {}).get("shard") == hung, what="placed")
        queue = _database_controller(manager).queue
        wait_for(lambda: queue.lane_stats().get(hung) == (2, 2), what="two hung passes in flight, two waiting")
        gauges = manager.manager.metrics.registry
        for family, value in (("dbprovider_database_workers_in_flight", 2), ("dbprovider_database_queue_depth", 2)):
            assert gauges.get_sample_value(family, {"shard": hung}) == value  # what an SRE sees of it
            assert gauges.get_sample_value(family, {"shard": healthy}) == 0
        assert gauges.get_sample_value("dbprovider_database_workers_per_shard") == 2
        assert gauges.get_sample_value("dbprovider_database_workers") == 3

        admin_rest.patch(SHARDS, healthy, {"spec": {"accepting": True}})
        fine = [fleet.database(f"fine-{i}") for i in range(6)]
        for name in fine:
            assert fleet.wait_phase(name, "Ready", timeout=120)["status"]["shard"] == healthy

        def given_up(name: str) -> bool:
            return condition(fleet.get_database(name), "Ready")["reason"] != "Provisioning"

        assert not any(given_up(name) for name in stuck)  # every hung pass was still connecting
        hung_server.thaw()
