"""What stands in the way of moving a tenant database online: the preflight of a move, read-only.

Plain functions over an admin connection. A move copies a tenant with logical replication: the
source publishes the tenant's tables (as the tenant), the target subscribes (as the provisioner),
and a rollback reverses the two, so each shard of an online move needs everything both sides need:

- PostgreSQL 16 or later (`pg_create_subscription`, and a CREATEROLE role that may give
  REPLICATION to the roles it created);
- `wal_level = logical` (changing it needs a server restart);
- REPLICATION on the provisioner (so it may give it to the tenant role, whose login the
  subscription uses) and membership in `pg_create_subscription` (with its privileges);
- a free replication slot and a free WAL sender for the move's stream, and a free logical
  replication worker (and, from PostgreSQL 18, a replication origin) for its subscription (on the
  target during the move, on the source for the stream back during the rollback window);
- no statement logging for the provisioner (CREATE SUBSCRIPTION carries the tenant's password).

Inside the tenant's database (`tenant_database`), what logical replication would not carry or would
break: tables without a replica identity (their UPDATE and DELETE would fail on the source once
published), large objects (not replicated), extensions the target does not offer.

Each finding is an `Obstacle`: a stable `code` (for conditions and tests) and a message that says
what to do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import psycopg
from psycopg import sql

from reconciler.sql.roles import as_role
from reconciler.sql.session import connect_database

ONLINE_MAJOR = 16  # pg_create_subscription; REPLICATION grantable by a CREATEROLE role holding it
CREATE_SUBSCRIPTION_ROLE = "pg_create_subscription"

# Obstacle codes.
SERVER_VERSION = "server_version"
WAL_LEVEL = "wal_level"
REPLICATION_ATTRIBUTE = "replication_attribute"
CREATE_SUBSCRIPTION = "create_subscription"
REPLICATION_SLOTS = "replication_slots"
WAL_SENDERS = "wal_senders"
LOGICAL_WORKERS = "logical_replication_workers"
REPLICATION_ORIGINS = "replication_origins"
STATEMENT_LOGGING = "statement_logging"
REPLICA_IDENTITY = "replica_identity"
LARGE_OBJECTS = "large_objects"
EXTENSION_MISSING = "extension_missing"


@dataclass(frozen=True)
class Obstacle:
    """One thing a shard or a database lacks for the online path, as a user should read it."""

    code: str
    message: str


@dataclass(frozen=True)
class ShardFacts:
    """What the preflight reads of a shard, as its provisioner sees it."""

    server_version_num: int
    role: str
    wal_level: str
    replication: bool
    create_subscription: bool  # has the privileges of pg_create_subscription (False before 16)
    max_replication_slots: int
    used_replication_slots: int
    max_wal_senders: int
    used_wal_senders: int
    max_logical_replication_workers: int
    enabled_subscriptions: int  # each takes a logical replication worker (and a replication origin) while it runs
    max_active_replication_origins: int | None = None  # PostgreSQL 18 and later; before, max_replication_slots
    statement_logging: tuple[str, ...] = ()  # settings under which its statements' text is logged

    @property
    def major(self) -> int:
        return self.server_version_num // 10000


_SHARD = """
SELECT current_setting('server_version_num')::int, r.rolname, current_setting('wal_level'), r.rolreplication,
       coalesce((SELECT pg_catalog.pg_has_role(r.oid, m.oid, 'USAGE')
                   FROM pg_catalog.pg_roles m WHERE m.rolname = %(create_subscription)s), false),
       current_setting('max_replication_slots')::int,
       (SELECT count(*) FROM pg_catalog.pg_replication_slots)::int,
       current_setting('max_wal_senders')::int,
       (SELECT count(*) FROM pg_catalog.pg_stat_replication)::int,
       current_setting('max_logical_replication_workers')::int,
       (SELECT count(*) FROM pg_catalog.pg_subscription WHERE subenabled)::int,
       current_setting('max_active_replication_origins', true)::int
  FROM pg_catalog.pg_roles r
 WHERE r.rolname = current_user
