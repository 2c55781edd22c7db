"""Moving a tenant database online (reconciler.sql.move) between real PostgreSQL 16 and 18 servers,
with the tenant's client writing through the move: inserts, updates, deletes, a sequence, large rows.

After the cutover every write the client saw committed is on the target (compared by content), the
source took no write after the fence, the sequence goes on where it was, and the tenant's own
credentials log in on the target; an abort leaves the source serving as it was and the target clean.
The target server logs every statement except the provisioner's in the tenant's database (what its
administrators arrange for the subscription's statement): the password never reaches its log.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg import sql

from domain.naming import alternate_name
from harness import POSTGRES_FLAVORS, PostgresServer
from reconciler.move.tools import ClientTools, MoveTools
from reconciler.sql import errors, move
from reconciler.sql.errors import SqlFailure
from reconciler.sql.login_roles import alternate_problems, hand_out
from reconciler.sql.session import AdminSession, connect_admin
from reconciler.sql.tenant import read_state
from tests.sql.conftest import LogicalPool
from tests.sql.helpers import admin_endpoint, can_connect, new_spec
from tests.sql.test_move_privileges import (
    MOVE_FLAVORS,
    PROVISIONER,
    Pair,
    drop_replication,
    provision,
    source_grant,
    target_grant,
)
from tests.support.common import wait_for
from tests.support.postgres import drop_as_superuser

SCHEMA = (
    "CREATE TABLE items (id bigserial PRIMARY KEY, body text NOT NULL, big text)",
    "CREATE INDEX items_body ON items (body)",
    "INSERT INTO items (body) SELECT 'seed ' || g FROM generate_series(1, 200) g",
)
QUIET = ("log_statement", "none"), ("log_min_duration_statement", "-1"), ("log_min_error_statement", "panic")


class Writer(threading.Thread):
    """The tenant's client: autocommit writes, one after another, to whichever server it is pointed at.

    `expected` is the table as the client knows it from the writes it saw succeed; a write whose
    connection broke may or may not have happened (`uncertain`). Any other error is a failure.
    """

    def __init__(self, pair: Pair) -> None:
        super().__init__(daemon=True)
        self.pair = pair
        self.port = pair.source.port
        self.expected: dict[int, tuple[str, str | None]] = {
            i: (f"seed {i}", None) for i in range(1, 201)
        }  # the SCHEMA's rows
        self.uncertain_ids: set[int] = set()
        self.uncertain_bodies: set[str] = set()
        self.failures: list[str] = []
        self.committed = 0
        self.refused = 0
        self._halt = threading.Event()
        self._conn: psycopg.Connection | None = None

    def point_at(self, server: PostgresServer) -> None:
        self.port = server.port

    def stop(self) -> None:
        self._halt.set()
        self.join(30)
        if self._conn is not None:
            self._conn.close()

    def writes(self, count: int, timeout: float = 60) -> None:
        """Wait until `count` more writes committed."""
        goal = self.committed + count
        wait_for(lambda: self.committed >= goal or bool(self.failures), timeout, f"{count} more writes")
        assert not self.failures

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(
                host="127.0.0.1",
                port=self.port,
                user=self.pair.spec.login_role,
                password=self.pair.spec.password,
                dbname=self.pair.name,
                sslmode="disable",
                connect_timeout=5,
                autocommit=True,
            )
        return self._conn

    def run(self) -> None:
        step = 0
        while not self._halt.is_set():
            try:
                conn = self._connection()
            except psycopg.OperationalError:
                self.refused += 1
                time.sleep(0.02)
                continue
            step += 1
            self._one(conn, step)

    def _one(self, conn: psycopg.Connection, step: int) -> None:
        live = sorted(set(self.expected) - self.uncertain_ids)
        kind = step % 5
        target = live[(step * 7919) % len(live)] if live else None
        body = f"w{step} {secrets.token_hex(6)}"
        big = secrets.token_hex(150_000) if step % 40 == 0 else None
        try:
            if kind in (0, 1, 2) or target is None:
                row = conn.execute("INSERT INTO items (body, big) VALUES (%s, %s) RETURNING id", (body, big)).fetchone()
                assert row is not None
                self.expected[row[0]] = (body, big)
            elif kind == 3:
                conn.execute("UPDATE items SET body = %s WHERE id = %s", (body, target))
                self.expected[target] = (body, self.expected[target][1])
            else:
                conn.execute("DELETE FROM items WHERE id = %s", (target,))
                del self.expected[target]
            self.committed += 1
        except psycopg.OperationalError:  # the connection ended: the write may have happened or not
            self.uncertain_bodies.add(body)
            if target is not None:
                self.uncertain_ids.add(target)
            conn.close()
        except psycopg.Error as exc:
            self.failures.append(f"{type(exc).__name__}: {exc.diag.message_primary}")


def content(server: PostgresServer, name: str) -> dict[int, tuple[str, str | None]]:
    """The tenant's table, read as superuser (the large rows by digest)."""
    with server.superuser_connection(name) as conn:
        rows = conn.execute("SELECT id, body, md5(big) FROM items").fetchall()
    return {i: (body, digest) for i, body, digest in rows}


