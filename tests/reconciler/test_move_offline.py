"""Offline moves and `target: any` through the real apiserver: a Database on a PostgreSQL 15 shard (no
online move possible) moved to a PostgreSQL 18 shard that placement chooses.

The manager's install sets a small offline size limit: a move is refused before anything starts,
a forced one completes (the Database names the target, its credentials Secret the target's
endpoint, the tenant's rows are there and its credentials log in there, not on the closed source).
An abort while the copy fails leaves the source serving as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from domain.resources import DATABASE_MOVES, SHARDS
from harness import PostgresServer
from tests.reconciler.conftest import NAMESPACE, install_config, wait_events
from tests.reconciler.test_move import requested_move, shard
from tests.sql.helpers import can_connect
from tests.support.common import condition, wait_for
from tests.support.postgres import PostgresPool

pytestmark = pytest.mark.server

ROWS = "SELECT id, note, n FROM orders ORDER BY id"


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    """A PostgreSQL 15 server (the source) and a PostgreSQL 18 one (the target)."""
    pool = PostgresPool()
    yield pool.get("15"), pool.get("18")
    pool.close()


@pytest.fixture
def pg18_binaries(servers, monkeypatch) -> None:
    """The manager copies with the target's major's pg_dump (and the pg_restore beside it)."""
    monkeypatch.setenv("DBPROVIDER_PG_DUMP", str(servers[1].bin_dir / "pg_dump"))
    monkeypatch.delenv("DBPROVIDER_PG_RESTORE", raising=False)


def move_status(admin_rest, name: str) -> dict[str, Any]:
    return admin_rest.get(DATABASE_MOVES, name, NAMESPACE).get("status") or {}


def ended(admin_rest, name: str) -> dict[str, Any] | None:
    status = move_status(admin_rest, name)
    return status if status.get("phase") in ("Completed", "Failed", "Aborted") else None


def login(server: PostgresServer, c: dict[str, str]) -> psycopg.Connection:
    """The consumer's session with its credentials, on `server`."""
    login = {"host": "127.0.0.1", "port": server.port, "user": c["user"], "password": c["password"]}
    return psycopg.connect(**login, dbname=c["database"])


def tenant_with_rows(server: PostgresServer, credentials: dict[str, str]) -> list[tuple[Any, ...]]:
    """The tenant's table with a sequence and a few hundred rows, made with its own credentials; the rows."""
    with login(server, credentials) as conn:
        conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, note text NOT NULL, n numeric)")
        conn.execute("INSERT INTO orders (note, n) SELECT 'order ' || g, g / 7.0 FROM generate_series(1, 300) g")
        return conn.execute(ROWS).fetchall()


def database_on_pg15(fleet, servers, external_id: str) -> tuple[str, str, str, dict[str, str], list[tuple[Any, ...]]]:
    """A PostgreSQL 15 source Shard with a Database and its rows, a PostgreSQL 18 target Shard: (source,
    target, the Database, its credentials, its rows)."""
    source_server, target_server = servers
    source = shard(fleet, source_server, True)
    target = shard(fleet, target_server, False)
    fleet.wait_shard(source, "Ok")
    fleet.wait_shard(target, "Ok")
    database = fleet.database(external_id)
    fleet.wait_phase(database, "Ready")
    credentials = fleet.credentials(database)
    return source, target, database, credentials, tenant_with_rows(source_server, credentials)