"""


def read_shard(conn: psycopg.Connection) -> ShardFacts:
    """The server version, settings and the provisioner's attributes that an online move needs."""
    row = conn.execute(_SHARD, {"create_subscription": CREATE_SUBSCRIPTION_ROLE}).fetchone()
    if row is None:
        raise RuntimeError("the shard query returned no row")
    return replace(ShardFacts(*row), statement_logging=tuple(statement_logging(conn)))


_LOGGING = """
SELECT current_setting('log_statement'), current_setting('log_min_duration_statement'),
       coalesce(current_setting('pg_stat_statements.track_utility', true), 'off')
"""


def statement_logging(conn: psycopg.Connection) -> list[str]:
    """The settings of this session under which the server records the text of a successful statement
    (in its log, or in pg_stat_statements): empty when it records none. The provisioner's role
    settings apply, so this answers for every session of the provisioner on the shard."""
    row = conn.execute(_LOGGING).fetchone()
    if row is None:
        raise RuntimeError("the settings query returned no row")
    log_statement, min_duration, track_utility = row
    found = []
    if log_statement != "none":
        found.append(f"log_statement = {log_statement}")
    if min_duration != "-1":
        found.append(f"log_min_duration_statement = {min_duration}")
    if track_utility != "off":
        found.append("pg_stat_statements.track_utility = on")
    return found


def shard_obstacles(facts: ShardFacts) -> list[Obstacle]:
    """What the shard lacks for online moves (from it and, for a rollback, back to it)."""
    if facts.major < ONLINE_MAJOR:
        return [
            Obstacle(
                SERVER_VERSION,
                f"PostgreSQL {facts.major} cannot take part in an online move: it needs PostgreSQL "
                f"{ONLINE_MAJOR} or later (only the offline path is possible)",
            )
        ]
    found = []
    if facts.wal_level != "logical":
        found.append(
            Obstacle(
                WAL_LEVEL,
                f"wal_level is {facts.wal_level}: set wal_level = logical (needs a server restart)",
            )
        )
    if not facts.replication:
        found.append(
            Obstacle(
                REPLICATION_ATTRIBUTE,
                f"the provisioner role {facts.role} lacks REPLICATION: a superuser runs "
                f"ALTER ROLE {facts.role} REPLICATION",
            )
        )
    if not facts.create_subscription:
        found.append(
            Obstacle(
                CREATE_SUBSCRIPTION,
                f"the provisioner role {facts.role} is not a member of {CREATE_SUBSCRIPTION_ROLE}: a superuser "
                f"runs GRANT {CREATE_SUBSCRIPTION_ROLE} TO {facts.role}",
            )
        )
    if facts.used_replication_slots >= facts.max_replication_slots:
        found.append(
            Obstacle(
                REPLICATION_SLOTS,
                f"no free replication slot ({facts.used_replication_slots} of max_replication_slots = "
                f"{facts.max_replication_slots} in use): raise max_replication_slots (needs a restart)",
            )
        )
    if facts.statement_logging:
        found.append(
            Obstacle(
                STATEMENT_LOGGING,
                f"the statements of the provisioner role {facts.role} are logged "
                f"({', '.join(facts.statement_logging)}), and the subscription's statement carries the "
                f"tenant's password: a superuser runs ALTER ROLE {facts.role} SET log_statement = 'none' "
                "(and SET log_min_duration_statement = -1, SET pg_stat_statements.track_utility = off where "
                "those are set)",
            )
        )
    if facts.used_wal_senders >= facts.max_wal_senders:
        found.append(
            Obstacle(
                WAL_SENDERS,
                f"no free WAL sender ({facts.used_wal_senders} of max_wal_senders = {facts.max_wal_senders} in "
                "use): raise max_wal_senders (needs a restart)",
            )
        )
    if facts.enabled_subscriptions >= facts.max_logical_replication_workers:
        found.append(
            Obstacle(
                LOGICAL_WORKERS,
                f"no free logical replication worker ({facts.enabled_subscriptions} subscriptions of "
                f"max_logical_replication_workers = {facts.max_logical_replication_workers}; an open rollback "
                "window keeps one on the source): raise max_logical_replication_workers and "
                "max_worker_processes (needs a restart), or wait for rollback windows to end",
            )
        )
    origins = facts.max_active_replication_origins
    if origins is not None and facts.enabled_subscriptions >= origins:
        found.append(
            Obstacle(
                REPLICATION_ORIGINS,
                f"no free replication origin ({facts.enabled_subscriptions} subscriptions of "
                f"max_active_replication_origins = {origins}; an open rollback window keeps one on the "
                "source): raise max_active_replication_origins (needs a restart), or wait for rollback "
                "windows to end",
            )
        )
    return found


