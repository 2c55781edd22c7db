"""Draining a Shard through the real apiserver: the databases of a PostgreSQL 16 shard moved online to a
PostgreSQL 18 shard with DatabaseMoves the drain creates, drainMoves at a time, never past the target's
maxDatabases, resumed after a manager restart without a second move of any database.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from kubernetes.client.exceptions import ApiException

from domain.constants import LABEL_DRAIN
from domain.resources import DATABASE_MOVES, SHARDS
from harness import PostgresServer
from tests.reconciler.conftest import NAMESPACE, install_config
from tests.reconciler.test_move import servers_for_moves, shard
from tests.support.common import condition, wait_for

pytestmark = pytest.mark.server

FINISHED = ("Completed", "Aborted", "RolledBack", "Failed")


@pytest.fixture(scope="module")
def drain_servers() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    """A PostgreSQL 16 source and a PostgreSQL 18 target prepared for online moves."""
    with servers_for_moves("16", "18") as servers:
        yield servers


@pytest.fixture
def manager(start_manager, drain_servers, monkeypatch):
    """A running manager whose pg_dump is the PostgreSQL 18 one (the target's major)."""
    monkeypatch.setenv("DBPROVIDER_PG_DUMP", str(drain_servers[1].bin_dir / "pg_dump"))
    return start_manager()


@contextlib.contextmanager
def drain_moves_removed(admin_rest, shard_name: str) -> Iterator[None]:
    """Afterwards: the DatabaseMoves the drain of `shard_name` made are removed (finalizers included)."""
    try:
        yield
    finally:
        for move in drain_moves(admin_rest, shard_name):
            with contextlib.suppress(ApiException):
                name = move["metadata"]["name"]
                admin_rest.patch(DATABASE_MOVES, name, {"metadata": {"finalizers": None}}, NAMESPACE)
                admin_rest.delete(DATABASE_MOVES, name, NAMESPACE)


def drain_moves(admin_rest, shard_name: str) -> list[dict[str, Any]]:
    return list(
        admin_rest.list(DATABASE_MOVES, NAMESPACE, query=[("labelSelector", f"{LABEL_DRAIN}={shard_name}")])["items"]
    )


def tenant_rows(server: PostgresServer, credentials: dict[str, str]) -> list[tuple[int, str]]:
    return [
        (row[0], row[1])
        for row in server.query("SELECT id, note FROM items ORDER BY id", dbname=credentials["database"])
    ]


def test_a_draining_shard_moves_its_databases_a_bounded_number_at_a_time(
    fleet, admin_rest, drain_servers, manager, start_manager
) -> None:
    source_server, target_server = drain_servers
    source = shard(fleet, source_server, True)
    target = shard(fleet, target_server, False, max_databases=2)  # placement picks the source
    fleet.wait_shard(source, "Ok")
    fleet.wait_shard(target, "Ok")
    databases = [fleet.database(f"dr-{i}") for i in range(3)]
    written: dict[str, list[tuple[int, str]]] = {}
    for database in databases:
        assert fleet.wait_phase(database, "Ready")["status"]["shard"] == source
        c = fleet.credentials(database)
        login = {"host": "127.0.0.1", "port": source_server.port, "user": c["user"], "password": c["password"]}
        with psycopg.connect(**login, dbname=c["database"], autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, note text NOT NULL)")
            rows = [(i, f"{database} item {i}") for i in range(1, 21)]
            conn.cursor().executemany("INSERT INTO items VALUES (%s, %s)", rows)
        written[database] = rows

    with drain_moves_removed(admin_rest, source):
        admin_rest.patch(SHARDS, target, {"spec": {"accepting": True}})
        admin_rest.patch(SHARDS, source, {"spec": {"drain": True, "drainMoves": 1}})
        most_running = 0

        def running() -> int:
            nonlocal most_running
            unfinished = [
                m for m in drain_moves(admin_rest, source) if (m.get("status") or {}).get("phase") not in FINISHED
            ]
            most_running = max(most_running, len(unfinished))
            return len(unfinished)

        # The first move starts; the manager is stopped and another one takes over in the middle of it.
        wait_for(lambda: running() == 1, 60, "the drain's first move", max_interval=0.1)
        manager.stop()
        start_manager()

        def draining(reason: str) -> dict[str, Any] | None:
            running()
            found = condition(fleet.get_shard(source), "Draining")
            return found if found is not None and found["reason"] == reason else None

        # The target takes two databases: the third stays, and the condition says why.
        full = wait_for(lambda: draining("NoCapacity"), 240, "the drain to run out of room", max_interval=0.2)
        assert full["status"] == "True" and "no other shard has room" in full["message"], full
        placed = {db: fleet.get_database(db)["status"]["shard"] for db in databases}
        assert sorted(placed.values()) == sorted([target, target, source]), placed
        assert running() == 0

        # Room on the target: the drain goes on by itself and ends.
        admin_rest.patch(SHARDS, target, {"spec": {"maxDatabases": 4}})
        drained = wait_for(lambda: draining("Drained"), 240, "the drain to end", max_interval=0.2)
        assert drained["status"] == "False" and "3 moved" in drained["message"], drained
        assert most_running == 1

        for database in databases:
            assert fleet.get_database(database)["status"]["shard"] == target
            c = fleet.credentials(database)
            assert tenant_rows(target_server, c) == written[database]
        moves = drain_moves(admin_rest, source)
        assert sorted(m["spec"]["database"] for m in moves) == sorted(databases)  # one move each, after the restart too
        assert all(m["spec"]["target"] == target and m["status"]["phase"] == "Completed" for m in moves)

        # Empty and still draining: closed to placement.
        late = fleet.database("dr-late")
        assert fleet.wait_phase(late, "Ready")["status"]["shard"] == target

        admin_rest.patch(SHARDS, source, {"spec": {"drain": False}})
        wait_for(
            lambda: (condition(fleet.get_shard(source), "Draining") or {}).get("reason") == "Stopped", 60, "Stopped"
        )


def test_a_database_whose_move_fails_is_reported_and_moved_again_only_on_request(
    fleet, admin_rest, drain_servers, start_manager, monkeypatch
) -> None:
    # A table without a replica identity rules the online path out, and `Auto` then moves offline, which
    # this install refuses above 1 KiB: the drain's move fails in its preflight.
    monkeypatch.setenv("DBPROVIDER_PG_DUMP", str(drain_servers[1].bin_dir / "pg_dump"))
    start_manager(install_config(moves={"offlineMaxSize": "1Ki"}))
    source_server, _ = drain_servers
    source = shard(fleet, source_server, True)
    target = shard(fleet, drain_servers[1], False)
    fleet.wait_shard(source, "Ok")
    fleet.wait_shard(target, "Ok")
    database = fleet.database("dr-nokey")
    fleet.wait_phase(database, "Ready")
    c = fleet.credentials(database)
    login = {"host": "127.0.0.1", "port": source_server.port, "user": c["user"], "password": c["password"]}
    with psycopg.connect(**login, dbname=c["database"], autocommit=True) as conn:
        conn.execute("CREATE TABLE notes (body text)")  # no replica identity: not online
        conn.execute("INSERT INTO notes VALUES ('kept')")

    with drain_moves_removed(admin_rest, source):
        admin_rest.patch(SHARDS, target, {"spec": {"accepting": True}})
        admin_rest.patch(SHARDS, source, {"spec": {"drain": True}})

        def failed() -> dict[str, Any] | None:
            found = condition(fleet.get_shard(source), "Draining")
            return found if found is not None and found["reason"] == "MovesFailed" else None

        reported = wait_for(failed, 120, "the drain to report the failed move", max_interval=0.2)
        assert reported["status"] == "True" and database in reported["message"] and "1 failed" in reported["message"]
        [first] = drain_moves(admin_rest, source)
        assert first["status"]["phase"] == "Failed"

        # Another pass (the Shard changed) starts no second move.
        admin_rest.patch(SHARDS, source, {"spec": {"drainMoves": 3}})
        wait_for(lambda: (failed() or {}).get("observedGeneration", 0) >= 3, 30, "a pass of the drain")
        assert [m["metadata"]["uid"] for m in drain_moves(admin_rest, source)] == [first["metadata"]["uid"]]
        assert fleet.get_database(database)["status"]["shard"] == source

        # Deleting the failed DatabaseMove asks for a new one.
        admin_rest.delete(DATABASE_MOVES, first["metadata"]["name"], NAMESPACE)

        def second() -> dict[str, Any] | None:
            moves = drain_moves(admin_rest, source)
            return moves[0] if moves and moves[0]["metadata"]["uid"] != first["metadata"]["uid"] else None

        wait_for(second, 60, "the drain's second move")
