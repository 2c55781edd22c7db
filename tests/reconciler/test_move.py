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
from domain.resources import DATABASE_MOVES, DATABASES, SHARDS
from harness import PostgresServer
from informers import LEASES
from reconciler.move.controller import MoveController
from reconciler.sql import move as move_sql
from reconciler.sql import move_offline as move_offline_sql
from tests.reconciler.conftest import NAMESPACE, install_config, wait_events
from tests.sql.conftest import LogicalPool
from tests.sql.helpers import can_connect
from tests.sql.test_move_privileges import source_grant, target_grant
from tests.support.common import condition, now_stamp, wait_for
from tests.support.postgres import PostgresPool

pytestmark = pytest.mark.server


@contextlib.contextmanager
def servers_for_moves(source: str, target: str) -> Iterator[tuple[PostgresServer, PostgresServer]]:
    """A server of each major with wal_level=logical, each given the one-time grants of online moves.

    Moves left `Completed` by the tests keep their streams back (their objects are removed before the
    window's end): the servers have room for more of them than PostgreSQL's defaults (slots, WAL
    senders, subscription workers and replication origins)."""
    room = {"max_replication_slots": "24", "max_wal_senders": "24", "max_logical_replication_workers": "24"}
    room["max_worker_processes"] = "32"

    def settings(major: str) -> dict[str, str]:
        origins = {"max_active_replication_origins": "24"} if int(major) >= 18 else {}
        return {**LogicalPool.SETTINGS, **room, **origins}

    pools = PostgresPool(settings=settings(source)), PostgresPool(settings=settings(target))
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


def create_orders(server: PostgresServer, c: dict[str, str], rows: int = 0) -> None:
    """The tenant's table `orders` (the Client's), made with its credentials; `rows` rows of negative ids
    (which the client never writes) make a copy that takes a few seconds."""
    login: dict[str, Any] = {"host": "127.0.0.1", "port": server.port, "user": c["user"], "password": c["password"]}
    with psycopg.connect(**login, dbname=c["database"], autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, note text NOT NULL)")
        if rows:
            conn.execute("INSERT INTO orders SELECT -g, repeat('x', 200) FROM generate_series(1, %s) g", (rows,))


def every_row_moved(client: Client, servers: tuple[PostgresServer, PostgresServer], c: dict[str, str]) -> None:
    """Every row the client saw committed is on the target (by content); no slot is left on the source."""
    assert not client.failures
    source_server, target_server = servers
    rows = set(target_server.query("SELECT id, note FROM orders WHERE id > 0", dbname=c["database"]))
    assert {(i, f"order {i}") for i in client.acknowledged} <= rows
    assert source_server.query("SELECT count(*) FROM pg_replication_slots") == [(0,)]


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


def sample(manager, name: str, **labels: str) -> float:
    """A sample of the manager's metrics registry (0 when absent)."""
    return manager.manager.metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_database_move_completes_online_and_the_credentials_follow(
    fleet, admin_rest, move_servers, shards, manager
) -> None:
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
            gauged: set[str] = set()  # the phases dbprovider_moves showed a move in

            def completed() -> bool:
                status = admin_rest.get(DATABASE_MOVES, name, NAMESPACE).get("status") or {}
                if status.get("phase") and status["phase"] not in phases:
                    phases.append(status["phase"])
                gauged.update(p for p in ("Copying", "CatchingUp") if sample(manager, "dbprovider_moves", phase=p))
                assert status.get("phase") != "Failed", status
                return status.get("phase") == "Completed"

            wait_for(completed, 180, "the move to complete", max_interval=0.05)
            status = admin_rest.get(DATABASE_MOVES, name, NAMESPACE)["status"]
            assert status["sourceShard"] == source and status["targetShard"] == target
            assert 0 < status["writePauseSeconds"] < 30
            assert condition({"status": status}, "Ready")["status"] == "True"
            assert phases[-1] == "Completed" and "CatchingUp" in phases
            wait_events(admin_rest, name, {"MoveStarted", "MoveCompleted"})
            # The metrics moved with it: the gauge saw it running, the counter and the histogram its end.
            assert "CatchingUp" in gauged
            assert sample(manager, "dbprovider_moves_finished_total", outcome="Completed") == 1
            assert sample(manager, "dbprovider_move_write_pause_seconds_count", mode="Online") == 1
            pause = sample(manager, "dbprovider_move_write_pause_seconds_sum", mode="Online")
            assert pause == pytest.approx(status["writePauseSeconds"], abs=0.01)
            wait_for(lambda: sample(manager, "dbprovider_moves", phase="Completed") == 1, 30, "the gauge")

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


def test_an_abort_during_the_copy_leaves_the_source_serving(fleet, admin_rest, move_servers, shards, manager) -> None:
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
        wait_events(admin_rest, name, {"MoveStarted", "MoveAborted"})
        assert sample(manager, "dbprovider_moves_finished_total", outcome="Aborted") == 1
        assert fleet.get_database(database)["status"]["shard"] == source
        assert can_connect(source_server, c["user"], c["password"], tenant)
        assert source_server.query("SELECT count(*) FROM pg_publication", dbname=tenant) == [(0,)]
        assert source_server.query("SELECT count(*) FROM pg_replication_slots") == [(0,)]
        assert target_server.query("SELECT count(*) FROM pg_database WHERE datname = %s", (tenant,)) == [(0,)]
        assert target_server.query("SELECT count(*) FROM pg_roles WHERE rolname = %s", (tenant,)) == [(0,)]
        assert source_server.query("SELECT id FROM orders", dbname=tenant) == [(0,)]
    holder.close()