def test_an_offline_move_to_any_shard_is_refused_above_the_limit_and_completes_when_forced(
    fleet, admin_rest, servers, pg18_binaries, start_manager
) -> None:
    source_server, target_server = servers
    start_manager(install_config(moves={"offlineMaxSize": "1Mi"}))
    source = shard(fleet, source_server, True)
    fleet.wait_shard(source, "Ok")
    database = fleet.database("mv-offline")
    assert fleet.wait_phase(database, "Ready")["status"]["shard"] == source
    credentials = fleet.credentials(database)
    rows = tenant_with_rows(source_server, credentials)
    target = shard(fleet, target_server, False)  # not accepting: no shard for `any` yet
    fleet.wait_shard(target, "Ok")

    with requested_move(fleet, admin_rest, database, "any") as refused:
        waiting = wait_for(
            lambda: (s := move_status(admin_rest, refused)).get("phase") == "Pending" and s, 60, "NoCapacity"
        )
        ready = condition({"status": waiting}, "Ready")
        assert ready["reason"] == "NoCapacity" and "no other accepting" in ready["message"]

        admin_rest.patch(SHARDS, target, {"spec": {"accepting": True}})
        fleet.wait_shard(target, "Ok")
        admin_rest.patch(DATABASE_MOVES, refused, {"metadata": {"annotations": {"nudge": "1"}}}, NAMESPACE)
        status = wait_for(lambda: ended(admin_rest, refused), 120, "the refusal")
        assert status["phase"] == "Failed" and status["targetShard"] == target
        message = condition({"status": status}, "Ready")["message"]
        assert "online not possible" in message and "PostgreSQL 15" in message
        assert "above the offline move limit of 1 MiB (moves.offlineMaxSize)" in message
        assert "spec.force" in message
        # Refused before anything started: the source serves, the target holds nothing of the tenant.
        assert can_connect(source_server, credentials["user"], credentials["password"], credentials["database"])
        assert target_server.query("SELECT count(*) FROM pg_roles WHERE rolname = %s", (credentials["user"],)) == [(0,)]

    with requested_move(fleet, admin_rest, database, "any", force=True) as name:
        status = wait_for(lambda: ended(admin_rest, name), 180, "the forced move")
        assert status["phase"] == "Completed", status
        assert status["mode"] == "Offline" and status["targetShard"] == target and status["sourceShard"] == source
        assert status["writePauseSeconds"] > 0
        assert status["sourceBytes"] > 0 and status["targetBytes"] > 0 and "tablesTotal" not in status
        assert status["progress"].endswith(f" of {status['sourceBytes'] / 2**20:.0f} MiB")
        wait_events(admin_rest, name, {"MoveStarted", "MoveCompleted"})

    assert fleet.get_database(database)["status"]["shard"] == target
    wait_for(lambda: fleet.credentials(database)["port"] == str(target_server.port), 60, "the Secret's port")
    moved = fleet.credentials(database)
    assert moved["password"] == credentials["password"]
    with login(target_server, moved) as conn:
        assert conn.execute(ROWS).fetchall() == rows
        assert conn.execute("INSERT INTO orders (note) VALUES ('after') RETURNING id").fetchone() == (301,)
    assert not can_connect(source_server, credentials["user"], credentials["password"], credentials["database"])
    assert fleet.wait_phase(database, "Ready")["status"]["shard"] == target


def test_an_offline_move_aborted_while_its_copy_fails_reopens_the_source(
    fleet, admin_rest, servers, pg18_binaries, monkeypatch, start_manager
) -> None:
    """PostgreSQL 15's pg_restore cannot read PostgreSQL 18's archive: the copy fails (and is retried)
    with the source closed; the abort opens it again and removes the target's tenant."""
    source_server, target_server = servers
    monkeypatch.setenv("DBPROVIDER_PG_RESTORE", str(source_server.bin_dir / "pg_restore"))
    start_manager()
    source, target, database, c, rows = database_on_pg15(fleet, servers, "mv-offline-abort")

    with requested_move(fleet, admin_rest, database, target, mode="Offline") as name:

        def copy_failed() -> bool:
            status = move_status(admin_rest, name)
            assert status.get("phase") not in ("Failed", "Completed"), status
            ready = condition({"status": status}, "Ready") if status.get("conditions") else None
            return status.get("phase") == "Copying" and ready is not None and "failed" in ready["message"]

        wait_for(copy_failed, 120, "the copy to fail")
        assert move_status(admin_rest, name)["mode"] == "Offline"
        assert not can_connect(source_server, c["user"], c["password"], c["database"])  # closed for the copy

        admin_rest.patch(DATABASE_MOVES, name, {"spec": {"abort": True}}, NAMESPACE)
        wait_for(lambda: move_status(admin_rest, name).get("phase") == "Aborted", 120, "the abort")

    assert fleet.get_database(database)["status"]["shard"] == source
    with login(source_server, c) as conn:
        assert conn.execute(ROWS).fetchall() == rows
    assert target_server.query("SELECT count(*) FROM pg_database WHERE datname = %s", (c["database"],)) == [(0,)]
    assert target_server.query("SELECT count(*) FROM pg_roles WHERE rolname = %s", (c["user"],)) == [(0,)]


