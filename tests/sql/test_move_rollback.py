"""Rolling an online move back (reconciler.sql.move_rollback) between real PostgreSQL 16 and 18 servers,
with the tenant's client writing through the move and through the rollback.

The cutover leaves a stream from the target back to the fenced source; after the rollback every write
the client saw committed (on either side) is on the source, compared by content, the target took no
write after its fence and its copy is gone, the sequence goes on, and the tenant's own credentials log
in on the source. The window's end drops the source's copy and ends the stream.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from psycopg import sql

from reconciler.move.tools import ClientTools
from reconciler.sql import errors, move, move_rollback
from reconciler.sql.errors import SqlFailure
from tests.sql import test_move
from tests.sql.helpers import can_connect
from tests.sql.test_move import NEWEST, Move, Writer, agrees, catalog, content
from tests.sql.test_move_privileges import PROVISIONER, Pair, source_grant, target_grant
from tests.support.common import wait_for

pair = test_move.pair  # the two servers and the tenant of test_move, per major


class Rollback(Move):
    """A move whose cutover keeps a stream back to the source."""

    def __init__(self, pair: Pair, tools: ClientTools) -> None:
        super().__init__(pair, tools)
        self.back = move.MovePlan(pair.spec, "127.0.0.1", pair.target.port, sslmode="disable")
        self.reverse = move_rollback.Reverse(self.source, self.target, self.back)

    def quiet_source(self) -> None:
        """The source's administrators keep the provisioner's statements out of its log too."""
        self.quiet(self.pair.source)

    def moved(self) -> float:
        self.until_copied()
        self.quiet_source()
        return move.cutover(self.source, self.target, self.plan, reverse=self.reverse)

    def wait_back(self) -> None:
        def caught_up() -> bool:
            now = move_rollback.reverse_progress(self.source, self.target, self.back)
            assert now.errors == 0
            return now.copied and now.lag_bytes is not None and now.lag_bytes < 1 << 20

        wait_for(caught_up, 120, "the stream back to catch up")


def drop_reverse(pair: Pair) -> None:
    """The source's subscription (it would keep its database from being dropped) and any slot left."""
    with pair.source.superuser_connection(pair.name) as conn:
        for (sub,) in conn.execute("SELECT subname FROM pg_subscription").fetchall():
            name = sql.Identifier(sub)
            conn.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(name))
            conn.execute(sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(name))
            conn.execute(sql.SQL("DROP SUBSCRIPTION {}").format(name))
    for server in (pair.source, pair.target):
        with server.superuser_connection() as conn:
            wait_for(
                lambda conn=conn: (
                    not conn.execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                        " WHERE database = %s AND NOT active",
                        (pair.name,),
                    ).fetchall()
                    and not conn.execute(
                        "SELECT 1 FROM pg_replication_slots WHERE database = %s", (pair.name,)
                    ).fetchall()
                ),
                30,
                "the slots to be dropped",
            )


@pytest.fixture
def rolling(pair: Pair, client_tools: ClientTools) -> Iterator[tuple[Rollback, Writer]]:
    target_grant(pair.source)  # the stream back: what the check asks of both shards
    source_grant(pair.target)
    mover, writer = Rollback(pair, client_tools), Writer(pair)
    writer.start()
    yield mover, writer
    writer.stop()
    mover.close()
    if pair.source.query("SELECT count(*) FROM pg_database WHERE datname = %s", (pair.name,)) == [(1,)]:
        drop_reverse(pair)


def test_a_moved_tenant_rolls_back_with_its_client_writing_and_loses_nothing(
    pair: Pair, rolling: tuple[Rollback, Writer]
) -> None:
    mover, writer = rolling
    writer.writes(30)
    assert 0 < mover.moved() < 30
    assert not can_connect(pair.source, pair.name, pair.spec.password, pair.name)
    writer.point_at(pair.target)
    writer.writes(150)  # inserts, updates, deletes, large rows: carried back as they commit
    mover.wait_back()
    assert catalog(pair.source, pair.name, "SELECT count(*) FROM dbprovider_move.marker") != [(0,)]

    # A rollback whose stream does not arrive in time gives the target back to the client.
    with pair.source.superuser_connection(pair.name) as conn:
        conn.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(sql.Identifier(move.SUBSCRIPTION)))
    with pytest.raises(move.CutoverTimedOut):
        move_rollback.rollback(mover.source, mover.target, mover.back, budget=1.0)
    writer.writes(20)
    with pair.source.superuser_connection(pair.name) as conn:
        conn.execute(sql.SQL("ALTER SUBSCRIPTION {} ENABLE").format(sql.Identifier(move.SUBSCRIPTION)))
    mover.wait_back()

    pause = move_rollback.rollback(mover.source, mover.target, mover.back)
    assert 0 < pause < 30
    assert move_rollback.rollback(mover.source, mover.target, mover.back) == 0.0  # done: a re-run changes nothing

    # The target's fence held: the source has every row the client saw committed, and nothing else.
    source_rows = content(pair.source, pair.name)
    assert source_rows == content(pair.target, pair.name)
    agrees(source_rows, writer)
    assert not can_connect(pair.target, pair.name, pair.spec.password, pair.name)
    refused = writer.refused
    wait_for(lambda: writer.refused > refused, 30, "the client to be refused by the target")

    # The client's own credentials on the source: the sequence goes on (an insert would collide otherwise).
    writer.point_at(pair.source)
    writer.writes(60)
    move_rollback.drop_copy(mover.source, mover.target, pair.name, None)
    writer.stop()
    assert not writer.failures
    agrees(content(pair.source, pair.name), writer)

    # Nothing of the move is left: the target's copy is gone, the source holds no stream or marker.
    assert pair.target.query("SELECT count(*) FROM pg_database WHERE datname = %s", (pair.name,)) == [(0,)]
    assert pair.target.query("SELECT count(*) FROM pg_roles WHERE rolname = %s", (pair.name,)) == [(0,)]
    for server in (pair.source, pair.target):
        assert server.query("SELECT count(*) FROM pg_replication_slots WHERE database = %s", (pair.name,)) == [(0,)]
    assert catalog(pair.source, pair.name, "SELECT count(*) FROM pg_subscription") == [(0,)]
    assert catalog(pair.source, pair.name, "SELECT count(*) FROM pg_namespace WHERE nspname = 'dbprovider_move'") == [
        (0,)
    ]
    acl = "SELECT has_database_privilege(%s, current_database(), 'CONNECT') FROM pg_database LIMIT 1"
    assert pair.source.query(acl, (PROVISIONER,), dbname=pair.name) == [(False,)]
    assert pair.spec.password not in pair.target.statement_log()


