"""A move copies with the client tools of the target shard's major, found in a directory of per-major
tool directories (DBPROVIDER_PG_TOOLS, as the image carries them), through the real apiserver and real
PostgreSQL 16 and 18 shards.

PostgreSQL 18's pg_dump writes a schema that PostgreSQL 16 refuses (`transaction_timeout`), so an online
move into a PostgreSQL 16 shard completes with the tools of 16 and, when the manager has only those of
18, is refused by its preflight before anything is copied. A move to an older major is refused by the
preflight, online and offline.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from domain.resources import DATABASE_MOVES
from harness import PostgresServer
from tests.reconciler.conftest import NAMESPACE, wait_events
from tests.reconciler.test_move import failed_status, requested_move, servers_for_moves, shard
from tests.sql.helpers import can_connect
from tests.support.common import condition, wait_for
from tests.support.postgres import PostgresPool, client_tools_root

pytestmark = pytest.mark.server

ROWS = "SELECT id, note FROM orders ORDER BY id"


@pytest.fixture(scope="module")
def pg16() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    """Two PostgreSQL 16 servers prepared for online moves."""
    with servers_for_moves("16", "16") as servers:
        yield servers


@pytest.fixture
def manager_with(start_manager, monkeypatch, tmp_path: Path):
    """Starts a manager whose tool directory holds the harness's builds of the majors given."""

    def start(*majors: str):
        monkeypatch.setenv("DBPROVIDER_PG_TOOLS", str(client_tools_root(tmp_path / "tools", *majors)))
        monkeypatch.delenv("DBPROVIDER_PG_DUMP", raising=False)
        monkeypatch.delenv("DBPROVIDER_PG_RESTORE", raising=False)
        return start_manager()

    return start


def database_with_rows(fleet, source: str, server: PostgresServer, external_id: str):
    """A Database on `source` with a table of rows made with its credentials: (name, credentials, rows)."""
    fleet.wait_shard(source, "Ok")
    database = fleet.database(external_id)
    assert fleet.wait_phase(database, "Ready")["status"]["shard"] == source
    c = fleet.credentials(database)
    login = {"host": "127.0.0.1", "port": server.port, "user": c["user"], "password": c["password"]}
    with psycopg.connect(**login, dbname=c["database"], autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, note text NOT NULL)")
        conn.execute("INSERT INTO orders (note) SELECT 'order ' || g FROM generate_series(1, 200) g")
        rows = conn.execute(ROWS).fetchall()
    return database, c, rows


def event_message(admin_rest, name: str, reason: str) -> str:
    items = admin_rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    return next(e["message"] for e in items if e["involvedObject"]["name"] == name and e["reason"] == reason)


def test_an_online_move_into_postgresql_16_copies_with_the_tools_of_16(fleet, admin_rest, pg16, manager_with) -> None:
    manager_with("18", "16")
    source_server, target_server = pg16
    source, target = shard(fleet, source_server, True), shard(fleet, target_server, False)
    fleet.wait_shard(target, "Ok")
    database, c, rows = database_with_rows(fleet, source, source_server, "tools-16")

    with requested_move(fleet, admin_rest, database, target, mode="Online") as name:

        def completed() -> bool:
            status = admin_rest.get(DATABASE_MOVES, name, NAMESPACE).get("status") or {}
            assert status.get("phase") != "Failed", status
            return status.get("phase") == "Completed"

        wait_for(completed, 180, "the move to complete")
        wait_events(admin_rest, name, {"MoveStarted"})
        assert "with the client tools of PostgreSQL 16" in event_message(admin_rest, name, "MoveStarted")
    assert fleet.get_database(database)["status"]["shard"] == target
    assert target_server.query(ROWS, dbname=c["database"]) == rows
    assert can_connect(target_server, c["user"], c["password"], c["database"])


def test_with_only_the_tools_of_18_a_move_into_16_is_refused_before_the_copy(
    fleet, admin_rest, pg16, manager_with
) -> None:
    manager_with("18")
    source_server, target_server = pg16
    source, target = shard(fleet, source_server, True), shard(fleet, target_server, False)
    fleet.wait_shard(target, "Ok")
    database, c, _ = database_with_rows(fleet, source, source_server, "tools-18")

    with requested_move(fleet, admin_rest, database, target, mode="Online") as name:
        failed = wait_for(lambda: failed_status(admin_rest, name), 60, "the move to fail")
        ready = condition(failed, "Ready")
        assert ready["reason"] == "PreflightFailed"
        assert "no pg_dump of PostgreSQL 16 where the manager runs" in ready["message"]
    assert fleet.get_database(database)["status"]["shard"] == source
    assert target_server.query("SELECT count(*) FROM pg_database WHERE datname = %s", (c["database"],)) == [(0,)]
    assert can_connect(source_server, c["user"], c["password"], c["database"])


@pytest.fixture(scope="module")
def pg18() -> Iterator[PostgresServer]:
    pool = PostgresPool()
    yield pool.get("18")
    pool.close()


def test_a_move_to_an_older_major_is_refused_online_and_offline(fleet, admin_rest, pg16, pg18, manager_with) -> None:
    manager_with("18", "16")
    source, target = shard(fleet, pg18, True), shard(fleet, pg16[1], False)
    fleet.wait_shard(target, "Ok")
    database, c, _ = database_with_rows(fleet, source, pg18, "tools-older")
    for mode in ("Online", "Offline"):
        with requested_move(fleet, admin_rest, database, target, mode=mode) as name:
            failed = wait_for(lambda: failed_status(admin_rest, name), 60, f"the {mode} move to fail")
            ready = condition(failed, "Ready")
            assert ready["reason"] == "PreflightFailed"
            assert "runs PostgreSQL 16, older than the source's 18" in ready["message"]
    assert fleet.get_database(database)["status"]["shard"] == source
    assert can_connect(pg18, c["user"], c["password"], c["database"])
