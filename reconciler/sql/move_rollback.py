"""Rolling a completed online move back: the stream back to the source, the rollback, the window's end.

Plain functions over the provisioner's admin connections to the shard the database came from
(`source`, closed to the tenant after the cutover) and the one that serves it now (`target`). Each
is idempotent and resumable, like the steps of reconciler.sql.move. `back` is the move's plan with
the target as the publisher (its client endpoint as the source's server reaches it).

The stream back is made by the cutover inside its fence (`Reverse`, handed to `move.cutover`):

1. `Reverse.prepare`, after the marker row written on the fenced source has arrived on the target
   and the target confirmed the source's last WAL position: the source holds nothing the target
   lacks and takes no write. On the target the tenant's publication (its tables and the marker
   table, made as the tenant) and a logical slot, made by the provisioner; on the source a
   subscription owned by the provisioner (`connect = false`, `origin = none`). The slot decodes
   only what commits on the target after it is made; `origin = none` leaves out every change the
   forward subscription applied (even one committed after the slot: all of them came from the
   source, which has them). What remains are the tenant's own writes on the target, and it can
   make none before it is opened: nothing is missed and nothing is applied twice, without copying.
2. `Reverse.open`: the target's tables locked against writes (EXCLUSIVE, as the tenant), the target
   opened, the subscription enabled and refreshed (`copy_data = false`: its tables known, which it
   needs a login to the target for), then the lock released. A write waits for that instead of
   being skipped by a subscription that does not know its table yet. When an opening was
   interrupted before the refresh (the lock went with the session), the tenant may have written
   unseen: the source's tables are emptied and copied again by the refresh (`copy_data = true`).

An offline move has no stream back: `copy_back` closes the target, empties the source (its role and
database dropped and made again, closed) and copies the database back as the tenant
(reconciler.sql.move_offline), then opens the source.

`rollback` is `move.cutover` in reverse (the target fenced, a marker row, the source's position
reached, sequences set, the stream ended, the source opened); `drop_copy` drops the target's copy
after it. `end_window` ends the stream and drops the source's copy when the rollback window ends;
`end_stream_on_target` ends the stream from the target alone when the source shard is out of reach.
The tenant's password reaches the source only in the subscription's statements, on a session
checked not to log them (`move._may_subscribe`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql

from domain.naming import alternate_name
from reconciler.sql import errors, move, move_offline
from reconciler.sql.errors import SqlFailure
from reconciler.sql.move import (
    _SUBSCRIBED,
    _SUBSCRIPTION,
    MARKER_SCHEMA,
    PUBLICATION,
    SUBSCRIPTION,
    MovePlan,
    MoveProgress,
    _ident,
    _may_subscribe,
    _one,
    _schema_usage,
    _slot_exists,
    cutover,
    drop_slot,
    drop_subscription,
    open_target,
    progress,
    publish,
    slot_name,
    target_database,
    tenant_tables,
)
from reconciler.sql.move_preflight import statement_logging, tenant_database
from reconciler.sql.roles import TERMINATE_WAIT_MS, as_role
from reconciler.sql.tenant import OwnerRecord, _ensure_membership, drop_tenant, read_state

OP_ROLLBACK = "rollback"


def _refuse(detail: str) -> SqlFailure:
    return SqlFailure(OP_ROLLBACK, errors.MOVE_REFUSED, detail=detail)


def _open_to_provisioner(source: psycopg.Connection, name: str) -> None:
    """CONNECT and CREATE on the source's database for the provisioner (its subscription's worker logs
    in there as it), and USAGE on the tenant's schemas (the subscription finds its tables by name);
    granted as the tenant, as on a move's target. `move.open_target` takes them back."""
    database, me = _ident(name), _ident(source.info.user)
    row = source.execute(
        "SELECT pg_catalog.has_database_privilege(current_user, %(db)s, 'CREATE')", {"db": name}
    ).fetchone()
    if row is not None and row[0]:
        return
    with as_role(source, name):
        source.execute(sql.SQL("GRANT CONNECT, CREATE ON DATABASE {} TO {}").format(database, me))
    with target_database(source, name) as inside:
        _schema_usage(inside, name, "GRANT {} ON SCHEMA {} TO {}")


def _subscription_statement(back: MovePlan) -> sql.Composed:
    return sql.SQL(
        "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (connect = false, slot_name = {}, origin = none)"
    ).format(
        _ident(SUBSCRIPTION), sql.Literal(back.subscription_conninfo()), _ident(PUBLICATION), sql.Literal(back.slot)
    )


