"""Moving a tenant database to another shard online: the steps, each idempotent and resumable.

Plain functions over the provisioner's admin connections to the two shards (`source`, `target`).
Each step reads the catalog first and does only what is missing, so a step interrupted at any point
(a crash, a lost connection) is finished by running it again. In order:

1. `prepare_target`: on the target, the tenant role with the same name and password, and its
   database, closed to the tenant (only the provisioner may connect, for the copy). When the
   tenant's alternate login role is handed out (`TenantSpec.login`), the target gets it too, with
   the same password, membership and role setting, and the tenant role without login, as on the source.
2. `copy_schema`: a marker table (`dbprovider_move.marker`) made as the tenant on the source, then
   the tenant's schema dumped as the tenant (`pg_dump --schema-only`, logging in with the tenant's
   credentials, whichever login role they name, with `--role` the tenant) and replayed on the target
   as the tenant, in one transaction.
3. `publish`: REPLICATION for the login role handed out on the source (its login carries the
   stream) and a publication of the tenant's tables, made as (and owned by) the tenant role.
4. `subscribe`: the replication slot on the source, and on the target a subscription owned by the
   provisioner (changes are applied as the tables' owner, the tenant), then the initial copy.
5. `progress`: tables copied and the stream's lag in bytes of WAL, for waiting until caught up.
6. `cutover`: the fence (CONNECT revoked from the tenant on the source, its sessions ended), a
   marker row written on the source and waited for on the target (it arrives after every earlier
   commit), every sequence set, the stream ended, the target opened. When the marker does not arrive
   within the write-pause budget the source is opened again and the stream kept (`CutoverTimedOut`).
   The source stays closed as the rollback copy; given a `ReverseStream`
   (reconciler.sql.move_rollback), the cutover also makes the stream that keeps it current.
7. `abort` (before the cutover): the source opened again, stream (and a stream back made by a
   cutover that did not finish) and marker dropped, the target's tenant dropped.

CREATE SUBSCRIPTION carries the tenant's password in its connection string (PostgreSQL demands a
password of a subscription owner that is not a superuser). It is only ever sent in a statement that
does not connect (`connect = false`, so it cannot fail on the network), after the privileges it
needs were checked (a failing statement's text is logged at PostgreSQL's default settings), on a
session whose settings record no statement text (`statement_logging`; `subscribe` refuses
otherwise). The password never appears in a return value or an error here.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql
from psycopg.conninfo import make_conninfo

from domain.naming import alternate_name
from reconciler.sql import errors
from reconciler.sql.children import die_with_parent
from reconciler.sql.errors import SqlFailure
from reconciler.sql.login_roles import hand_out_on, other_login
from reconciler.sql.move_preflight import statement_logging, tenant_database
from reconciler.sql.roles import TERMINATE_WAIT_MS, as_role
from reconciler.sql.session import connect_database
from reconciler.sql.tenant import (
    TenantSpec,
    _ensure_membership,
    drop_tenant,
    ensure_database,
    ensure_membership,
    ensure_role,
    read_state,
)

OP_MOVE = "move"
OP_CUTOVER = "cutover"
OP_ABORT = "abort move"

PUBLICATION = "dbprovider_move"
SUBSCRIPTION = "dbprovider_move"
MARKER_SCHEMA = "dbprovider_move"
MARKER_TABLE = "marker"
APPLICATION_NAME = "dbprovider-move"
DUMP_TIMEOUT = 600.0  # seconds for pg_dump of one tenant's schema
POLL = 0.1  # seconds between catalog reads while waiting
SLOT_RELEASE_WAIT = 15.0  # seconds for the source's WAL sender to let go of the slot after DISABLE


def slot_name(tenant: str) -> str:
    """The replication slot of a tenant's stream on its publisher: unique per tenant (slot names are per server)."""
    return "dbprovider_move_" + hashlib.sha256(tenant.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class MovePlan:
    """One tenant's move: its credentials, and the source shard as the target's server reaches it."""

    tenant: TenantSpec
    source_host: str
    source_port: int
    sslmode: str = "require"
    sslrootcert: str | None = field(default=None)  # a CA file path on the target's server
    password_id: str | None = None  # the credentials Secret's id of the password (random: tells nothing of it)

    @property
    def name(self) -> str:
        return self.tenant.name

    @property
    def slot(self) -> str:
        return slot_name(self.name)

    @property
    def credentials(self) -> str:
        """What the stream records of the credentials it logs in with (the subscription's comment): the
        login role and the password's id, never the password."""
        return f"dbprovider: login {self.tenant.login_role} password {self.password_id or '-'}"

    def subscription_conninfo(self) -> str:
        """The tenant's login (the role handed out) to its source database; holds the password, so never log it."""
        extra = {"sslrootcert": self.sslrootcert} if self.sslrootcert else {}
        return make_conninfo(
            host=self.source_host,
            port=str(self.source_port),
            dbname=self.name,
            user=self.tenant.login_role,
            password=self.tenant.password,
            sslmode=self.sslmode,
            application_name=APPLICATION_NAME,
            **extra,
        )


@dataclass(frozen=True)
class MoveProgress:
    """How far the initial copy and the stream are (read from both shards)."""

    tables: int  # tables of the subscription
    ready: int  # of those, copied and streaming
    lag_bytes: int | None  # WAL on the source the target has not confirmed; None: no slot
    errors: int  # apply and copy errors the subscription met so far (e.g. a table changed on the source)
    streaming: bool = True  # a WAL sender streams from the slot (False: the stream is not logged in now)

    @property
    def copied(self) -> bool:
        return self.tables > 0 and self.ready == self.tables


class CutoverTimedOut(SqlFailure):
    """The target did not confirm the fenced source's last change within the budget; the source
    serves again and the stream continues (a later cutover may succeed)."""

    def __init__(self) -> None:
        super().__init__(OP_CUTOVER, errors.TIMEOUT, detail="the target did not catch up within the write-pause budget")


def _refuse(operation: str, detail: str) -> SqlFailure:
    return SqlFailure(operation, errors.MOVE_REFUSED, detail=detail)


def _ident(*names: str) -> sql.Identifier:
    return sql.Identifier(*names)


# -- sessions ----------------------------------------------------------------------------------


@contextmanager
def target_database(target: psycopg.Connection, name: str) -> Iterator[psycopg.Connection]:
    """The provisioner's session in the tenant's target database (which `prepare_target` opened to it)."""
    with connect_database(target, name) as inside:
        yield inside


def _one(conn: psycopg.Connection, query: str | sql.SQL | sql.Composed, params: Mapping[str, Any] | None = None) -> Any:
    """The first column of the first row (None: no row)."""
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


# -- 1. the target's role and database ---------------------------------------------------------


def prepare_target(target: psycopg.Connection, tenant: TenantSpec) -> None:
    """The tenant's role (same name and password) and database on the target, closed to the tenant.

    The database accepts connections (the subscription's apply worker and the provisioner need
    them) but grants CONNECT and CREATE to the provisioner only; `open_target` gives the tenant its
    CONNECT at the cutover. A target the tenant may already connect to is left alone.
    """
    ensure_role(target, tenant)
    ensure_membership(target, tenant)
    ensure_database(target, tenant)
    state = read_state(target, tenant.name)
    if state.tenant_can_connect:
        return
    if tenant.login_role != tenant.name:  # the alternate logs in, the tenant role does not (as on the source)
        hand_out_on(target, tenant.name, tenant.login_role, tenant.password, tenant.connection_limit, retire_other=True)
    database, me = _ident(tenant.name), _ident(target.info.user)
    with as_role(target, tenant.name):
        target.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(database))
        # The owner's own entry appears with the first REVOKE; CONNECT comes back at the cutover.
        target.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(database, database))
        target.execute(sql.SQL("GRANT CONNECT, CREATE ON DATABASE {} TO {}").format(database, me))
        if not state.allow_connections:
            target.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(database))