@NEWEST  # the steps' SQL is the same on every major: the main test covers 16 and 18
def test_an_interrupted_opening_and_rollback_finish_when_run_again(
    pair: Pair, rolling: tuple[Rollback, Writer]
) -> None:
    """A manager that died after opening the target but before the stream back knew its tables: the
    client may have written there unseen, so the next attempt copies the tables back again. A
    rollback that died after fencing the target is finished by the next attempt."""
    mover, writer = rolling
    mover.until_copied()
    mover.quiet_source()
    writer.writes(30)
    move.fence_source(mover.source, pair.name)
    token = move.mark(mover.source, pair.name)
    assert move.wait_for_marker(mover.target, pair.name, token, time.monotonic() + 60)
    move.copy_sequences(mover.source, mover.target, pair.name)
    assert mover.reverse.prepare(time.monotonic() + 60)
    move.end_stream(mover.source, mover.target, mover.plan)
    move.open_target(mover.target, pair.spec, keep_marker=True)  # ... and the manager died here
    writer.point_at(pair.target)
    writer.writes(40)

    assert move.cutover(mover.source, mover.target, mover.plan, reverse=mover.reverse) == 0.0
    writer.writes(40)
    mover.wait_back()
    move.fence_source(mover.target, pair.name)  # the rollback's fence, and the manager died again

    move_rollback.rollback(mover.source, mover.target, mover.back)
    source_rows = content(pair.source, pair.name)
    assert source_rows == content(pair.target, pair.name)
    agrees(source_rows, writer)
    writer.point_at(pair.source)
    writer.writes(30)
    writer.stop()
    assert not writer.failures


@NEWEST
def test_the_window_end_ends_the_stream_and_drops_the_source_copy(pair: Pair, rolling: tuple[Rollback, Writer]) -> None:
    mover, writer = rolling
    mover.moved()
    writer.point_at(pair.target)
    writer.writes(30)
    with pytest.raises(SqlFailure) as refused:  # the copy is never dropped while it serves
        move_rollback.end_window(mover.target, mover.source, pair.name)
    assert refused.value.error_class == errors.MOVE_REFUSED

    move_rollback.end_window(mover.source, mover.target, pair.name)
    move_rollback.end_window(mover.source, mover.target, pair.name)  # a re-run finds nothing left
    writer.writes(30)  # the client never noticed
    writer.stop()
    assert not writer.failures
    agrees(content(pair.target, pair.name), writer)
    assert pair.source.query("SELECT count(*) FROM pg_database WHERE datname = %s", (pair.name,)) == [(0,)]
    assert pair.source.query("SELECT count(*) FROM pg_roles WHERE rolname = %s", (pair.name,)) == [(0,)]
    assert pair.target.query("SELECT count(*) FROM pg_replication_slots WHERE database = %s", (pair.name,)) == [(0,)]
    assert catalog(pair.target, pair.name, "SELECT count(*) FROM pg_publication") == [(0,)]
    assert catalog(pair.target, pair.name, "SELECT count(*) FROM pg_namespace WHERE nspname = 'dbprovider_move'") == [
        (0,)
    ]
    assert pair.target.query("SELECT rolreplication FROM pg_roles WHERE rolname = %s", (pair.name,)) == [(False,)]
    with pytest.raises(SqlFailure):  # nothing to roll back onto any more
        move_rollback.rollback(mover.source, mover.target, mover.back)


@NEWEST
def test_a_source_that_would_log_the_stream_back_refuses_the_cutover_before_its_fence(
    pair: Pair, rolling: tuple[Rollback, Writer]
) -> None:
    """The stream back's statement carries the tenant's password: a source that would log it refuses
    the cutover while the client still writes there; the abort then leaves nothing of the move."""
    mover, writer = rolling
    mover.until_copied()
    acl = "SELECT datacl::text FROM pg_database WHERE datname = current_database()"
    before = catalog(pair.source, pair.name, acl)
    with pair.source.superuser_connection() as conn:
        conn.execute(
            sql.SQL("ALTER ROLE {} IN DATABASE {} SET log_statement = 'all'").format(
                sql.Identifier(PROVISIONER), sql.Identifier(pair.name)
            )
        )
    with pytest.raises(SqlFailure) as refused:
        move.cutover(mover.source, mover.target, mover.plan, reverse=mover.reverse)
    assert refused.value.error_class == errors.MOVE_REFUSED
    assert can_connect(pair.source, pair.name, pair.spec.password, pair.name)
    writer.writes(30)  # the source never stopped serving

    move.abort(mover.source, mover.target, mover.plan)
    writer.stop()
    assert not writer.failures
    agrees(content(pair.source, pair.name), writer)
    assert catalog(pair.source, pair.name, acl) == before
