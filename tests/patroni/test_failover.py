"""A switchover and a failover of the Patroni shard in the middle of a burst of creates, and in the middle
of rotations and soft deletes, then its DCS lost.

Every Database converges to Ready, each tenant exists exactly once on the new primary, none is
lost and none is made twice, and the consumers log in through pgBouncer afterwards. The time
from the leader change to the first DDL that succeeds on the new primary is printed with the test's
result.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from domain.constants import ANNOTATION_ROTATE_REQUESTED_AT
from harness.patroni import PatroniShard
from reconciler.database.shard_sql import SHARD_TROUBLE
from tests.patroni.conftest import Fleet, connect
from tests.support.common import condition, wait_for

pytestmark = pytest.mark.server
BURST = 100
CHURN = 9  # rotations and soft deletes each, about a third of them before the primary is killed
SWITCH_CHURN = 6  # the same around a switchover


@pytest.fixture(scope="module")
def failover_cluster() -> Iterator[PatroniShard]:
    """A cluster of its own: these tests change its leader (the old one rejoins as a replica), then kill it."""
    with PatroniShard("18", replicas=1, pool_mode="transaction") as cluster:
        yield cluster


class DdlClock:
    """Polls the number of databases on whichever member leads, to time the first CREATE DATABASE
    that succeeds on a new leader after `fault()` ran."""

    def __init__(self, cluster: PatroniShard) -> None:
        self.cluster = cluster
        self.first_ddl: float | None = None
        self._stop = threading.Event()

    def measure(self, fault: Callable[[], object]) -> float:
        old = self.cluster.wait_leader()
        started = time.monotonic()
        thread = threading.Thread(target=self._watch, args=(old.name,), daemon=True)
        thread.start()
        fault()
        thread.join(timeout=300)
        assert self.first_ddl is not None, "no DDL succeeded on the new leader"
        return self.first_ddl - started

    def _watch(self, old: str) -> None:
        baseline: int | None = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            leader = self.cluster.leader()
            if leader is not None and leader.name != old:
                try:
                    with leader.superuser_connection() as conn:
                        row = conn.execute("SELECT count(*) FROM pg_database").fetchone()
                except psycopg.Error:
                    row = None
                if row is not None:
                    if baseline is None:
                        baseline = int(row[0])
                    elif int(row[0]) > baseline:
                        self.first_ddl = time.monotonic()
                        return
            time.sleep(0.05)


def burst_through(fleet: Fleet, cluster: PatroniShard, prefix: str, fault: Callable[[], object]) -> float:
    """BURST creates with `fault` striking after the first fifth; waits until all are Ready and checks
    the shard; the seconds from the fault to the first DDL on the new leader."""
    cluster.wait_streaming(1)  # a replica to take over
    names: list[str] = []
    clock = DdlClock(cluster)
    elapsed: list[float] = []

    def strike() -> None:
        elapsed.append(clock.measure(fault))

    striker = threading.Thread(target=strike, daemon=True)
    for i in range(BURST):
        names.append(fleet.database(f"{prefix}-{i}"))
        if i == BURST // 5:
            striker.start()
    striker.join(timeout=300)
    for name in names:
        fleet.wait_phase(name, "Ready", timeout=300)
    tenants = {fleet.get_database(name)["status"]["tenantName"] for name in names}  # type: ignore[index]
    assert len(tenants) == BURST
    on_server = {
        row[0]
        for row in cluster.query(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (f"t_{prefix.replace('-', '_')}_%",)
        )
    }
    assert on_server == tenants  # none lost, none made twice (under another name)
    roles = {row[0] for row in cluster.query("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (list(tenants),))}
    assert roles == tenants
    for name in names[:: BURST // 10]:
        creds = fleet.credentials(name)
        with connect(creds) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (creds["user"],)
    assert elapsed, "the fault did not run"
    drop_as_superuser(cluster, tenants)
    return elapsed[0]


def drop_as_superuser(cluster: PatroniShard, tenants: set[str]) -> None:
    """Drop the burst's tenants behind the provider's back: the next test rebuilds a member from a base
    backup, whose time grows with every database of the cluster (each a copy of template1)."""
    with cluster.superuser_connection() as conn:
        for tenant in sorted(tenants):
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(tenant)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(tenant)))


def test_a_switchover_during_a_burst_of_creates(
    failover_cluster: PatroniShard, fleet: Fleet, start_manager, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet.patroni_shard(failover_cluster)
    start_manager()
    seconds = burst_through(fleet, failover_cluster, "switch", failover_cluster.switchover)
    with capsys.disabled():
        print(f"\nswitchover: first DDL on the new primary {seconds:.1f} s after patronictl switchover started")


def test_a_failover_during_a_burst_of_creates(
    failover_cluster: PatroniShard, fleet: Fleet, start_manager, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet.patroni_shard(failover_cluster)
    start_manager()
    seconds = burst_through(fleet, failover_cluster, "failover", failover_cluster.kill_leader)
    with capsys.disabled():
        print(f"\nfailover: first DDL on the new primary {seconds:.1f} s after the primary was killed")


def churn_through(
    fleet: Fleet, cluster: PatroniShard, shard: str, count: int, fault: Callable[[], object], *, lossy: bool
) -> None:
    """`count` rotations and `count` soft deletes requested one after another, `fault` changing the leader
    after the first third: every rotation ends with the new password logging in through pgBouncer and the
    old one refused, and every tenant is dropped (database and role). A drop may fail while there is no
    primary (DropFailed, with the connection's error class), never on its own SQL: no object_in_use from
    pgBouncer's pooled sessions, no loop.

    `lossy`: the fault may lose the last commits (a failover). A rotation the killed primary committed
    before the replica had it is lost with it, and the provider sets the password again once its check
    sees the new timeline (docs/operations.md, "A failover that loses the last commits"): the logins are
    checked once the Shard records that timeline, and no other rotation is requested."""
    cluster.rejoin_killed()  # a previous test's killed primary, back as a replica that can take over
    cluster.wait_streaming(1)
    prefix = "lossy" if lossy else "lossless"
    rotated = [fleet.database(f"{prefix}-rotate-{i}") for i in range(count)]
    dropped = [fleet.database(f"{prefix}-drop-{i}") for i in range(count)]
    for name in rotated + dropped:
        fleet.wait_phase(name, "Ready", timeout=120)
    old = {name: fleet.credentials(name) for name in rotated + dropped}
    for creds in old.values():
        with connect(creds) as conn:
            conn.execute("SELECT 1")  # pgBouncer keeps a server connection of the role in its pool
    drop_failures: set[str] = set()  # the messages of DropFailed seen
    watching = threading.Event()

    def watch_drops() -> None:
        while not watching.wait(0.2):
            for name in dropped:
                ready = condition(fleet.get_database(name) or {}, "Ready")
                if ready is not None and ready["reason"] == "DropFailed":
                    drop_failures.add(ready["message"])

    watcher = threading.Thread(target=watch_drops, daemon=True)
    watcher.start()
    stamps: dict[str, str] = {}
    old_leader = cluster.wait_leader()
    striker = threading.Thread(target=fault, daemon=True)  # the requests go on while the leader changes
    try:
        for i, (to_rotate, to_drop) in enumerate(zip(rotated, dropped, strict=True)):
            if i == count // 3:
                striker.start()
            stamps[to_rotate] = fleet.annotate_now(to_rotate, ANNOTATION_ROTATE_REQUESTED_AT)
            fleet.request_delete(to_drop)
            time.sleep(0.5)
        striker.join(timeout=180)
        cluster.wait_leader(other_than=old_leader)
        for name, stamp in stamps.items():
            fleet.wait_database(name, lambda db, s=stamp: db["status"].get("rotationApplied") == s, timeout=180)
        wait_for(lambda: all(fleet.get_database(n) is None for n in dropped), 180, "every soft delete to drop")
    finally:
        watching.set()
        watcher.join(timeout=10)
    if lossy:
        timeline = cluster.timeline()
        wait_for(
            lambda: fleet.get_shard(shard).get("status", {}).get("timeline") == timeline,
            timeout=120,
            what="the provider to verify the shard's databases on the new timeline",
        )
    for name in rotated:
        new = fleet.credentials(name)
        assert new["password"] != old[name]["password"]
        with connect(new) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (new["user"],)
        with pytest.raises(psycopg.OperationalError):
            connect(new, password=old[name]["password"]).close()
    classes = {message.partition(" failed: ")[2].split(" ")[0] for message in drop_failures}
    assert classes <= SHARD_TROUBLE, drop_failures
    databases = [old[name]["database"] for name in dropped]
    roles = [old[name]["user"] for name in dropped]
    assert cluster.query("SELECT datname FROM pg_database WHERE datname = ANY(%s)", (databases,)) == []
    assert cluster.query("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (roles,)) == []


def test_a_switchover_during_rotations_and_drops(failover_cluster: PatroniShard, fleet: Fleet, start_manager) -> None:
    """A switchover loses nothing: every rotation and every drop requested around it completes at once."""
    shard = fleet.patroni_shard(failover_cluster)
    start_manager()
    churn_through(fleet, failover_cluster, shard, SWITCH_CHURN, failover_cluster.switchover, lossy=False)


def test_a_failover_during_rotations_and_drops(failover_cluster: PatroniShard, fleet: Fleet, start_manager) -> None:
    shard = fleet.patroni_shard(failover_cluster)
    start_manager()
    churn_through(fleet, failover_cluster, shard, CHURN, failover_cluster.kill_leader, lossy=True)


def test_the_dcs_lost_the_primary_turns_read_only_and_the_shard_says_so(
    failover_cluster: PatroniShard, fleet: Fleet, start_manager
) -> None:
    """Without failsafe mode, Patroni demotes a leader that cannot reach its DCS: the primary endpoint
    still leads there (its endpoints are not updated either), to a server in recovery. The Shard is not
    Ready (InRecovery), no Database turns Ready meanwhile, and all converges once the DCS is back."""
    shard = fleet.patroni_shard(failover_cluster)
    start_manager()
    fleet.wait_shard(shard, "Ok")
    failover_cluster.stop_dcs()
    try:
        fleet.wait_shard(shard, "InRecovery", timeout=90)
        name = fleet.database("during-dcs-loss")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            db = fleet.get_database(name) or {}
            assert (db.get("status") or {}).get("phase") != "Ready", "Ready while the shard cannot be written"
            time.sleep(0.5)
    finally:
        failover_cluster.start_dcs()
    fleet.wait_shard(shard, "Ok", timeout=120)
    fleet.wait_phase(name, "Ready", timeout=120)