# -- 2. the schema -----------------------------------------------------------------------------

_MARKER_EXISTS = """
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = %(schema)s AND c.relname = %(table)s)
"""


def _has_marker(inside: psycopg.Connection) -> bool:
    return bool(_one(inside, _MARKER_EXISTS, {"schema": MARKER_SCHEMA, "table": MARKER_TABLE}))


def ensure_marker(inside: psycopg.Connection, name: str) -> None:
    """The marker table in the tenant's database, owned by the tenant (so it can be published)."""
    if _has_marker(inside):
        return
    with as_role(inside, name):
        inside.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(_ident(MARKER_SCHEMA)))
        inside.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (token text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())"
            ).format(_ident(MARKER_SCHEMA, MARKER_TABLE))
        )


def dump_schema(
    source: psycopg.Connection,
    plan: MovePlan,
    pg_dump: Path,
    tables: list[tuple[str, str]] | None = None,
    timeout: float = DUMP_TIMEOUT,
) -> str:
    """The tenant's schema as SQL (or only `tables`' definitions, with their indexes, constraints and
    owned sequences), dumped by `pg_dump` logged in with the tenant's credentials (the tenant role or
    its alternate, acting as the tenant) to its source database.

    `pg_dump` must be of the target's major (its output sets what that server knows). Owners and
    privileges are left out: the replay runs as the tenant, which owns what it creates. The password
    reaches pg_dump in its environment only; pg_dump's own messages are not passed on.
    """
    params = {
        key: value
        for key, value in source.info.get_parameters().items()
        if key in ("host", "hostaddr", "port", "sslmode", "sslrootcert", "sslcert", "sslkey", "require_auth")
    }
    conninfo = make_conninfo(**params, user=plan.tenant.login_role, dbname=plan.name, application_name=APPLICATION_NAME)
    key = secrets.token_hex(16)
    env = {"PATH": os.environ.get("PATH", ""), "PGPASSWORD": plan.tenant.password, "PGCONNECT_TIMEOUT": "10"}
    argv = [
        str(pg_dump),
        "--schema-only",
        "--no-owner",
        "--no-privileges",
        "--no-publications",
        "--no-subscriptions",
        "--no-security-labels",
        "--no-tablespaces",
        f"--restrict-key={key}",
        f"--role={plan.name}",  # the alternate login role acts as the tenant (its role setting says so too)
        f"--dbname={conninfo}",
    ]
    # A quoted pattern matches the name literally (pg_dump's patterns are psql's).
    argv += [f"--table={sql.Identifier(schema, table).as_string(source)}" for schema, table in tables or ()]
    try:
        done = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            preexec_fn=die_with_parent(),  # this thread waits for it (children.py)
        )
    except subprocess.TimeoutExpired:
        raise SqlFailure(OP_MOVE, errors.TIMEOUT, detail="pg_dump of the schema did not finish") from None
    if done.returncode != 0:
        raise SqlFailure(OP_MOVE, errors.OTHER, detail=f"pg_dump of the schema exited with {done.returncode}")
    # psql meta-commands around the script (\restrict, \unrestrict) with our key: not SQL.
    meta = {f"\\restrict {key}", f"\\unrestrict {key}"}
    return "\n".join(line for line in done.stdout.splitlines() if line not in meta)


