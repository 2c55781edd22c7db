"""The DatabaseMove controller through the real apiserver: a Database moved online between two real
PostgreSQL 18 shards prepared for moves, with the tenant's client writing through the move.

The manager runs as the provider's ServiceAccount (its rendered RBAC for DatabaseMoves is proven too).
`kubectl get databasemoves` shows the phase; when the move completes the Database names the target
shard, its credentials Secret the target's endpoint, and every row the client wrote is there.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from kubernetes.client.exceptions import ApiException

from domain.constants import ANNOTATION_ROTATE_OVERLAP, ANNOTATION_ROTATE_REQUESTED_AT, API_VERSION
from domain.resources import DATABASE_MOVES, DATABASES
from harness import PostgresServer
from tests.reconciler.conftest import NAMESPACE, wait_events
from tests.sql.conftest import LogicalPool
from tests.sql.helpers import can_connect
from tests.sql.test_move_privileges import source_grant, target_grant
from tests.support.common import condition, now_stamp, wait_for
from tests.support.postgres import PostgresPool

pytestmark = pytest.mark.server


@contextlib.contextmanager
def servers_for_moves(source: str, target: str) -> Iterator[tuple[PostgresServer, PostgresServer]]:
    """A server of each major with wal_level=logical, each given the one-time grants of online moves."""
    pools = PostgresPool(settings=LogicalPool.SETTINGS), PostgresPool(settings=LogicalPool.SETTINGS)
    servers = pools[0].get(source), pools[1].get(target)
    for server in servers:
        source_grant(server)
        target_grant(server)
    try:
        yield servers
    finally:
        for pool in pools:
            pool.close()


@pytest.fixture(scope="module")
def move_servers() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    """Two PostgreSQL 18 servers prepared for online moves."""
    with servers_for_moves("18", "18") as servers:
        yield servers


def shard(fleet, server: PostgresServer, accepting: bool, max_databases: int = 10) -> str:
    """A Shard on `server`; its client endpoint (which the target's server also uses for the stream)
    prefers TLS: the harness' servers may not read the client certificate libpq looks for under the
    test runner's HOME, which sslmode=require would insist on."""
    return fleet.shard(
        server, name=fleet.name("mv"), accepting=accepting, max_databases=max_databases, client_sslmode="prefer"
    )


@pytest.fixture
def manager(start_manager, move_servers, monkeypatch):
    """A running manager whose pg_dump is the harness' PostgreSQL 18 one."""
    monkeypatch.setenv("DBPROVIDER_PG_DUMP", str(move_servers[1].bin_dir / "pg_dump"))
    return start_manager()


@pytest.fixture
def shards(fleet, manager, move_servers) -> tuple[str, str]:
    """A source Shard that takes new databases and a target Shard that does not (so placement picks
    the source); their names."""
    source_server, target_server = move_servers
    source, target = shard(fleet, source_server, True), shard(fleet, target_server, False)
    fleet.wait_shard(source, "Ok")
    fleet.wait_shard(target, "Ok")
    return source, target


@contextlib.contextmanager
def requested_move(fleet, admin_rest, database: str, target: str, **spec: Any) -> Iterator[str]:
    """A DatabaseMove of `database` to `target` (and `spec`'s other fields); its name. Removed afterwards
    (finalizer included)."""
    name = fleet.name("move")
    body = {
        "apiVersion": API_VERSION,
        "kind": "DatabaseMove",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"database": database, "target": target, **spec},
    }
    admin_rest.create(DATABASE_MOVES, body, NAMESPACE)
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            admin_rest.patch(DATABASE_MOVES, name, {"metadata": {"finalizers": None}}, NAMESPACE)
            admin_rest.delete(DATABASE_MOVES, name, NAMESPACE)


def held_open(server: PostgresServer, credentials: dict[str, str]) -> psycopg.Connection:
    """The tenant's table `orders`, and a session of the tenant holding a transaction open in it (a
    replication slot waits for the transactions running when it is made)."""
    c = credentials
    login = {"host": "127.0.0.1", "port": server.port, "user": c["user"], "password": c["password"]}
    with psycopg.connect(**login, dbname=c["database"], autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, note text NOT NULL)")
    holder = psycopg.connect(**login, dbname=c["database"])
    holder.execute("INSERT INTO orders VALUES (0, 'held open')")
    return holder