def test_kubectl_get_shows_a_copy_part_way_then_complete(fleet, admin_rest, move_servers, shards, manager) -> None:
    """One table's copy is held on the target (a lock its copy waits for) while the others finish: the
    status shows part of the tables copied and the sizes; once let go, every table and Completed."""
    source_server, target_server = move_servers
    source, target = shards
    database = fleet.database("mv-progress")
    fleet.wait_phase(database, "Ready")
    c = fleet.credentials(database)
    holder = held_open(source_server, c)  # the move waits in Copying, its schema copied, until committed
    login = {"host": "127.0.0.1", "port": source_server.port, "user": c["user"], "password": c["password"]}
    with psycopg.connect(**login, dbname=c["database"], autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, note text NOT NULL)")
        conn.execute("CREATE TABLE notes (id bigint PRIMARY KEY, note text NOT NULL)")
        conn.execute("INSERT INTO items SELECT g, repeat('x', 100) FROM generate_series(1, 2000) g")
        conn.execute("INSERT INTO notes SELECT g, repeat('y', 100) FROM generate_series(1, 2000) g")
    lock: psycopg.Connection | None = None

    def status_of(name: str) -> dict[str, Any]:
        found = admin_rest.get(DATABASE_MOVES, name, NAMESPACE).get("status") or {}
        assert found.get("phase") not in ("Failed", "Aborted"), found
        return found

    try:
        with requested_move(fleet, admin_rest, database, target) as name:
            waiting_for_slot(source_server)
            lock = target_server.superuser_connection(c["database"])  # made by the move's Copying
            lock.autocommit = False
            lock.execute("LOCK TABLE items IN SHARE MODE")  # the copy of `items` into the target waits
            holder.commit()

            def part_way() -> dict[str, Any] | None:
                now = status_of(name)
                total = now.get("tablesTotal") or 0
                return now if total > 2 and now.get("tablesCopied") == total - 1 else None

            mid = wait_for(part_way, 120, "every table but the held one copied")
            assert mid["phase"] == "CatchingUp"
            assert mid["sourceBytes"] > 0 and mid["targetBytes"] > 0
            assert mid["progress"].startswith(f"{mid['tablesTotal'] - 1}/{mid['tablesTotal']} tables, ")
            assert mid["progress"].endswith(f" of {mid['sourceBytes'] / 2**20:.0f} MiB")
            lock.rollback()

            done = wait_for(lambda: (now := status_of(name)).get("phase") == "Completed" and now, 120, "Completed")
            assert done["tablesCopied"] == done["tablesTotal"] == mid["tablesTotal"]
            assert done["targetBytes"] > 0 and done["sourceBytes"] == mid["sourceBytes"]
            assert done["progress"].startswith(f"{done['tablesTotal']}/{done['tablesTotal']} tables, ")
        assert target_server.query("SELECT count(*) FROM items", dbname=c["database"]) == [(2000,)]
    finally:
        if lock is not None:
            lock.close()
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


def test_a_database_on_its_alternate_login_role_moves_online_rolls_back_and_moves_offline(
    fleet, admin_rest, move_servers, shards
) -> None:
    """A rotation with a short overlap handed out the tenant's alternate login role: the move requested
    within the overlap waits for its end, then carries the alternate (acting as the tenant, with the
    same password); the client writing with it loses nothing. A rotation on the target hands out the
    tenant role again: the rollback requested within that overlap waits too, then carries the tenant
    role back; an offline move after it carries it again."""
    source_server, target_server = move_servers
    source, target = shards
    database = fleet.database("mv-on-alt")
    fleet.wait_phase(database, "Ready")
    create_orders(source_server, fleet.credentials(database))
    stamp = now_stamp()
    annotations = {ANNOTATION_ROTATE_REQUESTED_AT: stamp, ANNOTATION_ROTATE_OVERLAP: "8"}
    admin_rest.patch(DATABASES, database, {"metadata": {"annotations": annotations}}, NAMESPACE)
    fleet.wait_database(database, lambda db: db["status"].get("rotationApplied") == stamp, 60, "the rotation")
    c = fleet.credentials(database)
    tenant = c["database"]

    def serves(server: PostgresServer) -> None:
        """The alternate's credentials log in on `server` acting as the tenant; the tenant role does not."""
        with server.connect(c["user"], c["password"], tenant) as conn:
            assert conn.execute("SELECT session_user, current_user").fetchone() == (c["user"], tenant)
        assert not can_connect(server, tenant, c["password"], tenant)

    def on(server: PostgresServer) -> dict[str, str]:
        wait_for(lambda: fleet.credentials(database)["port"] == str(server.port), 60, "the Secret's port")
        moved = fleet.credentials(database)
        assert (moved["user"], moved["password"]) == (c["user"], c["password"])
        return moved

    client = Client(c)
    client.start()
    try:
        with requested_move(fleet, admin_rest, database, target) as name:  # requested within the overlap
            seen: list[str] = []
            wait_for(lambda: move_phase(admin_rest, name, seen) == "Completed", 180, "the move", max_interval=0.05)
            assert seen[0] == "Pending"  # until the overlap ended
            assert admin_rest.get(DATABASE_MOVES, name, NAMESPACE)["status"]["mode"] == "Online"
            assert c["user"] == fleet.get_database(database)["status"]["loginRole"] != tenant
            client.credentials = on(target_server)
            serves(target_server)
            before = len(client.acknowledged)
            wait_for(lambda: len(client.acknowledged) >= before + 30, 60, "the client to write on the target")

            # On the target a rotation with an overlap hands out the tenant role again; the rollback
            # requested within the overlap waits for its end, then carries the tenant role.
            stamp = now_stamp()
            annotations = {ANNOTATION_ROTATE_REQUESTED_AT: stamp, ANNOTATION_ROTATE_OVERLAP: "8"}
            admin_rest.patch(DATABASES, database, {"metadata": {"annotations": annotations}}, NAMESPACE)
            fleet.wait_database(database, lambda db: db["status"].get("rotationApplied") == stamp, 60, "the rotation")
            alternate, c = c, fleet.credentials(database)
            assert c["user"] == tenant and can_connect(target_server, alternate["user"], alternate["password"], tenant)
            client.credentials = c
            admin_rest.patch(DATABASE_MOVES, name, {"spec": {"rollback": True}}, NAMESPACE)

            def waits() -> bool:
                found = condition(admin_rest.get(DATABASE_MOVES, name, NAMESPACE), "Rollback")
                return found is not None and "waits for the rotation's overlap" in found["message"]

            wait_for(waits, 30, "the rollback to wait for the overlap's end")
            wait_for(lambda: move_phase(admin_rest, name, []) == "RolledBack", 180, "the rollback", max_interval=0.05)
            client.credentials = on(source_server)
            with source_server.connect(tenant, c["password"], tenant) as conn:
                assert conn.execute("SELECT session_user, current_user").fetchone() == (tenant, tenant)
            assert not can_connect(source_server, alternate["user"], alternate["password"], tenant)
            before = len(client.acknowledged)
            wait_for(lambda: len(client.acknowledged) >= before + 30, 60, "the client to write on the source")
        acknowledged = list(client.acknowledged)  # before the rows are read: the client goes on writing
        rows = set(source_server.query("SELECT id, note FROM orders WHERE id > 0", dbname=tenant))
        assert {(i, f"order {i}") for i in acknowledged} <= rows

        with requested_move(fleet, admin_rest, database, target, mode="Offline") as name:
            wait_for(lambda: move_phase(admin_rest, name, []) == "Completed", 180, "the offline move")
            client.credentials = on(target_server)
            assert can_connect(target_server, tenant, c["password"], tenant)
            assert not can_connect(target_server, alternate["user"], alternate["password"], tenant)
            before = len(client.acknowledged)
            wait_for(lambda: len(client.acknowledged) >= before + 30, 60, "the client to write on the target")
    finally:
        client.stop()
    assert not client.failures
    rows = set(target_server.query("SELECT id, note FROM orders WHERE id > 0", dbname=tenant))
    assert {(i, f"order {i}") for i in client.acknowledged} <= rows
    assert condition(fleet.wait_phase(database, "Ready"), "Ready")["status"] == "True"