def copy_schema(source: psycopg.Connection, target: psycopg.Connection, plan: MovePlan, pg_dump: Path) -> None:
    """The marker on the source, then the tenant's schema (marker included) replayed on the target as
    the tenant in one transaction: the marker on the target says the copy is complete."""
    with target_database(target, plan.name) as inside:
        if _has_marker(inside):
            return
    with tenant_database(source, plan.name) as inside:
        ensure_marker(inside, plan.name)
    _replay(target, plan.name, dump_schema(source, plan, pg_dump))


def _replay(target: psycopg.Connection, name: str, script: str) -> None:
    """A dump replayed on the target as the tenant, in one transaction with the provisioner's USAGE
    on the tenant's schemas (the subscription finds its tables by name)."""
    with target_database(target, name) as inside:
        with inside.transaction():
            inside.execute(sql.SQL("SET LOCAL ROLE {}").format(_ident(name)))
            inside.execute(script.encode())
            _schema_usage(inside, name, "GRANT {} ON SCHEMA {} TO {}")


# The tenant's schemas on the target; the subscription (the provisioner's) finds its tables by name.
_TENANT_SCHEMAS = """
SELECT nspname FROM pg_catalog.pg_namespace
 WHERE nspowner = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = %(tenant)s) ORDER BY 1
"""


def _schema_usage(inside: psycopg.Connection, name: str, statement: str) -> None:
    """GRANT or REVOKE (`statement`) USAGE on the tenant's schemas to or from the provisioner, as the tenant."""
    me = _ident(inside.info.user)
    schemas = [schema for (schema,) in inside.execute(_TENANT_SCHEMAS, {"tenant": name})]
    with as_role(inside, name):
        for schema in schemas:
            inside.execute(sql.SQL(statement).format(sql.SQL("USAGE"), _ident(schema), me))


# -- 3. the publication ------------------------------------------------------------------------

# The tenant's permanent tables (a partitioned table stands for its partitions).
_TENANT_TABLES = """
SELECT n.nspname, c.relname
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p') AND c.relpersistence = 'p' AND NOT c.relispartition
   AND c.relowner = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = %(tenant)s)
   AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%'
 ORDER BY 1, 2
"""
_PUBLISHED = "SELECT schemaname, tablename FROM pg_catalog.pg_publication_tables WHERE pubname = %(pub)s ORDER BY 1, 2"


def tenant_tables(inside: psycopg.Connection, name: str) -> list[tuple[str, str]]:
    return [(schema, table) for schema, table in inside.execute(_TENANT_TABLES, {"tenant": name})]