@dataclass(frozen=True)
class Reverse:
    """The stream back to the source, for `move.cutover` (see the module's docstring)."""

    source: psycopg.Connection
    target: psycopg.Connection
    back: MovePlan

    def check(self) -> None:
        name = self.back.name
        _open_to_provisioner(self.source, name)
        with target_database(self.source, name) as inside:
            if _one(inside, _SUBSCRIPTION, {"sub": SUBSCRIPTION}) is None:
                _may_subscribe(inside)

    def prepare(self, deadline: float) -> bool:
        name = self.back.name
        self.check()
        with target_database(self.source, name) as inside:
            if _one(inside, _SUBSCRIPTION, {"sub": SUBSCRIPTION}) is not None:
                return True
        publish(self.target, name, self.back.tenant.login)
        if not _slot_exists(self.target, self.back.slot):
            remaining = int((deadline - time.monotonic()) * 1000)
            if remaining <= 0:
                return False
            with tenant_database(self.target, name) as inside:
                # A logical slot waits for the server's transactions running when it is made.
                inside.execute(
                    "SELECT pg_catalog.set_config('statement_timeout', %(ms)s, false)", {"ms": str(remaining)}
                )
                try:
                    inside.execute(
                        "SELECT pg_catalog.pg_create_logical_replication_slot(%(s)s, 'pgoutput')", {"s": self.back.slot}
                    )
                except pgerrors.QueryCanceled:
                    return False
                except pgerrors.DuplicateObject:
                    pass  # made by an attempt whose answer was lost
        with target_database(self.source, name) as inside, inside.transaction():
            inside.execute(_subscription_statement(self.back))
            move.record_credentials(inside, self.back)
        return True

    def open(self) -> None:
        name = self.back.name
        with target_database(self.source, name) as inside:
            row = inside.execute(_SUBSCRIBED, {"sub": SUBSCRIPTION}).fetchone()
            if _one(inside, _SUBSCRIPTION, {"sub": SUBSCRIPTION}) is None or (row is not None and row[0] > 0):
                open_target(self.target, self.back.tenant, keep_marker=True)
                return  # no stream back, or started already
        recopy = read_state(self.target, name).tenant_can_connect
        with tenant_database(self.target, name) as held, held.transaction():
            held.execute(sql.SQL("SET LOCAL ROLE {}").format(_ident(name)))
            tables = tenant_tables(held, name)
            held.execute(
                sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
                    sql.SQL(", ").join(_ident(schema, table) for schema, table in tables)
                )
            )
            open_target(self.target, self.back.tenant, keep_marker=True)
            with target_database(self.source, name) as inside:
                _start(inside, name, recopy)


def _start(inside: psycopg.Connection, name: str, recopy: bool) -> None:
    """The source's subscription enabled and told its tables; `recopy`: the source's tables emptied
    first and copied again (the tenant may have written on the target before the stream knew them)."""
    subscription = _ident(SUBSCRIPTION)
    if not _one(inside, _SUBSCRIPTION, {"sub": SUBSCRIPTION}):
        inside.execute(sql.SQL("ALTER SUBSCRIPTION {} ENABLE").format(subscription))
    if recopy:
        tables = tenant_tables(inside, name)
        with as_role(inside, name):
            inside.execute(
                sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(_ident(schema, table) for schema, table in tables))
            )
    copy = sql.Literal(recopy)
    inside.execute(
        sql.SQL("ALTER SUBSCRIPTION {} REFRESH PUBLICATION WITH (copy_data = {})").format(subscription, copy)
    )


def reverse_streaming(source: psycopg.Connection, name: str) -> bool:
    """Whether the source's database holds the stream back (its subscription)."""
    state = read_state(source, name)
    if not state.database_exists:
        return False
    with tenant_database(source, name) as inside:
        return _one(inside, _SUBSCRIPTION, {"sub": SUBSCRIPTION}) is not None


def reverse_progress(source: psycopg.Connection, target: psycopg.Connection, back: MovePlan) -> MoveProgress:
    """How far the stream back is: its tables, and the target's WAL the source has not confirmed."""
    return progress(target, source, back)


def rollback(source: psycopg.Connection, target: psycopg.Connection, back: MovePlan, budget: float = 30.0) -> float:
    """The cutover in reverse (`move.cutover` with the target as the fenced side); the write pause.

    The subscription's login follows the login role and password handed out now before the fence
    (`move.follow_credentials`; always, when the plan knows no password id). `move.CutoverTimedOut`
    when the source did not catch up within `budget`: the target serves again and the stream goes on.
    Refused without the stream back (it ended, or the move was made without one).
    """
    name = back.name
    if read_state(source, name).tenant_can_connect:
        return 0.0
    if read_state(target, name).tenant_can_connect:  # not fenced yet: the stream must be there
        if not reverse_streaming(source, name):
            raise _refuse("the stream back to the source has ended")
        with target_database(source, name) as inside:
            if statement_logging(inside):
                raise _refuse("the source shard would log the subscription's statement")
        move.follow_credentials(target, source, back, always=back.password_id is None)
    return cutover(target, source, back, budget)