def waiting_for_slot(server: PostgresServer) -> None:
    making_slot = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dbprovider-move'"
        " AND query LIKE '%pg_create_logical_replication_slot%' AND state = 'active'"
    )
    wait_for(lambda: server.query(making_slot) != [(0,)], 60, "the move to wait for its replication slot")


def failed_status(admin_rest, name: str) -> dict | None:
    """The DatabaseMove, once it has Failed."""
    move = admin_rest.get(DATABASE_MOVES, name, NAMESPACE)
    return move if (move.get("status") or {}).get("phase") == "Failed" else None


class Client(threading.Thread):
    """The consumer's application: inserts one row after another wherever its credentials point."""

    def __init__(self, credentials: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.credentials = dict(credentials)
        self.acknowledged: list[int] = []
        self.failures: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        step = 0
        while not self._halt.is_set():
            try:
                if conn is None or conn.closed:
                    c = self.credentials
                    conn = psycopg.connect(
                        host=c["host"],
                        port=int(c["port"]),
                        user=c["user"],
                        password=c["password"],
                        dbname=c["database"],
                        connect_timeout=5,
                        autocommit=True,
                    )
                step += 1
                conn.execute("INSERT INTO orders (id, note) VALUES (%s, %s)", (step, f"order {step}"))
                self.acknowledged.append(step)
            except psycopg.OperationalError:
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.05)
            except psycopg.Error as exc:
                self.failures.append(type(exc).__name__)
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


def test_a_database_move_completes_online_and_the_credentials_follow(fleet, admin_rest, move_servers, shards) -> None:
    source_server, target_server = move_servers
    source, target = shards
    database = fleet.database("mv-orders")
    assert fleet.wait_phase(database, "Ready")["status"]["shard"] == source
    credentials = fleet.credentials(database)
    with psycopg.connect(
        host="127.0.0.1",
        port=source_server.port,
        user=credentials["user"],
        password=credentials["password"],
        dbname=credentials["database"],
        autocommit=True,
    ) as conn:
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, note text NOT NULL)")
    client = Client(credentials)
    client.start()
    try:
        wait_for(lambda: len(client.acknowledged) >= 50, 30, "the client to write")

        with requested_move(fleet, admin_rest, database, target) as name:
            phases: list[str] = []

            def completed() -> bool:
                status = admin_rest.get(DATABASE_MOVES, name, NAMESPACE).get("status") or {}
                if status.get("phase") and status["phase"] not in phases:
                    phases.append(status["phase"])
                assert status.get("phase") != "Failed", status
                return status.get("phase") == "Completed"

            wait_for(completed, 180, "the move to complete", max_interval=0.05)
            status = admin_rest.get(DATABASE_MOVES, name, NAMESPACE)["status"]
            assert status["sourceShard"] == source and status["targetShard"] == target
            assert 0 < status["writePauseSeconds"] < 30
            assert condition({"status": status}, "Ready")["status"] == "True"
            assert phases[-1] == "Completed" and "CatchingUp" in phases
            wait_events(admin_rest, name, {"MoveStarted", "MoveCompleted"})

            # The Database names the target; its credentials Secret follows (the Database controller).
            assert fleet.get_database(database)["status"]["shard"] == target
            wait_for(lambda: fleet.credentials(database)["port"] == str(target_server.port), 60, "the Secret's port")
            moved = fleet.credentials(database)
            assert moved["password"] == credentials["password"] and moved["user"] == credentials["user"]
            assert not can_connect(source_server, credentials["user"], credentials["password"], credentials["database"])
            after = fleet.wait_phase(database, "Ready")
            assert condition(after, "Ready")["status"] == "True"
            wait_for(lambda: (fleet.get_shard(target).get("status") or {}).get("databaseCount") == 1, 60, "counts")
            wait_for(lambda: (fleet.get_shard(source).get("status") or {}).get("databaseCount") == 0, 60, "counts")

            # The client, given the new endpoint, goes on; nothing it saw committed is missing.
            before = len(client.acknowledged)
            client.credentials = moved
            wait_for(lambda: len(client.acknowledged) >= before + 50, 60, "the client to write on the target")
    finally:
        client.stop()
    assert not client.failures
    rows = target_server.query("SELECT id FROM orders", dbname=credentials["database"])
    assert set(client.acknowledged) <= {row[0] for row in rows}