def publish(source: psycopg.Connection, name: str, login: str | None = None) -> None:
    """REPLICATION for the login role handed out (`login`, default the tenant role: the stream logs
    in as it) and, as the tenant, a publication of every table of the tenant (owned by the tenant
    role); run again, it adds the tables created since."""
    replication(source, login or name)
    with tenant_database(source, name) as inside:
        tables = tenant_tables(inside, name)
        listed = sql.SQL(", ").join(_ident(schema, table) for schema, table in tables)
        exists = _one(
            inside, "SELECT count(*) FROM pg_catalog.pg_publication WHERE pubname = %(p)s", {"p": PUBLICATION}
        )
        with as_role(inside, name):
            if not exists:
                inside.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(_ident(PUBLICATION), listed))
            elif list(inside.execute(_PUBLISHED, {"pub": PUBLICATION})) != tables:
                inside.execute(sql.SQL("ALTER PUBLICATION {} SET TABLE {}").format(_ident(PUBLICATION), listed))


def unpublished_tables(source: psycopg.Connection, name: str) -> list[tuple[str, str]]:
    """Tables of the tenant that the publication lacks (made after the schema was copied)."""
    with tenant_database(source, name) as inside:
        published = set(inside.execute(_PUBLISHED, {"pub": PUBLICATION}))
        return [(s, t) for s, t in tenant_tables(inside, name) if (s, t) not in published]


# -- 4. the subscription -----------------------------------------------------------------------

_SUBSCRIPTION = """
SELECT s.subenabled FROM pg_catalog.pg_subscription s
 WHERE s.subname = %(sub)s AND s.subdbid = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
"""
_SUBSCRIBED = """
SELECT count(*), count(*) FILTER (WHERE r.srsubstate = 'r')
  FROM pg_catalog.pg_subscription_rel r JOIN pg_catalog.pg_subscription s ON s.oid = r.srsubid
 WHERE s.subname = %(sub)s AND s.subdbid = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
"""


def _slot_exists(source: psycopg.Connection, slot: str) -> bool:
    return bool(
        _one(source, "SELECT count(*) FROM pg_catalog.pg_replication_slots WHERE slot_name = %(s)s", {"s": slot})
    )


_MAY_SUBSCRIBE = """
SELECT pg_catalog.has_database_privilege(current_database(), 'CREATE'),
       coalesce((SELECT pg_catalog.pg_has_role(current_user, oid, 'USAGE') FROM pg_catalog.pg_roles
                  WHERE rolname = 'pg_create_subscription'), false)
"""


def _may_subscribe(inside: psycopg.Connection) -> None:
    """Refuse before CREATE SUBSCRIPTION is sent when the server would log its text, or when it would
    fail (a failing statement is logged with its text under log_min_error_statement's default)."""
    logged = statement_logging(inside)
    if logged:
        raise _refuse(
            OP_MOVE,
            "the target shard would log the subscription's statement, which carries the tenant's password ("
            + ", ".join(logged)
            + ")",
        )
    row = inside.execute(_MAY_SUBSCRIBE).fetchone()
    if row is None or not all(row):
        raise _refuse(OP_MOVE, "the provisioner may not create a subscription in the target database")


def subscribe(source: psycopg.Connection, target: psycopg.Connection, plan: MovePlan) -> None:
    """The slot on the source, the subscription on the target, enabled, and its tables' copy started.

    The subscription is created without connecting (`connect = false`); the slot is made by the
    provisioner (REPLICATION) in the tenant's source database, and `REFRESH PUBLICATION` starts the
    copy of each table, which the stream continues from its own snapshot.
    """
    with target_database(target, plan.name) as inside:
        enabled = _one(inside, _SUBSCRIPTION, {"sub": SUBSCRIPTION})
        if enabled is None:
            _may_subscribe(inside)
    if not _slot_exists(source, plan.slot):
        with tenant_database(source, plan.name) as inside:
            try:
                inside.execute(
                    "SELECT pg_catalog.pg_create_logical_replication_slot(%(s)s, 'pgoutput')", {"s": plan.slot}
                )
            except pgerrors.DuplicateObject:
                pass  # made by an attempt whose answer was lost
    with target_database(target, plan.name) as inside:
        subscription = _ident(SUBSCRIPTION)
        if enabled is None:
            with inside.transaction():
                inside.execute(
                    sql.SQL(
                        "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (connect = false, slot_name = {})"
                    ).format(
                        subscription,
                        sql.Literal(plan.subscription_conninfo()),
                        _ident(PUBLICATION),
                        sql.Literal(plan.slot),
                    )
                )
                record_credentials(inside, plan)
        if not enabled:
            inside.execute(sql.SQL("ALTER SUBSCRIPTION {} ENABLE").format(subscription))
        row = inside.execute(_SUBSCRIBED, {"sub": SUBSCRIPTION}).fetchone()
        if row is None or not row[0]:
            inside.execute(
                sql.SQL("ALTER SUBSCRIPTION {} REFRESH PUBLICATION WITH (copy_data = true)").format(subscription)
            )