def agrees(table: dict[int, tuple[str, str | None]], writer: Writer) -> None:
    """`table` holds every write the client saw succeed, by content, and nothing it did not write."""
    want = {
        i: (body, hashlib.md5(big.encode()).hexdigest() if big is not None else None)
        for i, (body, big) in writer.expected.items()
        if i not in writer.uncertain_ids
    }
    have = {i: row for i, row in table.items() if i in want}
    assert have == want
    strangers = [i for i, (body, _) in table.items() if i not in writer.expected and i not in writer.uncertain_ids]
    assert all(table[i][0] in writer.uncertain_bodies for i in strangers)


class Move:
    """The two admin sessions of a move and its plan."""

    def __init__(self, pair: Pair, tools: ClientTools) -> None:
        self.pair = pair
        self.source = connect_admin(admin_endpoint(pair.source))
        self.target = connect_admin(admin_endpoint(pair.target))
        # The harness' servers run with the test runner's HOME, whose client certificate they may not
        # read (libpq tries it whenever TLS is asked for): the stream goes without TLS on loopback.
        self.plan = move.MovePlan(pair.spec, "127.0.0.1", pair.source.port, sslmode="disable")
        # The tools a move picks for the two majors: those of the target's.
        chosen = tools.for_move(self.source.info.server_version // 10000, self.target.info.server_version // 10000)
        assert isinstance(chosen, MoveTools) and chosen.major == pair.target.flavor.major
        self.pg_dump = chosen.pg_dump

    def close(self) -> None:
        self.source.close()
        self.target.close()

    def quiet_target(self) -> None:
        self.quiet(self.pair.target)

    def quiet(self, server: PostgresServer) -> None:
        """What the shard's administrators arrange (here for the tenant's database only, as the
        server is shared): the provisioner's statements there are not logged."""
        with server.superuser_connection() as conn:
            for setting, value in QUIET:
                conn.execute(
                    sql.SQL("ALTER ROLE {} IN DATABASE {} SET {} = {}").format(
                        sql.Identifier(PROVISIONER), sql.Identifier(self.pair.name), sql.Identifier(setting), value
                    )
                )

    def until_copied(self) -> None:
        """Steps 1-4, each run twice (a re-run after an interruption must change nothing)."""
        for _ in range(2):
            move.prepare_target(self.target, self.pair.spec)
        self.quiet_target()
        for _ in range(2):
            move.copy_schema(self.source, self.target, self.plan, self.pg_dump)
            move.publish(self.source, self.pair.name, self.pair.spec.login)
            move.subscribe(self.source, self.target, self.plan)
            assert move.copy_new_tables(self.source, self.target, self.plan, self.pg_dump) == 0
        self.wait_caught_up()

    def wait_caught_up(self) -> None:
        def caught_up() -> bool:
            now = move.progress(self.source, self.target, self.plan)
            assert now.errors == 0
            return now.copied and now.lag_bytes is not None and now.lag_bytes < 1 << 20

        wait_for(caught_up, 120, "the target to copy the tables and catch up")


@pytest.fixture(params=MOVE_FLAVORS, ids=[f"pg{f}" for f in MOVE_FLAVORS])
def pair(request: pytest.FixtureRequest, logical_pool: LogicalPool) -> Iterator[Pair]:
    source, target = logical_pool.source(request.param), logical_pool.target(request.param)
    source_grant(source)
    target_grant(target)
    made = Pair(source, target, new_spec(connection_limit=10))
    provision(source, made.spec)
    with made.tenant(source) as conn:
        for statement in SCHEMA:
            conn.execute(statement)
    yield made
    drop_replication(made)
    drop_as_superuser(source, made.name)
    drop_as_superuser(target, made.name)


@pytest.fixture
def moving(pair: Pair, client_tools: ClientTools) -> Iterator[tuple[Move, Writer]]:
    mover, writer = Move(pair, client_tools), Writer(pair)
    writer.start()
    yield mover, writer
    writer.stop()
    mover.close()


def catalog(server: PostgresServer, name: str, query: str) -> list[tuple[Any, ...]]:
    with server.superuser_connection(name) as conn:
        return conn.execute(query).fetchall()


def test_a_tenant_moves_online_with_its_client_writing_and_loses_nothing(
    pair: Pair, moving: tuple[Move, Writer]
) -> None:
    mover, writer = moving
    writer.writes(50)
    mover.until_copied()
    writer.writes(50)  # the stream carries what the client writes meanwhile

    # A table the tenant creates during the move: no cutover (the source keeps serving) until it is carried.
    with pair.tenant(pair.source) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL)")
        conn.execute("INSERT INTO notes SELECT g, 'note ' || g FROM generate_series(1, 100) g")
    with pytest.raises(SqlFailure) as refused:
        move.cutover(mover.source, mover.target, mover.plan)
    assert refused.value.error_class == errors.MOVE_REFUSED
    writer.writes(20)
    assert move.copy_new_tables(mover.source, mover.target, mover.plan, mover.pg_dump) == 1
    assert move.copy_new_tables(mover.source, mover.target, mover.plan, mover.pg_dump) == 0
    with pair.tenant(pair.source) as conn:
        conn.execute("UPDATE notes SET body = 'changed' WHERE id <= 10")
        conn.execute("DELETE FROM notes WHERE id = 50")
        conn.execute("INSERT INTO notes VALUES (101, 'after')")
    mover.wait_caught_up()

    # A cutover whose stream does not arrive in time gives the source back to the client.
    with pair.target.superuser_connection(pair.name) as conn:
        conn.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(sql.Identifier(move.SUBSCRIPTION)))
    with pytest.raises(move.CutoverTimedOut):
        move.cutover(mover.source, mover.target, mover.plan, budget=1.0)
    writer.writes(20)
    with pair.target.superuser_connection(pair.name) as conn:
        conn.execute(sql.SQL("ALTER SUBSCRIPTION {} ENABLE").format(sql.Identifier(move.SUBSCRIPTION)))

    pause = move.cutover(mover.source, mover.target, mover.plan)
    assert 0 < pause < 30
    assert move.cutover(mover.source, mover.target, mover.plan) == 0.0  # done: a re-run changes nothing

    # The fence held: the source took no write the target lacks, and refuses the tenant now.
    source_rows, target_rows = content(pair.source, pair.name), content(pair.target, pair.name)
    assert source_rows == target_rows
    agrees(target_rows, writer)
    notes = "SELECT id, body FROM notes ORDER BY id"
    assert catalog(pair.target, pair.name, notes) == catalog(pair.source, pair.name, notes)
    assert len(catalog(pair.target, pair.name, notes)) == 100
    assert not can_connect(pair.source, pair.name, pair.spec.password, pair.name)
    refused = writer.refused
    wait_for(lambda: writer.refused > refused, 30, "the client to be refused by the source")

    # The client's own credentials, pointed at the target: the sequence goes on, nothing is lost.
    writer.point_at(pair.target)
    writer.writes(100)
    writer.stop()
    agrees(content(pair.target, pair.name), writer)
    assert not writer.failures
    assert catalog(pair.target, pair.name, "SELECT count(*) FROM items WHERE big IS NOT NULL") != [(0,)]

    # Nothing of the move is left on either side but the closed source copy; the password was never logged.
    assert catalog(pair.target, pair.name, "SELECT count(*) FROM pg_subscription") == [(0,)]
    assert catalog(pair.target, pair.name, "SELECT count(*) FROM pg_namespace WHERE nspname = 'dbprovider_move'") == [
        (0,)
    ]
    assert catalog(pair.source, pair.name, "SELECT count(*) FROM pg_publication") == [(0,)]
    assert catalog(pair.source, "postgres", "SELECT count(*) FROM pg_replication_slots") == [(0,)]
    roles = "SELECT rolreplication FROM pg_roles WHERE rolname = current_database()"
    assert catalog(pair.source, pair.name, roles) == [(False,)]
    owners = "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class WHERE relname IN ('items', 'items_id_seq')"
    assert catalog(pair.target, pair.name, owners) == [(pair.name,)]
    assert pair.spec.password not in pair.target.statement_log()