def test_an_abort_during_the_copy_leaves_the_source_serving(fleet, admin_rest, move_servers, shards) -> None:
    """The move is held in Copying by a tenant transaction that stays open (a replication slot waits for
    the transactions running when it is made); the abort requested meanwhile undoes the move."""
    source_server, target_server = move_servers
    source, target = shards
    database = fleet.database("mv-aborted")
    fleet.wait_phase(database, "Ready")
    c = fleet.credentials(database)
    tenant = c["database"]
    holder = held_open(source_server, c)

    with requested_move(fleet, admin_rest, database, target) as name:
        waiting_for_slot(source_server)
        with requested_move(fleet, admin_rest, database, target) as second:  # one move of a Database at a time
            failed = wait_for(lambda: failed_status(admin_rest, second), 60, "the second move to fail")
            assert f"DatabaseMove {name} of the same Database came first" in condition(failed, "Ready")["message"]
        admin_rest.patch(DATABASE_MOVES, name, {"spec": {"abort": True}}, NAMESPACE)
        holder.commit()

        def phase() -> str | None:
            return (admin_rest.get(DATABASE_MOVES, name, NAMESPACE).get("status") or {}).get("phase")

        wait_for(lambda: phase() == "Aborted", 120, "the move to be aborted")
        assert fleet.get_database(database)["status"]["shard"] == source
        assert can_connect(source_server, c["user"], c["password"], tenant)
        assert source_server.query("SELECT count(*) FROM pg_publication", dbname=tenant) == [(0,)]
        assert source_server.query("SELECT count(*) FROM pg_replication_slots") == [(0,)]
        assert target_server.query("SELECT count(*) FROM pg_database WHERE datname = %s", (tenant,)) == [(0,)]
        assert target_server.query("SELECT count(*) FROM pg_roles WHERE rolname = %s", (tenant,)) == [(0,)]
        assert source_server.query("SELECT id FROM orders", dbname=tenant) == [(0,)]
    holder.close()


def test_a_rotation_with_an_overlap_during_the_copy_ends_the_move_before_its_cutover(
    fleet, admin_rest, move_servers, shards
) -> None:
    source_server, target_server = move_servers
    source, target = shards
    database = fleet.database("mv-rotated")
    fleet.wait_phase(database, "Ready")
    c = fleet.credentials(database)
    tenant = c["database"]
    holder = held_open(source_server, c)

    with requested_move(fleet, admin_rest, database, target) as name:
        waiting_for_slot(source_server)
        stamp = now_stamp()
        annotations = {ANNOTATION_ROTATE_REQUESTED_AT: stamp, ANNOTATION_ROTATE_OVERLAP: "600"}
        admin_rest.patch(DATABASES, database, {"metadata": {"annotations": annotations}}, NAMESPACE)
        fleet.wait_database(database, lambda db: db["status"].get("rotationApplied") == stamp, 60, "the rotation")
        holder.commit()

        failed = wait_for(lambda: failed_status(admin_rest, name), 120, f"move {name} to fail")
        assert "aborted before the cutover" in condition(failed, "Ready")["message"]
        assert fleet.get_database(database)["status"]["shard"] == source
        new = fleet.credentials(database)
        assert new["user"] != c["user"] and can_connect(source_server, new["user"], new["password"], tenant)
        assert can_connect(source_server, c["user"], c["password"], tenant)  # within the overlap
        assert source_server.query("SELECT count(*) FROM pg_replication_slots") == [(0,)]
        assert target_server.query("SELECT count(*) FROM pg_database WHERE datname = %s", (tenant,)) == [(0,)]
    holder.close()