def copy_new_tables(source: psycopg.Connection, target: psycopg.Connection, plan: MovePlan, pg_dump: Path) -> int:
    """Tables the tenant created after the schema was copied, carried: their definitions replayed on
    the target, the publication extended, and their copy started; how many were missing on the target.

    The copy of a table added to the publication starts from a snapshot taken after the addition, so
    its rows written before are in the copy and those written after in the stream. A new table that
    needs other new objects (a new schema, a type) fails to replay: the move waits until it is added
    by hand or aborted.
    """
    with tenant_database(source, plan.name) as inside:
        on_source = tenant_tables(inside, plan.name)
    with target_database(target, plan.name) as inside:
        on_target = set(tenant_tables(inside, plan.name))
    missing = [table for table in on_source if table not in on_target]
    if missing:
        _replay(target, plan.name, dump_schema(source, plan, pg_dump, missing))
    publish(source, plan.name, plan.tenant.login)
    with target_database(target, plan.name) as inside:
        subscribed = _one(inside, _SUBSCRIPTION, {"sub": SUBSCRIPTION}) is not None  # else `subscribe` copies all
        row = inside.execute(_SUBSCRIBED, {"sub": SUBSCRIPTION}).fetchone()
        if subscribed and row is not None and row[0] < len(on_source):
            inside.execute(
                sql.SQL("ALTER SUBSCRIPTION {} REFRESH PUBLICATION WITH (copy_data = true)").format(
                    _ident(SUBSCRIPTION)
                )
            )
    return len(missing)


_CREDENTIALS = """
SELECT pg_catalog.obj_description(s.oid, 'pg_subscription') FROM pg_catalog.pg_subscription s
 WHERE s.subname = %(sub)s AND s.subdbid = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
"""


def record_credentials(inside: psycopg.Connection, plan: MovePlan) -> None:
    """The subscription's comment says which credentials its connection carries (`MovePlan.credentials`)."""
    inside.execute(
        sql.SQL("COMMENT ON SUBSCRIPTION {} IS {}").format(_ident(SUBSCRIPTION), sql.Literal(plan.credentials))
    )


def follow_credentials(
    publisher: psycopg.Connection, subscriber: psycopg.Connection, plan: MovePlan, *, always: bool = False
) -> bool:
    """The stream of `plan` (the subscription in the tenant's database on `subscriber`) logs in to
    `publisher` with the credentials handed out now; True when its connection was changed.

    A rotation changes the password of the login role on the publisher (or hands out the other login
    role) while the subscription keeps the credentials it was made with: a running WAL sender goes on,
    but the next login of the stream (after a network failure or a restart) would be refused and the
    subscriber would stop receiving changes. So: REPLICATION for the login role handed out, the
    subscription's connection (and its comment, in the same transaction) set to it when the comment
    names other credentials (or `always`), then REPLICATION taken from the other login role (which a
    rotation retires). The statement carries the password: sent only on a session whose settings log
    no statement text. A subscription that is gone (the stream ended) is left alone.
    """
    with target_database(subscriber, plan.name) as inside:
        if _one(inside, _SUBSCRIPTION, {"sub": SUBSCRIPTION}) is None:
            return False
        changed = always or _one(inside, _CREDENTIALS, {"sub": SUBSCRIPTION}) != plan.credentials
        replication(publisher, plan.tenant.login_role)
        if changed:
            if statement_logging(inside):
                raise _refuse(OP_MOVE, "the shard would log the subscription's statement, which carries a password")
            with inside.transaction():
                inside.execute(
                    sql.SQL("ALTER SUBSCRIPTION {} CONNECTION {}").format(
                        _ident(SUBSCRIPTION), sql.Literal(plan.subscription_conninfo())
                    )
                )
                record_credentials(inside, plan)
    _no_replication(publisher, other_login(plan.name, plan.tenant.login_role))
    return changed


# -- 5. catch-up -------------------------------------------------------------------------------

_LAG = """
SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, active
  FROM pg_catalog.pg_replication_slots WHERE slot_name = %(s)s
"""
_ERRORS = """
SELECT coalesce(sum(apply_error_count + sync_error_count), 0)::bigint FROM pg_catalog.pg_stat_subscription_stats
 WHERE subname = %(sub)s
"""