def test_an_offline_move_interrupted_by_a_manager_restart_is_finished_by_the_next_one(
    fleet, admin_rest, servers, pg18_binaries, monkeypatch, start_manager
) -> None:
    """The first manager's copy fails (PostgreSQL 15's pg_restore); the next one, with the right
    pg_restore, takes the move up in Copying and completes it."""
    source_server, target_server = servers
    monkeypatch.setenv("DBPROVIDER_PG_RESTORE", str(source_server.bin_dir / "pg_restore"))
    first = start_manager()
    source, target, database, c, rows = database_on_pg15(fleet, servers, "mv-offline-restart")

    with requested_move(fleet, admin_rest, database, target, mode="Offline") as name:
        wait_for(lambda: move_status(admin_rest, name).get("phase") == "Copying", 60, "the copy to start")
        first.stop()
        monkeypatch.delenv("DBPROVIDER_PG_RESTORE")
        start_manager()
        status = wait_for(lambda: ended(admin_rest, name), 180, "the next manager to finish the move")
        assert status["phase"] == "Completed", status

    assert fleet.get_database(database)["status"]["shard"] == target
    with login(target_server, c) as conn:
        assert conn.execute(ROWS).fetchall() == rows
    assert not can_connect(source_server, c["user"], c["password"], c["database"])


def test_an_offline_move_rolls_back_by_a_copy_refused_above_the_limit_unless_forced(
    fleet, admin_rest, servers, monkeypatch, start_manager
) -> None:
    """PostgreSQL 15 to 15, offline: the rollback closes the target and copies the database back into
    the emptied source, with the rows written on the target; above the size limit only when forced."""
    source_server = servers[0]
    other = PostgresPool()
    try:
        target_server = other.get("15")
        monkeypatch.setenv("DBPROVIDER_PG_DUMP", str(source_server.bin_dir / "pg_dump"))
        monkeypatch.delenv("DBPROVIDER_PG_RESTORE", raising=False)
        start_manager(install_config(moves={"offlineMaxSize": "1Mi"}))
        source, target, database, c, _ = database_on_pg15(fleet, (source_server, target_server), "mv-offline-back")
        with requested_move(fleet, admin_rest, database, target, force=True) as name:
            assert wait_for(lambda: ended(admin_rest, name), 180, "the move")["phase"] == "Completed"
            with login(target_server, c) as conn:
                conn.execute("UPDATE orders SET note = 'changed on the target' WHERE id <= 10")
                conn.execute("DELETE FROM orders WHERE id > 290")
                conn.execute("INSERT INTO orders (note, n) VALUES ('new on the target', 1)")
                conn.commit()
                rows = conn.execute(ROWS).fetchall()

            def rollback_condition() -> dict[str, Any] | None:
                status = move_status(admin_rest, name)
                found = condition({"status": status}, "Rollback")
                return found if found["reason"] != "WindowOpen" else None

            admin_rest.patch(DATABASE_MOVES, name, {"spec": {"rollback": True, "force": False}}, NAMESPACE)
            refused = wait_for(rollback_condition, 60, "the refusal")
            assert refused["reason"] == "RollbackRefused" and "(moves.offlineMaxSize)" in refused["message"]
            assert move_status(admin_rest, name)["phase"] == "Completed"
            assert can_connect(target_server, c["user"], c["password"], c["database"])  # nothing changed

            admin_rest.patch(DATABASE_MOVES, name, {"spec": {"force": True}}, NAMESPACE)
            wait_for(lambda: move_status(admin_rest, name).get("phase") == "RolledBack", 180, "the rollback")
            wait_events(admin_rest, name, {"MoveRollbackStarted", "MoveRollbackRefused", "MoveRolledBack"})

        assert fleet.get_database(database)["status"]["shard"] == source
        wait_for(lambda: fleet.credentials(database)["port"] == str(source_server.port), 60, "the Secret's port")
        with login(source_server, fleet.credentials(database)) as conn:
            assert conn.execute(ROWS).fetchall() == rows
            assert conn.execute("INSERT INTO orders (note) VALUES ('back') RETURNING id").fetchone() == (302,)
        assert target_server.query("SELECT count(*) FROM pg_database WHERE datname = %s", (c["database"],)) == [(0,)]
    finally:
        other.close()