def test_the_fence_ends_the_sessions_a_retired_alternate_login_left_open(
    fleet, admin_rest, move_servers, shards
) -> None:
    source_server, _ = move_servers
    _, target = shards
    database = fleet.database("mv-alternate")
    fleet.wait_phase(database, "Ready")
    tenant = fleet.credentials(database)["database"]
    with source_server.connect(
        fleet.credentials(database)["user"], fleet.credentials(database)["password"], tenant
    ) as c:
        c.execute("CREATE TABLE orders (id bigint PRIMARY KEY)")
        c.commit()
    for i, overlap in enumerate(("3600", "1")):  # onto the alternate; back onto the tenant role, then retired
        stamp = f"{now_stamp()[:-1]}.00000{i}Z"  # two stamps, even within one second
        annotations = {ANNOTATION_ROTATE_REQUESTED_AT: stamp, ANNOTATION_ROTATE_OVERLAP: overlap}
        admin_rest.patch(DATABASES, database, {"metadata": {"annotations": annotations}}, NAMESPACE)
        fleet.wait_database(database, lambda db, s=stamp: db["status"].get("rotationApplied") == s, 60, "rotated")
        if overlap == "3600":
            alternate = fleet.credentials(database)
            session = source_server.connect(alternate["user"], alternate["password"], tenant, autocommit=True)
    fleet.wait_database(database, lambda db: not db["status"].get("retireLoginAt"), 60, "the overlap's end")
    assert not can_connect(source_server, alternate["user"], alternate["password"], tenant)
    assert session.execute("SELECT 1").fetchone() == (1,)  # retiring left it open

    with requested_move(fleet, admin_rest, database, target) as name:
        wait_for(
            lambda: (admin_rest.get(DATABASE_MOVES, name, NAMESPACE).get("status") or {}).get("phase") == "Completed",
            120,
            "the move",
        )
    with pytest.raises(psycopg.OperationalError):  # no write of it could reach the source after the fence
        session.execute("INSERT INTO orders VALUES (1)")
    session.close()


def test_a_move_that_cannot_be_done_fails_with_a_message_and_touches_no_shard(
    fleet, admin_rest, move_servers, shards
) -> None:
    source_server, target_server = move_servers
    source, target = shards
    database = fleet.database("mv-nowhere")
    fleet.wait_phase(database, "Ready")
    slots = "SELECT count(*) FROM pg_replication_slots"
    for spec_database, spec_target, message in (
        ("no-such-database", target, "no Database no-such-database"),
        (database, source, f"is on shard {source} already"),
        (database, "no-such-shard", "no valid postgres Shard no-such-shard"),
    ):
        with requested_move(fleet, admin_rest, spec_database, spec_target) as name:
            failed = wait_for(lambda: failed_status(admin_rest, name), 60, f"move {name} to fail")
            ready = condition(failed, "Ready")
            assert ready["status"] == "False" and ready["reason"] == "Failed"
            assert message in ready["message"]
    # A rotation with an overlap handed out the tenant's alternate login role: not carried by a move.
    stamp = now_stamp()
    annotations = {ANNOTATION_ROTATE_REQUESTED_AT: stamp, ANNOTATION_ROTATE_OVERLAP: "600"}
    admin_rest.patch(DATABASES, database, {"metadata": {"annotations": annotations}}, NAMESPACE)
    fleet.wait_database(database, lambda db: db["status"].get("rotationApplied") == stamp, 60, "the rotation")
    with requested_move(fleet, admin_rest, database, target) as name:
        failed = wait_for(lambda: failed_status(admin_rest, name), 60, f"move {name} to fail")
        assert "hands out its alternate login role" in condition(failed, "Ready")["message"]
    assert fleet.get_database(database)["status"]["shard"] == source
    assert source_server.query(slots) == [(0,)] and target_server.query(slots) == [(0,)]


def test_a_move_interrupted_by_a_manager_restart_is_finished_by_the_next_one(
    fleet, admin_rest, move_servers, shards, manager, start_manager
) -> None:
    source_server, target_server = move_servers
    source, target = shards
    database = fleet.database("mv-restarted")
    fleet.wait_phase(database, "Ready")
    c = fleet.credentials(database)
    holder = held_open(source_server, c)
    with requested_move(fleet, admin_rest, database, target) as name:
        waiting_for_slot(source_server)
        stopping = threading.Thread(target=manager.stop)
        stopping.start()  # its sessions are cut; the step in flight ends with the transaction below
        holder.commit()
        stopping.join(120)
        holder.close()
        interrupted = admin_rest.get(DATABASE_MOVES, name, NAMESPACE)["status"]["phase"]
        assert interrupted in ("Copying", "CatchingUp", "CuttingOver")

        start_manager()

        def completed() -> bool:
            status = admin_rest.get(DATABASE_MOVES, name, NAMESPACE).get("status") or {}
            assert status.get("phase") != "Failed", status
            return status.get("phase") == "Completed"

        wait_for(completed, 180, "the next manager to finish the move")
    assert fleet.get_database(database)["status"]["shard"] == target
    assert target_server.query("SELECT id FROM orders", dbname=c["database"]) == [(0,)]
    assert source_server.query("SELECT count(*) FROM pg_replication_slots") == [(0,)]