def progress(source: psycopg.Connection, target: psycopg.Connection, plan: MovePlan) -> MoveProgress:
    """Tables copied on the target, and the WAL of the source the target has not confirmed yet."""
    with target_database(target, plan.name) as inside:
        row = inside.execute(_SUBSCRIBED, {"sub": SUBSCRIPTION}).fetchone()
        failures = _one(inside, _ERRORS, {"sub": SUBSCRIPTION})
    tables, ready = row if row is not None else (0, 0)
    lag, active = source.execute(_LAG, {"s": plan.slot}).fetchone() or (None, False)
    return MoveProgress(int(tables), int(ready), None if lag is None else int(lag), int(failures or 0), bool(active))


def copied_bytes(target: psycopg.Connection, name: str) -> int:
    """The tenant's database on the target so far, in bytes: its files on disk (an offline copy's
    restore counts before it commits). The provisioner may connect to it from `prepare_target` on."""
    return int(_one(target, "SELECT pg_catalog.pg_database_size(%(db)s)", {"db": name}) or 0)


# -- 6. the cutover ----------------------------------------------------------------------------

_OTHER_SESSIONS = """
SELECT pg_catalog.pg_terminate_backend(pid, %(wait)s::bigint) FROM pg_catalog.pg_stat_activity
 WHERE usesysid = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = %(role)s)
   AND backend_type <> 'walsender' AND pid <> pg_catalog.pg_backend_pid()
"""


def fence_source(source: psycopg.Connection, name: str) -> None:
    """No tenant write on the source from now on: CONNECT revoked from the tenant, then every session
    of it and of its alternate login role ended except the WAL sender carrying the stream (a
    session's open transaction is rolled back). The alternate's sessions (handed out, or opened
    before it was retired: retiring leaves them open) act as the tenant; the REVOKE keeps new ones
    out (its CONNECT is the tenant's)."""
    with as_role(source, name):
        source.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(_ident(name), _ident(name)))
    _end_tenant_sessions(source, name)
    state = read_state(source, name)
    if state.alternate_oid is not None:
        _ensure_membership(source, alternate_name(name), state.alternate_oid)
        _end_tenant_sessions(source, alternate_name(name))


def _end_tenant_sessions(source: psycopg.Connection, role: str) -> None:
    """Every session of `role` ended (as `role`) but a WAL sender; a login that passed its CONNECT
    check before the REVOKE may appear once more: ended too."""
    with as_role(source, role):
        for _ in range(3):
            if not source.execute(_OTHER_SESSIONS, {"role": role, "wait": TERMINATE_WAIT_MS}).fetchall():
                break


def reopen_source(source: psycopg.Connection, name: str) -> None:
    """The tenant may connect to its source database again (an abort, or a cutover that timed out)."""
    with as_role(source, name):
        source.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(_ident(name), _ident(name)))


def mark(source: psycopg.Connection, name: str) -> str:
    """A marker row written as the tenant on the (fenced) source; its token."""
    token = secrets.token_hex(16)
    with tenant_database(source, name) as inside, as_role(inside, name):
        inside.execute(
            sql.SQL("INSERT INTO {} (token) VALUES (%(t)s)").format(_ident(MARKER_SCHEMA, MARKER_TABLE)), {"t": token}
        )
    return token


def _wait(check: Callable[[], bool], deadline: float) -> bool:
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL)


def wait_for_marker(target: psycopg.Connection, name: str, token: str, deadline: float) -> bool:
    """Whether the marker row arrived on the target before `deadline` (time.monotonic)."""
    query = sql.SQL("SELECT count(*) FROM {} WHERE token = %(t)s").format(_ident(MARKER_SCHEMA, MARKER_TABLE))
    with target_database(target, name) as inside, as_role(inside, name):
        return _wait(lambda: bool(_one(inside, query, {"t": token})), deadline)


def wait_for_lsn(source: psycopg.Connection, plan: MovePlan, deadline: float) -> bool:
    """Whether the target confirmed the source's WAL up to its current position before `deadline`."""
    lsn = _one(source, "SELECT pg_catalog.pg_current_wal_lsn()::text")
    query = "SELECT confirmed_flush_lsn >= %(lsn)s::pg_lsn FROM pg_catalog.pg_replication_slots WHERE slot_name = %(s)s"
    return _wait(lambda: bool(_one(source, query, {"lsn": lsn, "s": plan.slot})), deadline)


_SEQUENCES = """
SELECT schemaname, sequencename, last_value FROM pg_catalog.pg_sequences
 WHERE sequenceowner = %(tenant)s AND last_value IS NOT NULL ORDER BY 1, 2
"""