def test_a_move_that_cannot_be_done_fails_with_a_message_and_touches_no_shard(
    fleet, admin_rest, move_servers, shards, manager
) -> None:
    source_server, target_server = move_servers
    source, target = shards
    database = fleet.database("mv-nowhere")
    fleet.wait_phase(database, "Ready")
    # Its own slots only: the moves of other tests keep streams back to their sources.
    slots = "SELECT count(*) FROM pg_replication_slots WHERE database = %s"
    tenant = (fleet.credentials(database)["database"],)
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
            wait_events(admin_rest, name, {"MoveFailed"})
    assert sample(manager, "dbprovider_moves_finished_total", outcome="Failed") == 3
    # A rotation's overlap is running (both login roles work): a move carries only the one handed out,
    # so it waits for the overlap's end.
    stamp = now_stamp()
    annotations = {ANNOTATION_ROTATE_REQUESTED_AT: stamp, ANNOTATION_ROTATE_OVERLAP: "600"}
    admin_rest.patch(DATABASES, database, {"metadata": {"annotations": annotations}}, NAMESPACE)
    fleet.wait_database(database, lambda db: db["status"].get("rotationApplied") == stamp, 60, "the rotation")
    with requested_move(fleet, admin_rest, database, target) as name:

        def waiting() -> dict | None:
            found = admin_rest.get(DATABASE_MOVES, name, NAMESPACE)
            ready = condition(found, "Ready")
            return found if ready is not None and ready["reason"] == "Pending" else None

        pending = wait_for(waiting, 60, f"move {name} to wait")
        assert pending["status"]["phase"] == "Pending"
        assert "is in a rotation's overlap" in condition(pending, "Ready")["message"]
    assert fleet.get_database(database)["status"]["shard"] == source
    assert source_server.query(slots, tenant) == [(0,)] and target_server.query(slots, tenant) == [(0,)]


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


def move_phase(admin_rest, name: str, seen: list[str]) -> str | None:
    """The DatabaseMove's phase, recorded in `seen` when new; a Failed move fails the test."""
    status = admin_rest.get(DATABASE_MOVES, name, NAMESPACE).get("status") or {}
    phase = status.get("phase")
    if phase and phase not in seen:
        seen.append(phase)
    assert phase != "Failed", status
    return phase


