"""A rotation during an online move, or within its rollback window, between real PostgreSQL 16 and 18
servers, with the tenant's client writing throughout.

A rotation changes the password of the login role the stream logs in with (or hands out the other
login role, and later retires the previous one), while the subscription still carries the credentials
it was made with. The stream's WAL sender on the publishing side is then ended (as a network failure or
a restart would end it): the stream must log in again with the credentials handed out, and the
cutover, or the rollback, must bring every row the client saw committed to the side that serves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from domain.naming import alternate_name
from harness import PostgresServer
from reconciler.sql import move, move_rollback
from reconciler.sql.login_roles import hand_out_on, retire_login
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import TenantSpec
from tests.sql import test_move, test_move_rollback
from tests.sql.helpers import admin_endpoint, can_connect, new_spec
from tests.sql.test_move import Move, Writer, agrees, content
from tests.sql.test_move_privileges import Pair
from tests.sql.test_move_rollback import Rollback
from tests.support.common import wait_for

pair = test_move.pair  # the two servers and the tenant of test_move, per major
moving = test_move.moving
rolling = test_move_rollback.rolling

_SENDER = """
SELECT r.active_pid, a.usename FROM pg_replication_slots r JOIN pg_stat_activity a ON a.pid = r.active_pid
 WHERE r.slot_name = %s AND a.backend_type = 'walsender'
"""


def sender(server: PostgresServer, slot: str) -> tuple[int | None, str | None]:
    """The WAL sender streaming from `slot` (its pid and login role), read as superuser."""
    rows = server.query(_SENDER, (slot,))
    return (rows[0][0], rows[0][1]) if rows else (None, None)


def reconnected(server: PostgresServer, slot: str, login: str) -> None:
    """The stream's WAL sender ended on the publishing side; the stream logs in again as `login`."""
    pid = wait_for(lambda: sender(server, slot)[0], 60, "the stream to run")
    server.query("SELECT pg_terminate_backend(%s, 10000)", (pid,))
    wait_for(lambda: sender(server, slot)[0] not in (None, pid), 60, f"the stream to log in again as {login}")
    assert sender(server, slot)[1] == login


def caught_up(progress: Callable[[], move.MoveProgress]) -> None:
    """The stream has every table and is close (an ended WAL sender counts as one error of the stream)."""

    def close() -> bool:
        now = progress()
        return now.copied and now.streaming and now.lag_bytes is not None and now.lag_bytes < 1 << 20

    wait_for(close, 120, "the stream to catch up")


def rotated(spec: TenantSpec, login: str | None = None) -> TenantSpec:
    """The tenant with a new password, on `login` (the other login role: a rotation with an overlap)."""
    return replace(spec, password=new_spec().password, login=login if login is not None else spec.login)


def writing_with(writer: Writer, spec: TenantSpec) -> None:
    """The client takes the credentials handed out for its next connection (the open one goes on)."""
    writer.pair = replace(writer.pair, spec=spec)


def replication(server: PostgresServer, role: str) -> bool:
    return server.query("SELECT rolreplication FROM pg_roles WHERE rolname = %s", (role,)) == [(True,)]


def test_a_rotation_while_the_data_is_copied_is_followed_by_the_stream_and_the_cutover_loses_nothing(
    pair: Pair, moving: tuple[Move, Writer]
) -> None:
    mover, writer = moving
    writer.writes(20)
    mover.until_copied()
    # A rotation without an overlap: a new password on the same login role, on the source that serves.
    spec = rotated(pair.spec)
    hand_out_on(mover.source, pair.name, spec.login_role, spec.password, 10, retire_other=True)
    writing_with(writer, spec)
    plan = replace(mover.plan, tenant=spec, password_id="rotated-1")
    assert move.follow_credentials(mover.source, mover.target, plan)
    assert not move.follow_credentials(mover.source, mover.target, plan)  # followed: a re-run changes nothing
    mover.plan = plan

    reconnected(pair.source, plan.slot, pair.name)
    writer.writes(100)
    caught_up(lambda: move.progress(mover.source, mover.target, plan))
    assert 0 < move.cutover(mover.source, mover.target, plan, budget=30.0) < 30
    writer.point_at(pair.target)
    writer.writes(20)  # the rotated credentials log in on the target
    writer.stop()
    rows = content(pair.target, pair.name)
    agrees(rows, writer)
    assert not can_connect(pair.target, pair.name, pair.spec.password, pair.name)


def test_rotations_within_the_window_are_followed_by_the_stream_back_and_the_rollback_loses_nothing(
    pair: Pair, rolling: tuple[Rollback, Writer]
) -> None:
    mover, writer = rolling
    name, alternate = pair.name, alternate_name(pair.name)
    writer.writes(20)
    mover.moved()
    writer.point_at(pair.target)
    writer.writes(20)

    # Without an overlap: a new password on the tenant role, on the target that serves now.
    first = rotated(pair.spec)
    hand_out_on(mover.target, name, name, first.password, 10, retire_other=True)
    writing_with(writer, first)
    back = replace(mover.back, tenant=first, password_id="rotated-1")
    assert move.follow_credentials(mover.target, mover.source, back)
    reconnected(pair.target, back.slot, name)
    writer.writes(50)

    # With an overlap: the alternate handed out with a new password; the stream moves onto it and the
    # tenant role loses REPLICATION; then the overlap ends and the tenant role is retired.
    second = rotated(first, alternate)
    hand_out_on(mover.target, name, alternate, second.password, 10)
    writing_with(writer, second)
    back = replace(back, tenant=second, password_id="rotated-2")
    assert move.follow_credentials(mover.target, mover.source, back)
    assert replication(pair.target, alternate) and not replication(pair.target, name)
    reconnected(pair.target, back.slot, alternate)
    writer.writes(50)
    with AdminSession.for_endpoint(admin_endpoint(pair.target)) as admin:
        retire_login(admin, name, name)
    assert not move.follow_credentials(mover.target, mover.source, back)
    reconnected(pair.target, back.slot, alternate)
    writer.writes(50)

    caught_up(lambda: move_rollback.reverse_progress(mover.source, mover.target, back))
    assert 0 < move_rollback.rollback(mover.source, mover.target, back, budget=30.0) < 30
    writer.point_at(pair.source)
    writer.writes(20)  # the alternate's credentials log in on the source
    writer.stop()
    rows = content(pair.source, name)
    agrees(rows, writer)
    assert can_connect(pair.source, alternate, second.password, name)
    with pair.source.superuser_connection(name) as conn:
        subscriptions = conn.execute("SELECT count(*) FROM pg_subscription").fetchone()
    assert subscriptions == (0,)