def copy_sequences(source: psycopg.Connection, target: psycopg.Connection, name: str) -> int:
    """Every sequence of the tenant that was used on the source gets the same value on the target
    (logical replication does not carry them); how many were set."""
    with tenant_database(source, name) as inside, as_role(inside, name):
        values = inside.execute(_SEQUENCES, {"tenant": name}).fetchall()
    with target_database(target, name) as inside, as_role(inside, name):
        for schema, sequence, value in values:
            qualified = sql.Identifier(schema, sequence).as_string(inside)
            inside.execute("SELECT pg_catalog.setval(%(s)s::regclass, %(v)s, true)", {"s": qualified, "v": value})
    return len(values)


def end_stream(source: psycopg.Connection, target: psycopg.Connection, plan: MovePlan) -> None:
    """The subscription, its slot and the publication dropped; REPLICATION taken back from the tenant.

    The subscription lets go of its slot first (its own drop would log in to the source, which the
    fence may have closed); the provisioner drops the slot once the WAL sender has released it.
    """
    state = read_state(target, plan.name)
    if state.database_exists and state.allow_connections:
        with target_database(target, plan.name) as inside:
            drop_subscription(inside)
    drop_slot(source, plan.slot)
    with tenant_database(source, plan.name) as inside, as_role(inside, plan.name):
        inside.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(_ident(PUBLICATION)))
    no_replication(source, plan.name)


def replication(server: psycopg.Connection, login: str) -> None:
    """REPLICATION for `login`, the role whose login carries a stream."""
    if not _one(server, "SELECT rolreplication FROM pg_catalog.pg_roles WHERE rolname = %(r)s", {"r": login}):
        server.execute(sql.SQL("ALTER ROLE {} REPLICATION").format(_ident(login)))


def no_replication(server: psycopg.Connection, name: str) -> None:
    """REPLICATION taken back from the tenant role and its alternate (whichever the stream logged in as)."""
    for role in (name, alternate_name(name)):
        _no_replication(server, role)


def _no_replication(server: psycopg.Connection, role: str) -> None:
    if _one(server, "SELECT rolreplication FROM pg_catalog.pg_roles WHERE rolname = %(r)s", {"r": role}):
        server.execute(sql.SQL("ALTER ROLE {} NOREPLICATION").format(_ident(role)))


def drop_subscription(inside: psycopg.Connection) -> None:
    """The move's subscription in this database dropped without logging in to its publisher (which a
    fence may have closed): disabled, its slot let go (the provisioner drops that), dropped."""
    subscription = _ident(SUBSCRIPTION)
    enabled = _one(inside, _SUBSCRIPTION, {"sub": SUBSCRIPTION})
    if enabled is None:
        return
    if enabled:
        inside.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(subscription))
    inside.execute(sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(subscription))
    inside.execute(sql.SQL("DROP SUBSCRIPTION {}").format(subscription))


def drop_slot(server: psycopg.Connection, slot: str) -> None:
    """The replication slot dropped by the provisioner, once the WAL sender has released it."""
    released = "SELECT NOT active FROM pg_catalog.pg_replication_slots WHERE slot_name = %(s)s"
    if _slot_exists(server, slot):
        _wait(lambda: _one(server, released, {"s": slot}) is not False, time.monotonic() + SLOT_RELEASE_WAIT)
        server.execute(
            "SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots"
            " WHERE slot_name = %(s)s",
            {"s": slot},
        )


def _drop_marker(inside: psycopg.Connection, name: str) -> None:
    with as_role(inside, name):
        inside.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(_ident(MARKER_SCHEMA)))


def open_target(target: psycopg.Connection, tenant: TenantSpec, *, keep_marker: bool = False) -> None:
    """The marker dropped (kept when a reverse stream publishes it for a rollback), the password set
    again on the login role handed out (the one the consumer holds now, should it have changed
    during the move; the other login role without login and password),
    CONNECT for the tenant (and the pooler's auth user) on the target, and the provisioner's own
    CONNECT and CREATE taken back."""
    name = tenant.name
    state = read_state(target, name)
    if state.tenant_can_connect:
        return
    with target_database(target, name) as inside:
        if not keep_marker:
            _drop_marker(inside, name)
        _schema_usage(inside, name, "REVOKE {} ON SCHEMA {} FROM {}")
    database = _ident(name)
    hand_out_on(target, name, tenant.login_role, tenant.password, tenant.connection_limit, retire_other=True)
    with as_role(target, name):
        target.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, database))
        if tenant.pooler is not None:
            target.execute(
                sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, _ident(tenant.pooler.auth_user))
            )
        target.execute(
            sql.SQL("REVOKE CONNECT, CREATE ON DATABASE {} FROM {}").format(database, _ident(target.info.user))
        )