def test_a_completed_move_rolls_back_with_the_client_writing(fleet, admin_rest, move_servers, shards) -> None:
    """After the move the source is kept current by the stream back; spec.rollback brings the
    Database back there with every row written on the target, and the target's copy is dropped."""
    source_server, target_server = move_servers
    source, target = shards
    database = fleet.database("mv-back")
    fleet.wait_phase(database, "Ready")
    credentials = fleet.credentials(database)
    tenant = credentials["database"]
    with held_open(source_server, credentials) as holder:  # the table `orders` and its row 0
        holder.commit()
    client = Client(credentials)
    client.start()
    try:
        with requested_move(fleet, admin_rest, database, target) as name:
            seen: list[str] = []
            wait_for(lambda: move_phase(admin_rest, name, seen) == "Completed", 180, "the move", max_interval=0.05)
            status = admin_rest.get(DATABASE_MOVES, name, NAMESPACE)["status"]
            assert status["rollbackUntil"] > status["completedAt"]
            assert condition({"status": status}, "Rollback")["reason"] == "WindowOpen"
            wait_for(lambda: fleet.credentials(database)["port"] == str(target_server.port), 60, "the Secret's port")
            before = len(client.acknowledged)
            client.credentials = fleet.credentials(database)
            wait_for(lambda: len(client.acknowledged) >= before + 50, 60, "the client to write on the target")

            admin_rest.patch(DATABASE_MOVES, name, {"spec": {"rollback": True}}, NAMESPACE)
            wait_for(lambda: move_phase(admin_rest, name, seen) == "RolledBack", 180, "the rollback", max_interval=0.05)
            assert seen[-2:] == ["RollingBack", "RolledBack"]
            rolled = admin_rest.get(DATABASE_MOVES, name, NAMESPACE)
            assert condition(rolled, "Rollback")["reason"] == "RolledBack"
            assert condition(rolled, "Ready")["reason"] == "RolledBack"
            wait_events(admin_rest, name, {"MoveRollbackStarted", "MoveRolledBack"})

            # The Database names the source again; its Secret follows; the target's copy is gone.
            assert fleet.get_database(database)["status"]["shard"] == source
            wait_for(lambda: fleet.credentials(database)["port"] == str(source_server.port), 60, "the Secret's port")
            back = fleet.credentials(database)
            assert can_connect(source_server, back["user"], back["password"], tenant)
            assert target_server.query("SELECT count(*) FROM pg_database WHERE datname = %s", (tenant,)) == [(0,)]
            assert condition(fleet.wait_phase(database, "Ready"), "Ready")["status"] == "True"
            before = len(client.acknowledged)
            client.credentials = back
            wait_for(lambda: len(client.acknowledged) >= before + 50, 60, "the client to write on the source")
    finally:
        client.stop()
    assert not client.failures
    rows = {row[0] for row in source_server.query("SELECT id FROM orders", dbname=tenant)}
    assert set(client.acknowledged) <= rows
    for server in move_servers:
        assert server.query("SELECT count(*) FROM pg_replication_slots WHERE database = %s", (tenant,)) == [(0,)]


def shards_with_window(fleet, move_servers, start_manager, monkeypatch, window: str) -> tuple[str, str]:
    """A manager whose moves keep the source's copy for `window`, and a source and a target Shard on
    `move_servers` (as the `shards` fixture makes them); their names."""
    source_server, target_server = move_servers
    monkeypatch.setenv("DBPROVIDER_PG_DUMP", str(target_server.bin_dir / "pg_dump"))
    start_manager(install_config(moves={"rollbackWindow": window}))
    source, target = shard(fleet, source_server, True), shard(fleet, target_server, False)
    fleet.wait_shard(source, "Ok")
    fleet.wait_shard(target, "Ok")
    return source, target


def test_the_window_end_drops_the_source_copy_and_a_deleted_move_waits_for_it(
    fleet, admin_rest, move_servers, start_manager, monkeypatch
) -> None:
    """A deleted Completed move keeps the source's copy until its window ends (its finalizer); then the
    stream back is ended, the copy dropped and the object goes. The database serves on the target."""
    source_server, target_server = move_servers
    source, target = shards_with_window(fleet, move_servers, start_manager, monkeypatch, "20s")
    database = fleet.database("mv-window")
    fleet.wait_phase(database, "Ready")
    c = fleet.credentials(database)
    tenant = c["database"]
    exists = "SELECT count(*) FROM pg_database WHERE datname = %s"
    with requested_move(fleet, admin_rest, database, target) as name:
        wait_for(lambda: move_phase(admin_rest, name, []) == "Completed", 180, "the move")
        admin_rest.delete(DATABASE_MOVES, name, NAMESPACE)
        assert admin_rest.get(DATABASE_MOVES, name, NAMESPACE)["metadata"]["deletionTimestamp"]
        assert source_server.query(exists, (tenant,)) == [(1,)]  # kept within the window
        wait_for(lambda: gone(admin_rest, name), 120, "the window to end and the move to go")
    assert source_server.query(exists, (tenant,)) == [(0,)]
    assert source_server.query("SELECT count(*) FROM pg_roles WHERE rolname = %s", (tenant,)) == [(0,)]
    assert target_server.query("SELECT count(*) FROM pg_replication_slots WHERE database = %s", (tenant,)) == [(0,)]
    assert target_server.query("SELECT count(*) FROM pg_publication", dbname=tenant) == [(0,)]
    assert fleet.get_database(database)["status"]["shard"] == target
    assert can_connect(target_server, c["user"], c["password"], tenant)


def test_a_database_deleted_within_the_window_ends_the_stream_back_and_keeps_the_source_copy(
    fleet, admin_rest, move_servers, shards
) -> None:
    """The stream back's slot would keep the target's database from being dropped: a Database being
    deleted ends it; the source's copy stays until the window ends, and a rollback is refused."""
    source_server, target_server = move_servers
    source, target = shards
    database = fleet.database("mv-deleted")
    fleet.wait_phase(database, "Ready")
    tenant = fleet.credentials(database)["database"]
    with requested_move(fleet, admin_rest, database, target) as name:
        wait_for(lambda: move_phase(admin_rest, name, []) == "Completed", 180, "the move")
        slots = "SELECT count(*) FROM pg_replication_slots WHERE database = %s"
        assert target_server.query(slots, (tenant,)) == [(1,)]
        fleet.request_delete(database)

        def stream_ended() -> dict[str, Any] | None:
            found = condition(admin_rest.get(DATABASE_MOVES, name, NAMESPACE), "Rollback")
            return found if found["reason"] == "DatabaseDeleted" else None

        wait_for(stream_ended, 60, "the stream back to end")
        assert target_server.query(slots, (tenant,)) == [(0,)]
        subscriptions = "SELECT count(*) FROM pg_subscription JOIN pg_database d ON d.oid = subdbid WHERE datname = %s"
        assert source_server.query(subscriptions, (tenant,)) == [(0,)]
        assert source_server.query("SELECT count(*) FROM pg_database WHERE datname = %s", (tenant,)) == [(1,)]
        admin_rest.patch(DATABASE_MOVES, name, {"spec": {"rollback": True}}, NAMESPACE)

        def refused() -> dict[str, Any] | None:
            found = condition(admin_rest.get(DATABASE_MOVES, name, NAMESPACE), "Rollback")
            return found if found["reason"] == "RollbackRefused" else None

        assert "is being deleted" in wait_for(refused, 60, "the refusal")["message"]
        assert move_phase(admin_rest, name, []) == "Completed"