def test_a_tenant_on_its_alternate_login_role_moves_online_and_its_credentials_follow(
    pair: Pair, client_tools: ClientTools
) -> None:
    """A rotation with an overlap handed out the alternate, and the overlap ended (the tenant role has
    no login): the move logs in with the alternate's credentials, acting as the tenant, and gives the
    target the same two roles; the client writing as the alternate loses nothing."""
    alternate = alternate_name(pair.name)
    spec = replace(pair.spec, password=new_spec().password, login=alternate)
    with AdminSession.for_endpoint(admin_endpoint(pair.source)) as admin:
        hand_out(admin, pair.name, alternate, spec.password, spec.connection_limit, retire_other=True)
    assert not can_connect(pair.source, pair.name, pair.spec.password, pair.name)
    on_alternate = replace(pair, spec=spec)
    mover, writer = Move(on_alternate, client_tools), Writer(on_alternate)
    writer.start()
    try:
        writer.writes(30)
        mover.until_copied()
        publication = "SELECT pg_get_userbyid(pubowner) FROM pg_publication"
        assert catalog(pair.source, pair.name, publication) == [(pair.name,)]
        replication = "SELECT rolname, rolreplication FROM pg_roles WHERE rolname IN (%s, %s) ORDER BY 1"
        assert pair.source.query(replication, (pair.name, alternate)) == [(pair.name, False), (alternate, True)]
        assert not can_connect(pair.target, alternate, spec.password, pair.name)  # closed until the cutover
        writer.writes(30)
        assert 0 < move.cutover(mover.source, mover.target, mover.plan) < 30

        source_rows, target_rows = content(pair.source, pair.name), content(pair.target, pair.name)
        assert source_rows == target_rows
        agrees(target_rows, writer)
        writer.point_at(pair.target)
        writer.writes(50)
        writer.stop()
        assert not writer.failures
        agrees(content(pair.target, pair.name), writer)
    finally:
        writer.stop()
        mover.close()
    # The target's roles are the source's: the alternate logs in acting as the tenant, the tenant role does not.
    assert can_connect(pair.target, alternate, spec.password, pair.name)
    assert not can_connect(pair.target, pair.name, spec.password, pair.name)
    assert not can_connect(pair.target, pair.name, pair.spec.password, pair.name)
    with pair.target.connect(alternate, spec.password, pair.name, autocommit=True) as conn:
        assert conn.execute("SELECT session_user, current_user").fetchone() == (alternate, pair.name)
        conn.execute("CREATE TABLE after_move (id int)")
    owners = "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class WHERE relname IN ('items', 'after_move')"
    assert catalog(pair.target, pair.name, owners) == [(pair.name,)]
    roles = "SELECT rolname, rolcanlogin, rolpassword IS NULL, rolreplication FROM pg_authid WHERE rolname IN (%s, %s)"
    assert sorted(pair.target.query(roles, (pair.name, alternate))) == sorted(
        [(pair.name, False, True, False), (alternate, True, False, False)]
    )
    assert pair.source.query(replication, (pair.name, alternate)) == [(pair.name, False), (alternate, False)]
    with connect_admin(admin_endpoint(pair.target)) as conn:
        assert alternate_problems(conn, pair.name, read_state(conn, pair.name)) == []