def copy_back(
    source: psycopg.Connection,
    target: psycopg.Connection,
    back: MovePlan,
    pg_dump: Path,
    pg_restore: Path,
    cancelled: Callable[[], bool] = lambda: False,
) -> None:
    """The offline rollback: the target closed (writes pause from here), the source emptied unless the
    copy reached it already (the marker restored with everything else says so), the database copied
    back, the source opened. Run again after an interruption it finishes what is left."""
    name = back.name
    if read_state(source, name).tenant_can_connect:
        return
    move.fence_source(target, name)
    state = read_state(source, name)
    copied = False
    if state.database_exists and state.allow_connections:
        with tenant_database(source, name) as inside:
            copied = move._has_marker(inside)
    if not copied:
        owner = back.tenant.owner
        if state.role_exists and owner is not None and state.owner != owner:
            raise _refuse("the source's tenant role belongs to another database")
        drop_tenant(source, name)
        move.prepare_target(source, back.tenant)
        move_offline.copy_database(target, source, back, pg_dump, pg_restore, cancelled=cancelled)
    move_offline.open_offline(target, source, back)


def drop_copy(source: psycopg.Connection, target: psycopg.Connection, name: str, owner: OwnerRecord | None) -> None:
    """After a rollback: the target's copy (role and database, made by the move) dropped. Refused
    while the source does not serve the tenant."""
    if not read_state(source, name).tenant_can_connect:
        raise _refuse("the source does not serve the database")
    state = read_state(target, name)
    if state.role_exists and (owner is None or state.owner == owner):
        drop_tenant(target, name)


def end_stream_back(source: psycopg.Connection, target: psycopg.Connection, name: str) -> None:
    """The stream back ended: the source's subscription, the target's slot, publication and marker,
    and the tenant's REPLICATION there. Refused while the source serves the tenant."""
    if read_state(source, name).tenant_can_connect:
        raise _refuse("the source serves the database")
    if read_state(source, name).database_exists:
        with tenant_database(source, name) as inside:
            drop_subscription(inside)
    drop_slot(target, slot_name(name))
    _unpublish(target, name)
    move.no_replication(target, name)


def _unpublish(target: psycopg.Connection, name: str) -> None:
    """The stream back's publication and the marker dropped on the target (as the tenant)."""
    if read_state(target, name).database_exists:
        with tenant_database(target, name) as inside, as_role(inside, name):
            inside.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(_ident(PUBLICATION)))
            inside.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(_ident(MARKER_SCHEMA)))


_SLOT_SENDER = """
SELECT pg_catalog.pg_terminate_backend(s.active_pid, %(wait)s::bigint)
  FROM pg_catalog.pg_replication_slots s JOIN pg_catalog.pg_stat_activity a ON a.pid = s.active_pid
 WHERE s.slot_name = %(s)s AND a.usename = current_user
"""


def end_stream_on_target(target: psycopg.Connection, name: str) -> None:
    """The stream back ended from the target alone (the source shard is out of reach, its subscription
    left as it is): REPLICATION taken back, so that the subscription starts no new WAL sender; the
    running one ended, as its login role (the provisioner may signal no other backend); the slot, the
    publication and the marker dropped, so that nothing holds the target's WAL."""
    move.no_replication(target, name)
    state = read_state(target, name)
    if state.role_exists:
        logins = [name]
        if state.alternate_oid is not None:
            _ensure_membership(target, alternate_name(name), state.alternate_oid)
            logins.append(alternate_name(name))
        for login in logins:
            with as_role(target, login):
                target.execute(_SLOT_SENDER, {"s": slot_name(name), "wait": TERMINATE_WAIT_MS}).fetchall()
    drop_slot(target, slot_name(name))
    _unpublish(target, name)


def end_window(source: psycopg.Connection, target: psycopg.Connection, name: str) -> None:
    """The rollback window's end: the stream back ended and the source's copy dropped (unless its
    role records another owner than the target's). Refused while the source serves the tenant."""
    end_stream_back(source, target, name)
    state, serving = read_state(source, name), read_state(target, name)
    if state.role_exists and (serving.owner is None or state.owner == serving.owner):
        drop_tenant(source, name)