def test_a_source_shard_deleted_within_the_window_ends_the_stream_back_and_the_move_can_go(
    fleet, admin_rest, move_servers, start_manager, monkeypatch
) -> None:
    """The source Shard object is deleted within the window: its copy is out of the provider's reach.
    The stream back is ended on the target (no slot holds its WAL) before the window's end, the
    Rollback condition and an Event say so, a rollback is refused with that message, and the deleted
    DatabaseMove goes. The database serves on the target."""
    source_server, target_server = move_servers
    source, target = shards_with_window(fleet, move_servers, start_manager, monkeypatch, "90s")
    database = fleet.database("mv-no-source")
    fleet.wait_phase(database, "Ready")
    c = fleet.credentials(database)
    tenant = c["database"]
    slots = "SELECT count(*) FROM pg_replication_slots WHERE database = %s"
    try:
        with requested_move(fleet, admin_rest, database, target) as name:
            wait_for(lambda: move_phase(admin_rest, name, []) == "Completed", 180, "the move")
            assert target_server.query(slots, (tenant,)) == [(1,)]
            admin_rest.patch(SHARDS, source, {"metadata": {"finalizers": None}})
            admin_rest.delete(SHARDS, source)

            def rollback_reason(reason: str) -> dict[str, Any] | None:
                found = admin_rest.get(DATABASE_MOVES, name, NAMESPACE)
                return found if condition(found, "Rollback")["reason"] == reason else None

            ended = wait_for(lambda: rollback_reason("SourceShardGone"), 60, "the stream back to end")
            assert ended["status"]["sourceDroppedAt"] < ended["status"]["rollbackUntil"]  # not at the window's end
            message = condition(ended, "Rollback")["message"]
            assert f"shard {source} was deleted" in message
            wait_events(admin_rest, name, {"MoveSourceShardGone"})
            assert target_server.query(slots, (tenant,)) == [(0,)]
            assert target_server.query("SELECT count(*) FROM pg_publication", dbname=tenant) == [(0,)]
            replication = "SELECT rolreplication FROM pg_roles WHERE rolname = %s"
            assert target_server.query(replication, (c["user"],)) == [(False,)]

            admin_rest.patch(DATABASE_MOVES, name, {"spec": {"rollback": True}}, NAMESPACE)
            refused = wait_for(lambda: rollback_reason("RollbackRefused"), 60, "the rollback refused")
            assert condition(refused, "Rollback")["message"] == message
            assert refused["status"]["phase"] == "Completed"
            wait_events(admin_rest, name, {"MoveRollbackRefused"})

            admin_rest.delete(DATABASE_MOVES, name, NAMESPACE)
            wait_for(lambda: gone(admin_rest, name), 60, "the deleted move to go")
        assert fleet.get_database(database)["status"]["shard"] == target
        assert can_connect(target_server, c["user"], c["password"], tenant)
    finally:  # the subscription the provider can no longer reach, ended as its server's administrator would
        with source_server.superuser_connection(tenant) as conn:
            move_sql.drop_subscription(conn)


def gone(admin_rest, name: str) -> bool:
    """Whether the DatabaseMove `name` is gone."""
    try:
        admin_rest.get(DATABASE_MOVES, name, NAMESPACE)
    except ApiException as exc:
        return exc.status == 404
    return False


class Held:
    """A replica's move controller held once: right after it recorded `phase` (before any of its SQL
    runs), or, with `inside`, at the first call of that step function (of module `where`) in that phase.
    Every fence check of its move sessions is recorded: (monotonic time, whether it let SQL through)."""

    def __init__(self, logic: MoveController, phase: str, inside: tuple[Any, str] | None, monkeypatch) -> None:
        self.phase = phase
        self.reached = threading.Event()
        self.resume = threading.Event()
        self.resumed = threading.Event()  # the held worker went on (and its held step, if any, returned)
        self.step_raised: BaseException | None = None
        self.checks: list[tuple[float, bool]] = []
        fence = logic.fence
        assert fence is not None

        def hold() -> None:
            self.reached.set()
            self.resume.wait(300)

        if inside is None:
            record = logic._phase

            def at_boundary(obj, phase, message, **fields):  # type: ignore[no-untyped-def]
                written = record(obj, phase, message, **fields)
                if phase == self.phase and not self.reached.is_set():
                    hold()
                    self.resumed.set()
                return written

            monkeypatch.setattr(logic, "_phase", at_boundary)
        else:
            module, name = inside
            step = getattr(module, name)

            def in_step(*args, **kwargs):  # type: ignore[no-untyped-def]
                if self.reached.is_set():
                    return step(*args, **kwargs)  # the next leader's call
                hold()
                try:
                    return step(*args, **kwargs)
                except BaseException as exc:
                    self.step_raised = exc
                    raise
                finally:
                    self.resumed.set()

            monkeypatch.setattr(module, name, in_step)

        def checked() -> None:
            try:
                fence()
            except Exception:
                self.checks.append((time.monotonic(), False))
                raise
            self.checks.append((time.monotonic(), True))

        monkeypatch.setattr(logic, "fence", checked)
        self.inside = inside

    def woken_sends_nothing(self, lost_at: float) -> None:
        """Woken after its Lease was lost (at monotonic `lost_at`), the worker sends no SQL: held at a
        phase's boundary, its next step asks the fence and is refused; held inside a step, that step
        fails (its sessions were cut with the Lease)."""
        self.resume.set()
        assert self.resumed.wait(30)
        if self.inside is None:
            wait_for(lambda: any(t > lost_at and not ok for t, ok in self.checks), 30, "the old worker's refusal")
        else:
            assert self.step_raised is not None
        assert not [t for t, ok in self.checks if ok and t > lost_at], "SQL from a replica without the Lease"