# -- inside the tenant's database --------------------------------------------------------------


@contextmanager
def tenant_database(conn: psycopg.Connection, tenant: str) -> Iterator[psycopg.Connection]:
    """A session of the provisioner in the tenant's database, for reading its catalog.

    Only the tenant may connect to its database. As the tenant (the provisioner holds SET on its
    role) CONNECT is granted to the provisioner for the login and revoked right after it (CONNECT is
    checked at login only); a grant that was there before is left as it was.
    """
    database = sql.Identifier(tenant)
    me = sql.Identifier(conn.info.user)
    row = conn.execute(
        "SELECT pg_catalog.has_database_privilege(current_user, %(db)s, 'CONNECT')", {"db": tenant}
    ).fetchone()
    had_connect = bool(row and row[0])
    if not had_connect:
        with as_role(conn, tenant):
            conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, me))
    try:
        inside = connect_database(conn, tenant)
    finally:
        if not had_connect:
            with as_role(conn, tenant):
                conn.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(database, me))
    with inside:
        yield inside


_WITHOUT_IDENTITY = """
SELECT pg_catalog.format('%I.%I', n.nspname, c.relname)
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind = 'r' AND c.relpersistence = 'p' AND n.nspname NOT IN ('pg_catalog', 'information_schema')
   AND (c.relreplident = 'n'
        OR (c.relreplident = 'd' AND NOT EXISTS (
              SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisprimary))
        OR (c.relreplident = 'i' AND NOT EXISTS (
              SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisreplident)))
 ORDER BY n.nspname, c.relname
"""


def tables_without_replica_identity(conn: psycopg.Connection) -> list[str]:
    """The database's permanent tables whose UPDATE and DELETE would fail once published, as
    schema.table (quoted where SQL needs it; characters that are not printable escaped, since the
    tenant chose the names and they end up in a terminal or a condition)."""
    return [_printable(name) for (name,) in conn.execute(_WITHOUT_IDENTITY)]


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in text)


def large_object_count(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM pg_catalog.pg_largeobject_metadata").fetchone()
    return int(row[0]) if row else 0


def installed_extensions(conn: psycopg.Connection) -> list[str]:
    """The extensions created in the database (plpgsql, in every database, left out)."""
    return [name for (name,) in conn.execute("SELECT extname FROM pg_catalog.pg_extension ORDER BY 1")]


def available_extensions(conn: psycopg.Connection) -> set[str]:
    """The extensions a database on this server could create."""
    return {name for (name,) in conn.execute("SELECT name FROM pg_catalog.pg_available_extensions")}


def database_obstacles(inside: psycopg.Connection, target_extensions: set[str]) -> list[Obstacle]:
    """What in the tenant's database (a session in it) logical replication would not carry."""
    found = []
    keyless = tables_without_replica_identity(inside)
    if keyless:
        shown = ", ".join(keyless[:10]) + (f" and {len(keyless) - 10} more" if len(keyless) > 10 else "")
        found.append(
            Obstacle(
                REPLICA_IDENTITY,
                f"{len(keyless)} table(s) without a primary key or replica identity ({shown}): add a primary "
                "key, or ALTER TABLE ... REPLICA IDENTITY FULL",
            )
        )
    objects = large_object_count(inside)
    if objects:
        found.append(
            Obstacle(
                LARGE_OBJECTS,
                f"{objects} large object(s): logical replication does not copy large objects; "
                "move the data into bytea columns or use the offline path",
            )
        )
    missing = [name for name in installed_extensions(inside) if name not in target_extensions]
    if missing:
        found.append(
            Obstacle(
                EXTENSION_MISSING,
                f"extension(s) not available on the target shard: {', '.join(missing)}",
            )
        )
    return found
