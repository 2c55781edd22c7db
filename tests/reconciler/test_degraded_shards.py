"""Shards that answer but cannot serve: read-only, in recovery, hung, far away or flaky.

Each is a real PostgreSQL 18 server put into that state (ALTER SYSTEM, a restart as a standby,
SIGSTOP of every process by PID, a TCP proxy adding round-trip time or resets), with the
controllers of one replica running in this process. What a user would notice is asserted: the
Shard's Ready reason, where new databases go, the phase and reason of the databases on the shard,
that waiting spends no retries, and that everything converges once the shard is well again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from domain.constants import ANNOTATION_DELETE_REQUESTED_AT
from domain.resources import SHARDS
from harness import PostgresServer
from harness.tcp_proxy import TcpProxy
from tests.reconciler.causes import wait_reason
from tests.reconciler.conftest import Fleet
from tests.support.common import condition, wait_for
from tests.support.postgres import PostgresPool


@pytest.fixture
def pg18(postgres_pool: PostgresPool) -> PostgresServer:
    return postgres_pool.get("18")


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    """A shard server of this test's own (it is made read-only, a standby or paused)."""
    with PostgresServer("18") as created:
        yield created


def set_read_only(server: PostgresServer, on: bool) -> None:
    with server.superuser_connection() as su:
        su.execute(f"ALTER SYSTEM SET default_transaction_read_only = {'on' if on else 'off'}")
        su.execute("SELECT pg_reload_conf()")


def shard_of(fleet: Fleet, name: str) -> str | None:
    db = fleet.get_database(name)
    return None if db is None else (db.get("status") or {}).get("shard")


def test_a_read_only_shard_is_not_ready_gets_no_placements_and_its_drops_wait(
    server: PostgresServer, pg18: PostgresServer, fleet: Fleet, start_manager, admin_rest
) -> None:
    shard = fleet.shard(server)
    other = fleet.shard(pg18, accepting=False)
    manager = start_manager()
    old = fleet.database("ro-old")
    fleet.wait_phase(old, "Ready")
    assert shard_of(fleet, old) == shard

    set_read_only(server, True)
    ready = condition(fleet.wait_shard(shard, "ReadOnly", timeout=30), "Ready")
    assert ready["status"] == "False"
    assert "read-only" in ready["message"]

    # A delete of a database on it waits for the shard: no disable is tried, no retry spent.
    fleet.annotate_now(old, ANNOTATION_DELETE_REQUESTED_AT)
    db = wait_reason(fleet, old, "ShardNotReady")
    assert db["status"]["phase"] == "Deleting"
    assert condition(db, "Ready")["message"].startswith(f"shard {shard} is not Ready (ReadOnly)")
    before = manager.errors("database", "DisableFailed")
    # New databases go elsewhere (the other shard accepts from now on), never to the read-only one.
    admin_rest.patch(SHARDS, other, {"spec": {"accepting": True}})
    new = fleet.database("ro-new")
    fleet.wait_phase(new, "Ready")
    assert shard_of(fleet, new) == other
    assert manager.errors("database", "DisableFailed") == before == 0
    assert fleet.get_database(old)["status"]["phase"] == "Deleting"

    set_read_only(server, False)
    fleet.wait_shard(shard, "Ok", timeout=30)
    wait_for(lambda: fleet.get_database(old) is None, timeout=60, what="the drop once the shard writes again")
    assert server.query("SELECT count(*) FROM pg_roles WHERE rolname LIKE 't\\_ro\\_old\\_%'") == [(0,)]


def test_a_shard_in_recovery_is_not_ready_until_promoted(server: PostgresServer, fleet: Fleet, start_manager) -> None:
    shard = fleet.shard(server)
    start_manager()
    fleet.wait_shard(shard, "Ok")
    server.become_standby()  # the admin Service now points at a replica
    ready = condition(fleet.wait_shard(shard, "InRecovery", timeout=30), "Ready")
    assert "recovery" in ready["message"]
    name = fleet.database("standby")
    db = fleet.wait_reason(name, "Provisioning", "ShardsUnavailable", timeout=30)
    assert "shard" not in db["status"]  # nothing is placed on a server that cannot write
    server.promote()
    fleet.wait_shard(shard, "Ok", timeout=30)
    fleet.wait_phase(name, "Ready", timeout=60)