def lose_lease(fleet, admin_rest, manager) -> float:
    """The leader loses its Lease to another holder and never campaigns again, as a killed replica;
    when (monotonic time)."""
    take_lease(admin_rest, f"{fleet.release.name}-manager")
    wait_for(lambda: not manager.manager.is_leading(), 30, "the old leader to step down")
    assert manager.manager.elector is not None
    manager.manager.elector.stop(release=False)
    return time.monotonic()


def next_leader(start_manager) -> None:
    """Another replica, leading once the taken Lease has run out."""
    successor = start_manager(wait_leading=False)
    wait_for(successor.manager.controllers_running, 60, "the next replica to lead (after 4 s)")


def take_lease(rest, name: str) -> None:
    """Another holder writes the Lease (held for 4 s), as a replica that took over would; the leader's
    renewals may come first (a conflict): then it is read and written again."""

    def taken() -> bool:
        lease = rest.get(LEASES, name, NAMESPACE)
        lease["spec"].update(holderIdentity="intruder", leaseDurationSeconds=4)
        try:
            rest.replace(LEASES, lease)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return False
        return True

    wait_for(taken, 30, "the Lease written by another holder")


@pytest.mark.parametrize(
    ("mode", "phase", "inside", "then"),
    [
        ("Online", "Preflight", None, "Completed"),
        ("Online", "Copying", None, "Completed"),
        ("Online", "CatchingUp", None, "Completed"),
        ("Online", "CuttingOver", None, "Completed"),
        # the source fenced, the last changes not yet over: finished, or aborted (the source reopened)
        ("Online", "CuttingOver", (move_sql, "mark"), "Completed"),
        ("Online", "CuttingOver", (move_sql, "mark"), "Aborted"),
        ("Offline", "Copying", None, "Completed"),
        # the source closed for the copy: finished, or aborted (the source reopened)
        ("Offline", "Copying", (move_offline_sql, "copy_database"), "Completed"),
        ("Offline", "Copying", (move_offline_sql, "copy_database"), "Aborted"),
    ],
    ids=lambda value: value[1] if isinstance(value, tuple) else str(value),
)
def test_a_leader_that_loses_its_lease_in_any_phase_sends_no_more_sql_and_the_next_leader_finishes(
    mode, phase, inside, then, fleet, admin_rest, move_servers, shards, manager, start_manager, monkeypatch
) -> None:
    """The leader is held in the phase (right after recording it, or inside one of its steps), then loses
    its Lease (another holder takes it) and never leads again, as a killed replica. The next leader takes
    the move up in that phase and completes it while the client writes; every row the client saw
    committed is on the target. Or an abort is requested while no replica leads: the next leader aborts,
    and the source serves with every row. Woken afterwards, the old replica's worker sends nothing."""
    source_server, target_server = move_servers
    source, target = shards
    suffix = ("-in" if inside else "") + ("-ab" if then == "Aborted" else "")
    database = fleet.database(f"mv-lease-{mode[:3].lower()}-{phase.lower()}{suffix}")
    fleet.wait_phase(database, "Ready")
    c = fleet.credentials(database)
    create_orders(source_server, c)
    hold = Held(manager.controllers.moves, phase, inside, monkeypatch)
    client = Client(c)
    client.start()
    try:
        wait_for(lambda: len(client.acknowledged) >= 20, 30, "the client to write")
        with requested_move(fleet, admin_rest, database, target, mode=mode) as name:
            assert hold.reached.wait(120), f"the move to reach {phase}"
            assert admin_rest.get(DATABASE_MOVES, name, NAMESPACE)["status"]["phase"] == phase
            lost_at = lose_lease(fleet, admin_rest, manager)
            if then == "Aborted":
                admin_rest.patch(DATABASE_MOVES, name, {"spec": {"abort": True}}, NAMESPACE)
            next_leader(start_manager)

            def ended() -> bool:
                status = admin_rest.get(DATABASE_MOVES, name, NAMESPACE).get("status") or {}
                assert status.get("phase") not in {"Failed", "Aborted", "Completed"} - {then}, status
                return status.get("phase") == then

            wait_for(ended, 180, f"the next leader to end the move {then}")
            status = admin_rest.get(DATABASE_MOVES, name, NAMESPACE)["status"]
            assert status["mode"] == mode and status["targetShard"] == target
            if then == "Aborted":  # the client writes on the source again
                written = len(client.acknowledged)
                wait_for(lambda: len(client.acknowledged) >= written + 20, 60, "the client to write on the source")

            hold.woken_sends_nothing(lost_at)
    finally:
        hold.resume.set()
        client.stop()
    if then == "Aborted":
        assert not client.failures
        assert fleet.get_database(database)["status"]["shard"] == source
        rows = set(source_server.query("SELECT id, note FROM orders", dbname=c["database"]))
        assert {(i, f"order {i}") for i in client.acknowledged} <= rows
        assert can_connect(source_server, c["user"], c["password"], c["database"])
        assert target_server.query("SELECT count(*) FROM pg_roles WHERE rolname = %s", (c["user"],)) == [(0,)]
        assert source_server.query("SELECT count(*) FROM pg_replication_slots") == [(0,)]
        return
    assert fleet.get_database(database)["status"]["shard"] == target
    every_row_moved(client, move_servers, c)
    assert can_connect(target_server, c["user"], c["password"], c["database"])
    assert not can_connect(source_server, c["user"], c["password"], c["database"])