NEWEST_FLAVORS = sorted(MOVE_FLAVORS, key=int)[-1:]
NEWEST = pytest.mark.parametrize("pair", NEWEST_FLAVORS, ids=[f"pg{f}" for f in NEWEST_FLAVORS], indirect=True)


@NEWEST  # the steps' SQL is the same on every major: the main tests cover 16 and 18
@pytest.mark.parametrize("stopped_after", ["fence", "stream ended"])
def test_a_cutover_interrupted_midway_finishes_when_run_again(
    pair: Pair, moving: tuple[Move, Writer], stopped_after: str
) -> None:
    """A manager that died during the cutover left the source fenced: the next attempt finishes it."""
    mover, writer = moving
    mover.until_copied()
    writer.writes(30)
    move.fence_source(mover.source, pair.name)
    if stopped_after == "stream ended":
        token = move.mark(mover.source, pair.name)
        assert move.wait_for_marker(mover.target, pair.name, token, time.monotonic() + 60)
        move.copy_sequences(mover.source, mover.target, pair.name)
        move.end_stream(mover.source, mover.target, mover.plan)
    assert not can_connect(pair.target, pair.name, pair.spec.password, pair.name)

    move.cutover(mover.source, mover.target, mover.plan)
    source_rows = content(pair.source, pair.name)
    assert content(pair.target, pair.name) == source_rows
    agrees(source_rows, writer)
    writer.point_at(pair.target)
    writer.writes(30)
    writer.stop()
    assert not writer.failures
    assert catalog(pair.source, "postgres", "SELECT count(*) FROM pg_replication_slots") == [(0,)]


