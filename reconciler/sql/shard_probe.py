"""The Shard controller's probe of a shard on a fresh admin session: who am I, can I write, how far
away, how many connections the server allows.

One operation ("check") of one statement: the provisioner's role and the server version (what
provisioner.read_provisioner reads), whether the server can write, its connection slots (the input
of the shard's connection budget, reconciler.shard.budget), and the round trip of that statement,
which the controller uses to size its next timeouts (one round trip matters on a slow link). A
server that cannot write is not a shard placements can use, however well it answers: a standby
(`pg_is_in_recovery()`, e.g. the admin Service points at a replica after a failover) or a server
whose new sessions are read-only (`default_transaction_read_only`, e.g. set by an operator or by a
disk-space guard). On a primary it also reads the timeline (the first 8 hex digits of the current WAL
file's name, callable without superuser): a promotion starts a new one (reconciler.shard.failover).

A full disk does not show in any setting: a write fails with `disk_full` (53100). `probe_write` is
such a write, small and side-effect free (about 256 kB into a temporary table that is dropped with
its transaction: extending a file needs free space, as any CREATE DATABASE or catalog change does).
The Shard controller runs it only for a shard whose SQL failed with `disk_full`, until it passes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg

from domain.connection_budget import ServerSlots
from reconciler.sql.provisioner import ProvisionerInfo
from reconciler.sql.session import OPERATION_TIMEOUT, Admin, run_operation

_PROBE = """
SELECT current_setting('server_version_num')::int, rolname, rolsuper, rolcreatedb, rolcreaterole,
       rolinherit, rolcanlogin,
       pg_catalog.pg_is_in_recovery(),
       pg_catalog.current_setting('default_transaction_read_only')::bool,
       pg_catalog.current_setting('transaction_read_only')::bool,
       current_setting('max_connections')::int,
       current_setting('superuser_reserved_connections')::int,
       coalesce(current_setting('reserved_connections', true)::int, 0),
       CASE WHEN NOT pg_catalog.pg_is_in_recovery()
            THEN substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8) END
  FROM pg_catalog.pg_roles
 WHERE rolname = current_user
"""
_PROVISIONER_COLUMNS = 7
_WRITABILITY_COLUMNS = 3  # then the server's slots; reserved_connections exists from 16 on (NULL before)
_SLOT_COLUMNS = 3  # then the primary's timeline


@dataclass(frozen=True)
class Writability:
    """Whether a new session on the shard could write."""

    in_recovery: bool
    default_read_only: bool
    read_only: bool

    def problem(self) -> str | None:
        """Why nothing can be written, or None."""
        if self.in_recovery:
            return "the server is in recovery (a standby) and cannot write; is the admin Service the primary's?"
        if self.default_read_only or self.read_only:
            return "new sessions are read-only (default_transaction_read_only is on)"
        return None


@dataclass(frozen=True)
class ShardProbe:
    info: ProvisionerInfo
    writability: Writability
    slots: ServerSlots
    round_trip: float  # seconds of one statement on the open session
    timeline: int | None = None  # the primary's timeline (None on a standby)


def read_probe(conn: psycopg.Connection) -> ShardProbe:
    """The probe's one statement, timed."""
    started = time.monotonic()
    row = conn.execute(_PROBE).fetchone()
    round_trip = time.monotonic() - started
    if row is None:
        raise RuntimeError("the provisioner's own role is not in pg_roles")
    info = ProvisionerInfo(*row[:_PROVISIONER_COLUMNS])
    slots_at = _PROVISIONER_COLUMNS + _WRITABILITY_COLUMNS
    writability = Writability(*row[_PROVISIONER_COLUMNS:slots_at])
    slots = ServerSlots(*row[slots_at : slots_at + _SLOT_COLUMNS])
    wal_timeline = row[slots_at + _SLOT_COLUMNS]
    timeline = int(wal_timeline, 16) if wal_timeline is not None else None
    return ShardProbe(info, writability, slots, round_trip, timeline)


def probe_shard(admin: Admin, *, timeout: float = OPERATION_TIMEOUT) -> ShardProbe:
    """Run the probe (operation "check"; a SqlFailure on failure)."""
    return run_operation(admin, "check", read_probe, timeout=timeout)


_PROBE_TABLE = "CREATE TEMPORARY TABLE dbprovider_write_probe (filler text) ON COMMIT DROP"
_PROBE_WRITE = "INSERT INTO dbprovider_write_probe SELECT repeat('x', 1000) FROM generate_series(1, 256)"


def write_something(conn: psycopg.Connection) -> None:
    with conn.transaction():
        conn.execute(_PROBE_TABLE)
        conn.execute(_PROBE_WRITE)


def probe_write(admin: Admin, *, timeout: float = OPERATION_TIMEOUT) -> None:
    """A small write that needs free disk space (operation "write probe"; SqlFailure disk_full if none)."""
    run_operation(admin, "write probe", write_something, timeout=timeout)