@pytest.mark.parametrize(
    "inside",
    [None, (move_sql, "mark")],  # right after recording RollingBack; in the reverse cutover, the target fenced
    ids=["RollingBack", "RollingBack-fenced"],
)
def test_a_leader_that_loses_its_lease_while_rolling_back_sends_no_more_sql_and_the_next_leader_rolls_back(
    inside, fleet, admin_rest, move_servers, shards, manager, start_manager, monkeypatch
) -> None:
    """A completed move is rolled back with the client writing on the target; the leader is held in
    RollingBack (right after recording it, or in the reverse cutover once the target is fenced: then
    neither side takes a write) and loses its Lease. The next leader finishes the rollback: every row
    the client saw committed is on the source, the target takes no write any more, and the old
    replica's worker, woken, sends nothing."""
    source_server, target_server = move_servers
    source, target = shards
    database = fleet.database("mv-lease-rb" + ("-in" if inside else ""))
    fleet.wait_phase(database, "Ready")
    c = fleet.credentials(database)
    tenant = c["database"]
    create_orders(source_server, c)
    hold: Held | None = None
    client = Client(c)
    client.start()

    def writes_on(server: PostgresServer) -> None:
        wait_for(lambda: fleet.credentials(database)["port"] == str(server.port), 60, "the Secret's port")
        client.credentials = fleet.credentials(database)
        written = len(client.acknowledged)
        wait_for(lambda: len(client.acknowledged) >= written + 20, 60, f"the client to write on port {server.port}")

    try:
        with requested_move(fleet, admin_rest, database, target) as name:
            wait_for(lambda: move_phase(admin_rest, name, []) == "Completed", 180, "the move")
            writes_on(target_server)
            hold = Held(manager.controllers.moves, "RollingBack", inside, monkeypatch)  # the move's cutover is past
            admin_rest.patch(DATABASE_MOVES, name, {"spec": {"rollback": True}}, NAMESPACE)
            assert hold.reached.wait(120), "the rollback to be held"
            assert admin_rest.get(DATABASE_MOVES, name, NAMESPACE)["status"]["phase"] == "RollingBack"
            if inside is not None:
                assert not can_connect(target_server, c["user"], c["password"], tenant)
                assert not can_connect(source_server, c["user"], c["password"], tenant)
            lost_at = lose_lease(fleet, admin_rest, manager)
            next_leader(start_manager)

            wait_for(lambda: move_phase(admin_rest, name, []) == "RolledBack", 180, "the next leader's rollback")
            assert fleet.get_database(database)["status"]["shard"] == source
            writes_on(source_server)
            hold.woken_sends_nothing(lost_at)
    finally:
        if hold is not None:
            hold.resume.set()
        client.stop()
    assert not client.failures
    rows = set(source_server.query("SELECT id, note FROM orders WHERE id > 0", dbname=tenant))
    assert {(i, f"order {i}") for i in client.acknowledged} <= rows
    assert not can_connect(target_server, c["user"], c["password"], tenant)
    assert target_server.query("SELECT count(*) FROM pg_database WHERE datname = %s", (tenant,)) == [(0,)]
    for server in move_servers:
        assert server.query("SELECT count(*) FROM pg_replication_slots WHERE database = %s", (tenant,)) == [(0,)]


def test_a_target_that_stops_mid_copy_leaves_the_source_serving_and_the_move_completes_once_it_is_back(
    fleet, admin_rest, move_servers, shards, manager, monkeypatch
) -> None:
    """The target's server is killed while the data streams (the move held as it entered CatchingUp):
    the client goes on writing to the source, the move retries with the error class in its Ready
    condition, and once the server is back it completes with every acknowledged row on the target."""
    source_server = move_servers[0]
    source, _ = shards
    with PostgresServer("18", durable=True, settings=LogicalPool.SETTINGS) as target_server:  # killed below
        source_grant(target_server)
        target_grant(target_server)
        target = shard(fleet, target_server, False)
        fleet.wait_shard(target, "Ok")
        database = fleet.database("mv-target-down")
        fleet.wait_phase(database, "Ready")
        c = fleet.credentials(database)
        create_orders(source_server, c)
        hold = Held(manager.controllers.moves, "CatchingUp", None, monkeypatch)
        client = Client(c)
        client.start()
        try:
            with requested_move(fleet, admin_rest, database, target) as name:
                assert hold.reached.wait(120), "the move to reach CatchingUp"
                target_server.kill()
                hold.resume.set()

                def retrying() -> str | None:
                    status = admin_rest.get(DATABASE_MOVES, name, NAMESPACE)["status"]
                    assert status["phase"] not in ("Failed", "Aborted", "Completed"), status
                    message = condition({"status": status}, "Ready")["message"]
                    return message if message.startswith("catching up failed: ") else None

                message = wait_for(retrying, 60, "the move to report the unreachable target")
                assert message == "catching up failed: unreachable", message
                written = len(client.acknowledged)
                wait_for(lambda: len(client.acknowledged) >= written + 20, 30, "the client to go on writing")
                assert fleet.get_database(database)["status"]["shard"] == source

                target_server.restart()

                def completed() -> bool:
                    status = admin_rest.get(DATABASE_MOVES, name, NAMESPACE).get("status") or {}
                    assert status.get("phase") not in ("Failed", "Aborted"), status
                    return status.get("phase") == "Completed"

                wait_for(completed, 300, "the move to complete once the target is back")
        finally:
            hold.resume.set()
            client.stop()
        assert fleet.get_database(database)["status"]["shard"] == target
        every_row_moved(client, (source_server, target_server), c)


def rotate(fleet, admin_rest, database: str, overlap: str | None = None) -> dict[str, str]:
    """A rotation of the Database's credentials (with an overlap of `overlap` seconds); the new ones."""
    stamp = now_stamp()
    annotations = {ANNOTATION_ROTATE_REQUESTED_AT: stamp}
    if overlap is not None:
        annotations[ANNOTATION_ROTATE_OVERLAP] = overlap
    admin_rest.patch(DATABASES, database, {"metadata": {"annotations": annotations}}, NAMESPACE)
    fleet.wait_database(database, lambda db: db["status"].get("rotationApplied") == stamp, 60, "the rotation")
    return fleet.credentials(database)