def test_an_aborted_move_leaves_the_source_serving_and_the_target_clean(
    pair: Pair, moving: tuple[Move, Writer]
) -> None:
    mover, writer = moving
    acl = "SELECT datacl::text FROM pg_database WHERE datname = current_database()"
    before = catalog(pair.source, pair.name, acl)
    mover.until_copied()
    writer.writes(50)

    move.abort(mover.source, mover.target, mover.plan)
    move.abort(mover.source, mover.target, mover.plan)  # a re-run finds nothing left to undo

    writer.writes(50)  # the client never stopped
    writer.stop()
    agrees(content(pair.source, pair.name), writer)
    assert not writer.failures
    assert catalog(pair.source, pair.name, acl) == before
    assert catalog(pair.source, pair.name, "SELECT count(*) FROM pg_publication") == [(0,)]
    assert catalog(pair.source, pair.name, "SELECT count(*) FROM pg_namespace WHERE nspname = 'dbprovider_move'") == [
        (0,)
    ]
    assert catalog(pair.source, "postgres", "SELECT count(*) FROM pg_replication_slots") == [(0,)]
    roles = "SELECT rolreplication FROM pg_roles WHERE rolname = %s"
    assert pair.source.query(roles, (pair.name,)) == [(False,)]
    assert pair.target.query("SELECT count(*) FROM pg_database WHERE datname = %s", (pair.name,)) == [(0,)]
    assert pair.target.query("SELECT count(*) FROM pg_roles WHERE rolname = %s", (pair.name,)) == [(0,)]
    assert pair.target.query("SELECT count(*) FROM pg_subscription") == [(0,)]


def test_the_target_is_closed_to_the_tenant_until_the_cutover_and_a_logged_target_is_refused(
    pair: Pair, client_tools: ClientTools
) -> None:
    mover = Move(pair, client_tools)
    try:
        move.prepare_target(mover.target, pair.spec)
        assert not can_connect(pair.target, pair.name, pair.spec.password, pair.name)
        move.copy_schema(mover.source, mover.target, mover.plan, mover.pg_dump)
        move.publish(mover.source, pair.name)
        log = pair.target.statement_log()
        with pytest.raises(SqlFailure) as refused:
            move.subscribe(mover.source, mover.target, mover.plan)
        assert refused.value.error_class == errors.MOVE_REFUSED
        assert "log_statement = all" in str(refused.value)
        assert pair.spec.password not in str(refused.value)
        assert pair.spec.password not in pair.target.statement_log()[len(log) :]
        assert pair.target.query("SELECT count(*) FROM pg_subscription") == [(0,)]
    finally:
        mover.close()


@NEWEST
def test_a_password_changed_during_the_move_is_the_one_that_logs_in_on_the_target(
    pair: Pair, client_tools: ClientTools
) -> None:
    """The consumer's password was rotated (on the source) while the data was copied: the cutover sets
    the password the consumer holds now on the target."""
    mover = Move(pair, client_tools)
    try:
        mover.until_copied()
        rotated = new_spec().password
        with pair.source.superuser_connection() as conn:
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(pair.name), sql.Literal(rotated)))
        plan = move.MovePlan(replace(pair.spec, password=rotated), "127.0.0.1", pair.source.port, sslmode="disable")
        move.cutover(mover.source, mover.target, plan)
        assert can_connect(pair.target, pair.name, rotated, pair.name)
        assert not can_connect(pair.target, pair.name, pair.spec.password, pair.name)
    finally:
        mover.close()


@pytest.mark.parametrize("pair", [f for f in MOVE_FLAVORS if f == "16"], ids=["pg16"], indirect=True)
def test_a_schema_dumped_by_a_newer_pg_dump_does_not_load_into_postgresql_16(
    pair: Pair, client_tools: ClientTools
) -> None:
    """Why a move picks the target's tools: PostgreSQL 18's pg_dump writes settings that PostgreSQL 16
    refuses, so its schema does not load; the one of 16 a move picks loads it."""
    mover = Move(pair, client_tools)
    try:
        move.prepare_target(mover.target, pair.spec)
        with pytest.raises(psycopg.errors.UndefinedObject, match="transaction_timeout"):
            move.copy_schema(mover.source, mover.target, mover.plan, POSTGRES_FLAVORS["18"].locate() / "pg_dump")
        move.copy_schema(mover.source, mover.target, mover.plan, mover.pg_dump)
        tables = "SELECT count(*) FROM pg_tables WHERE tablename = 'items'"
        assert catalog(pair.target, pair.name, tables) == [(1,)]
    finally:
        move.abort(mover.source, mover.target, mover.plan)
        mover.close()