def _streaming(target: psycopg.Connection, name: str) -> bool:
    state = read_state(target, name)
    if not (state.database_exists and state.allow_connections):
        return False
    with target_database(target, name) as inside:
        return _one(inside, _SUBSCRIPTION, {"sub": SUBSCRIPTION}) is not None


class ReverseStream(Protocol):
    """The stream back to the source that a cutover sets up for a rollback (reconciler.sql.move_rollback)."""

    def check(self) -> None:
        """Before the fence: refuse (SqlFailure) what would make `prepare` fail."""
        ...

    def prepare(self, deadline: float) -> bool:
        """Inside the fence, before the forward stream ends: its publication, slot and subscription;
        False when it could not be made before `deadline` (time.monotonic)."""
        ...

    def open(self) -> None:
        """The target opened to the tenant with the stream started (instead of `open_target`)."""
        ...


def cutover(
    source: psycopg.Connection,
    target: psycopg.Connection,
    plan: MovePlan,
    budget: float = 30.0,
    reverse: ReverseStream | None = None,
) -> float:
    """Fence the source, bring the last changes and the sequences over, open the target; the write
    pause in seconds. With `reverse`, the stream back to the source is made inside the fence and
    started as the target opens (the source stays current for a rollback).

    Refused before the fence when the tenant made tables the publication lacks. When the marker (or
    the source's current WAL position) has not reached the target within `budget` seconds, the
    source is opened again and `CutoverTimedOut` raised; the stream goes on. Run again after an
    interruption it finishes what is left (once the stream is ended, only opening the target is).
    """
    if read_state(target, plan.name).tenant_can_connect:
        if reverse is not None:
            reverse.open()  # an opening interrupted before the stream back was started
        return 0.0
    streaming = _streaming(target, plan.name)
    if streaming:
        missing = unpublished_tables(source, plan.name)
        if missing:
            raise _refuse(OP_CUTOVER, f"{len(missing)} table(s) were created after the schema was copied")
    if reverse is not None:
        reverse.check()
    started = time.monotonic()
    fence_source(source, plan.name)
    deadline = started + budget
    if streaming:
        token = mark(source, plan.name)
        if not (wait_for_marker(target, plan.name, token, deadline) and wait_for_lsn(source, plan, deadline)):
            reopen_source(source, plan.name)
            raise CutoverTimedOut()
        copy_sequences(source, target, plan.name)
    if reverse is not None:
        try:
            prepared = reverse.prepare(deadline)
        except (SqlFailure, psycopg.Error):  # e.g. no free slot on the target: the source serves meanwhile
            with contextlib.suppress(psycopg.Error):
                reopen_source(source, plan.name)
            raise
        if not prepared:
            reopen_source(source, plan.name)
            raise CutoverTimedOut()
    if streaming:
        end_stream(source, target, plan)
    if reverse is not None:
        reverse.open()
    else:
        open_target(target, plan.tenant)
    return time.monotonic() - started


# -- 7. abort ----------------------------------------------------------------------------------


def abort(source: psycopg.Connection, target: psycopg.Connection, plan: MovePlan) -> None:
    """Before the cutover: the source serves again as it was (no publication, slot, marker or
    REPLICATION left), and the tenant's role and database on the target are dropped. Refused once
    the target has been opened to the tenant."""
    target_state = read_state(target, plan.name)
    if target_state.tenant_can_connect:
        raise _refuse(OP_ABORT, "the target already serves the database")
    if not read_state(source, plan.name).tenant_can_connect:
        reopen_source(source, plan.name)
    end_stream(source, target, plan)
    may_create = "SELECT pg_catalog.has_database_privilege(current_user, %(db)s, 'CREATE')"
    reverse = bool(_one(source, may_create, {"db": plan.name}))  # given for a stream back by a cutover
    with tenant_database(source, plan.name) as inside:
        drop_subscription(inside)  # a stream back, made by a cutover that timed out
        _drop_marker(inside, plan.name)
        if reverse:
            _schema_usage(inside, plan.name, "REVOKE {} ON SCHEMA {} FROM {}")
    drop_slot(target, plan.slot)
    if reverse:  # the provisioner's access for that stream, too
        with as_role(source, plan.name):
            source.execute(
                sql.SQL("REVOKE CONNECT, CREATE ON DATABASE {} FROM {}").format(
                    _ident(plan.name), _ident(source.info.user)
                )
            )
    owner = plan.tenant.owner
    if target_state.role_exists and (owner is None or target_state.owner == owner):
        drop_tenant(target, plan.name)