def stream_login(server: PostgresServer, slot: str) -> tuple[int | None, str | None]:
    """The WAL sender streaming from `slot` on the publishing `server`: its pid and login role."""
    rows = server.query(
        "SELECT r.active_pid, a.usename FROM pg_replication_slots r JOIN pg_stat_activity a ON a.pid = r.active_pid"
        " WHERE r.slot_name = %s AND a.backend_type = 'walsender'",
        (slot,),
    )
    return (rows[0][0], rows[0][1]) if rows else (None, None)


def reconnected(server: PostgresServer, slot: str, login: str) -> None:
    """The stream's WAL sender ended (as a network failure or a restart would end it); the stream logs
    in again as `login`, with the credentials handed out."""
    pid = wait_for(lambda: stream_login(server, slot)[0], 60, "the stream to run")
    server.query("SELECT pg_terminate_backend(%s, 10000)", (pid,))
    wait_for(
        lambda: stream_login(server, slot)[0] not in (None, pid) and stream_login(server, slot)[1] == login,
        90,
        f"the stream to log in again as {login}",
    )


def writes_more(client: Client, where: str, count: int = 30) -> None:
    """The client commits `count` more rows (`where`: the server it writes to, for the message)."""
    before = len(client.acknowledged)
    wait_for(lambda: len(client.acknowledged) >= before + count, 60, f"the client to write on {where}")


def all_acknowledged_on(server: PostgresServer, client: Client, tenant: str) -> None:
    """Every row the client saw committed is on `server`, by content."""
    assert not client.failures
    rows = set(server.query("SELECT id, note FROM orders WHERE id > 0", dbname=tenant))
    assert {(i, f"order {i}") for i in client.acknowledged} <= rows


def test_a_rotation_while_the_stream_is_made_is_followed_and_the_move_completes(
    fleet, admin_rest, move_servers, shards
) -> None:
    """The credentials are rotated (without an overlap) after the move read them and before its
    subscription was made: the subscription carries the old password, which the source refuses; the
    move points it at the new one, the stream logs in, and the move completes with every row."""
    source_server, target_server = move_servers
    source, target = shards
    database = fleet.database("mv-rot-fwd")
    fleet.wait_phase(database, "Ready")
    c = fleet.credentials(database)
    tenant = c["database"]
    holder = held_open(source_server, c)  # the table `orders`; the slot waits for this transaction
    client = Client(c)
    try:
        with requested_move(fleet, admin_rest, database, target) as name:
            waiting_for_slot(source_server)
            client.credentials = rotate(fleet, admin_rest, database)
            client.start()
            holder.commit()
            reconnected(source_server, move_sql.slot_name(tenant), tenant)
            wait_for(lambda: len(client.acknowledged) >= 50, 60, "the client to write")
            wait_for(lambda: move_phase(admin_rest, name, []) == "Completed", 180, "the move", max_interval=0.05)
            wait_events(admin_rest, name, {"MoveStreamCredentials"})
            wait_for(lambda: fleet.credentials(database)["port"] == str(target_server.port), 60, "the Secret's port")
            client.credentials = fleet.credentials(database)
            writes_more(client, "the target")
    finally:
        client.stop()
        holder.close()
    all_acknowledged_on(target_server, client, tenant)


def test_rotations_within_the_window_are_followed_by_the_stream_back_and_the_rollback_loses_nothing(
    fleet, admin_rest, move_servers, shards
) -> None:
    """Within the rollback window a rotation without an overlap, then one with an overlap through the
    previous login role's retirement: after each, the stream back's WAL sender is ended on the target,
    and the stream logs in again with the credentials handed out; the rollback then brings every row
    the client wrote back to the source."""
    source_server, target_server = move_servers
    source, target = shards
    database = fleet.database("mv-rot-back")
    fleet.wait_phase(database, "Ready")
    c = fleet.credentials(database)
    tenant = c["database"]
    slot = move_sql.slot_name(tenant)
    create_orders(source_server, c)
    client = Client(c)
    client.start()
    try:
        with requested_move(fleet, admin_rest, database, target) as name:
            wait_for(lambda: move_phase(admin_rest, name, []) == "Completed", 180, "the move", max_interval=0.05)
            wait_for(lambda: fleet.credentials(database)["port"] == str(target_server.port), 60, "the Secret's port")
            client.credentials = fleet.credentials(database)

            client.credentials = rotate(fleet, admin_rest, database)  # the same login role, a new password
            reconnected(target_server, slot, tenant)
            writes_more(client, "the target")

            client.credentials = rotate(fleet, admin_rest, database, overlap="8")  # the alternate handed out
            alternate = client.credentials["user"]
            assert alternate != tenant
            reconnected(target_server, slot, alternate)
            fleet.wait_database(database, lambda db: not db["status"].get("retireLoginAt"), 60, "the overlap's end")
            assert not can_connect(target_server, tenant, c["password"], tenant)  # retired
            reconnected(target_server, slot, alternate)
            writes_more(client, "the target")
            wait_events(admin_rest, name, {"MoveStreamCredentials"})

            admin_rest.patch(DATABASE_MOVES, name, {"spec": {"rollback": True}}, NAMESPACE)
            wait_for(lambda: move_phase(admin_rest, name, []) == "RolledBack", 180, "the rollback", max_interval=0.05)
            wait_for(lambda: fleet.credentials(database)["port"] == str(source_server.port), 60, "the Secret's port")
            client.credentials = fleet.credentials(database)
            writes_more(client, "the source")
    finally:
        client.stop()
    all_acknowledged_on(source_server, client, tenant)