def test_a_hung_shard_delays_no_other_shard_and_gives_up_its_sessions(
    server: PostgresServer, pg18: PostgresServer, fleet: Fleet, start_manager, admin_rest
) -> None:
    """Every process of shard A stopped mid-burst (a hung host). Shard B's databases are provisioned
    meanwhile as fast as ever: A's hung work holds only A's lane (workersPerShard workers), never the
    others'. A's SQL is abandoned within the shard check's bounds (not the two-minute operation bound):
    its databases wait in Provisioning saying why, and finish after the resume.

    A is reached through a proxy adding 100 ms of round trip, so that each of its databases takes
    seconds and the freeze surely lands mid-burst: on a near link a fast machine finished all twelve
    between the first Ready and the freeze."""
    with TcpProxy("127.0.0.1", server.port) as proxy:
        proxy.set_latency(0.1)
        _hung_shard_mid_burst(server, pg18, fleet, start_manager, admin_rest, proxy.port)


def _hung_shard_mid_burst(
    server: PostgresServer, pg18: PostgresServer, fleet: Fleet, start_manager, admin_rest, port: int
) -> None:
    shard = fleet.shard(server, port=port, client_port=port)
    other = fleet.shard(pg18, accepting=False)
    manager = start_manager()
    burst = [fleet.database(f"hung-{i}") for i in range(12)]
    wait_for(lambda: sum(shard_of(fleet, n) == shard for n in burst) == len(burst), what="the burst placed on A")
    wait_for(
        lambda: any((fleet.get_database(n) or {}).get("status", {}).get("phase") == "Ready" for n in burst),
        what="the first database Ready: the burst is under way",
    )
    assert len(server.process_ids()) > 2
    server.freeze()  # the backends too, found by PID
    frozen = time.monotonic()
    try:
        admin_rest.patch(SHARDS, other, {"spec": {"accepting": True}})
        created = time.monotonic()
        elsewhere = [fleet.database(f"elsewhere-{i}") for i in range(3)]
        for name in elsewhere:
            fleet.wait_phase(name, "Ready", timeout=60)
            assert shard_of(fleet, name) == other
        ready_elsewhere = time.monotonic() - created
        # Before the lanes, B's databases waited until A's four workers gave up (and before the
        # cut sessions, two minutes).
        assert ready_elsewhere < 12, f"databases on the healthy shard were Ready only {ready_elsewhere:.0f}s in"

        fleet.wait_shard(shard, "Unreachable", timeout=30)
        waiting = [n for n in burst if fleet.get_database(n)["status"]["phase"] != "Ready"]
        assert waiting, "the whole burst was done before the freeze"
        for name in waiting:
            db = wait_reason(fleet, name, "ShardNotReady", timeout=30)
            assert db["status"]["phase"] == "Provisioning"
        abandoned = time.monotonic() - frozen
        assert abandoned < 40, f"A's work waited only {abandoned:.0f}s after the freeze"
        assert manager.errors("database", "ShardNotReady") == 0
    finally:
        server.thaw()
    fleet.wait_shard(shard, "Ok", timeout=30)
    for name in burst:
        fleet.wait_phase(name, "Ready", timeout=90)
        creds = fleet.credentials(name)
        with server.connect(creds["user"], creds["password"], creds["database"]) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (creds["user"],)


@pytest.mark.parametrize(("round_trip", "resets"), [(0.8, None), (0.2, 2.0)], ids=["800ms", "200ms-resets"])
def test_a_far_or_flaky_shard_that_answers_is_used(
    server: PostgresServer, fleet: Fleet, start_manager, round_trip: float, resets: float | None
) -> None:
    """A shard behind a slow link (added round-trip time) or a link that resets a connection every
    ~2 s: the checks adapt their timeouts to the measured round trip, so the shard is Ready, and
    provisioning and drops converge through the resets."""
    with TcpProxy("127.0.0.1", server.port) as proxy:
        proxy.set_latency(round_trip)
        proxy.set_resets(resets)
        shard = fleet.shard(server, port=proxy.port, client_port=proxy.port)
        start_manager()
        fleet.wait_shard(shard, "Ok", timeout=90)
        names = [fleet.database(f"far-{i}") for i in range(3)]
        for name in names:
            fleet.wait_phase(name, "Ready", timeout=120)
        for name in names:
            fleet.annotate_now(name, ANNOTATION_DELETE_REQUESTED_AT)
        for name in names:
            wait_for(lambda name=name: fleet.get_database(name) is None, timeout=120, what=f"{name} dropped")
        if resets is not None:
            assert proxy.resets > 0
    assert server.query("SELECT count(*) FROM pg_database WHERE datname LIKE 't\\_far\\_%'") == [(0,)]
