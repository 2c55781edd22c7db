"""Dropping a tenant role whatever other tenants granted to it.

Every role may grant privileges on what it owns to any other role, and PostgreSQL records each grant
as a dependency of the grantee: `DROP ROLE t` fails (dependent_objects) while one exists in any
database of the server. `DROP OWNED BY t`, run as t, removes only what t owns and what t granted,
never a grant another role made to t. So tenant A could keep tenant B's role alive for ever by
granting B's role something in A's own database (CONNECT on the database, USAGE on a schema, SELECT
on a table or a column, EXECUTE on a function, USAGE on a type or sequence, a large object, default
privileges) or by naming it in a row-level security policy. Tenants cannot grant role membership
(they hold no ADMIN on their own role, on 15, 16 and 18), and cannot give B's role ownership of
anything; B's role can own objects in A's database only if A let it create them there.

`drop_role(conn, t)` removes all of that without A's cooperation, as the role that granted it (the
provisioner may SET ROLE to every tenant role it created, and to no other role; for what A gave
`pg_database_owner`, as A, who holds its privileges in A's database):

1. in every other database whose catalog still references t (`pg_shdepend`): enter it (its owner
   lets the provisioner in for the time it takes, see `_entered`; what the owner set for sessions in
   its database is overridden, `session.connect_database`), then, in one transaction per database,
   as each grantor
   `REVOKE ALL ON {SCHEMA|TABLE|SEQUENCE|ROUTINE|TYPE|DOMAIN|LARGE OBJECT} ... FROM t CASCADE`
   (a table's REVOKE also removes its column grants; CASCADE removes what t granted on with a grant
   option), as the role whose defaults they are `ALTER DEFAULT PRIVILEGES FOR ROLE r [IN SCHEMA s]
   REVOKE ALL ON ... FROM t`, as a table's owner t is taken out of its policies (`ALTER POLICY ...
   TO` the remaining roles, or `DROP POLICY` when t was its only role, as PostgreSQL's own DROP OWNED
   does), and last as t `DROP OWNED BY t CASCADE` (what t created there, and what the other tenant
   built on it);
2. in the last of those transactions: database-level grants (a shared catalog), as each grantor
   `REVOKE ALL ON DATABASE d FROM t CASCADE`, then `DROP ROLE t`.

A statement that names `s.x` needs USAGE on schema `s`, which its owner may have taken away from
anyone, itself included: the schema's owner lends it for the statement and takes it back in the same
transaction (`_usage_lent`). Nothing else of the other tenant changes: its objects, data, settings and
grants to anyone else stay. A tenant that keeps a lock on its catalog rows (an open transaction),
grants again or drops what it granted in between is handled like a tenant blocking its own drop:
the sequence is tried again (`SESSION_RETRIES`), and right before its changes the sessions of the
tenants found granting are ended, so a tenant granting in a loop would have to log in again within
that transaction's few milliseconds (a loop
granting as fast as it can no longer wins).
Whatever else stops it is reported as retryable, with what was in the way and no names. A grant
that a role the provider did not create made (an operator's role, a superuser's object in
`template1`) cannot be removed: the drop then fails with dependent_objects and says how many such
references remain, without names.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql

from domain.settings import SETTINGS
from reconciler.sql import errors
from reconciler.sql.errors import SqlFailure
from reconciler.sql.roles import as_role, end_sessions, may_set_role
from reconciler.sql.session import connect_database

SESSION_RETRIES = SETTINGS.sql.blocked_attempts
OP_DROP = "drop"

# Roles acted as during one drop (name -> oid): whose sessions are ended when they block a retry.
Involved = dict[str, int]


class _NotEntered(Exception):
    """A database could not be entered although its owner had just let the provisioner in."""


def _ident(*names: str) -> sql.Identifier:
    return sql.Identifier(*names)


def _grants_to_role(*selects: tuple[str, str]) -> str:
    """The UNION of `selects` (a SELECT over a catalog, the name of its ACL column), each narrowed to the
    grants another role made to %(role)s, the grantor joined as `g`: one spelling of that join."""
    return "\n" + "UNION\n".join(
        objects
        + f" CROSS JOIN LATERAL pg_catalog.aclexplode({acl}) a\n"
        + "  JOIN pg_catalog.pg_roles g ON g.oid = a.grantor\n"
        + " WHERE a.grantee = %(role)s AND a.grantor <> %(role)s\n"
        for objects, acl in selects
    )


# -- 1. database-level grants --------------------------------------------------------------------

_DATABASE_GRANTS = _grants_to_role(
    (
        """SELECT DISTINCT d.datname, g.rolname, g.oid
  FROM pg_catalog.pg_database d
""",
        "d.datacl",
    ),
)


def _revoke_database_grants(conn: psycopg.Connection, victim: str, oid: int, involved: Involved) -> None:
    for datname, grantor, grantor_oid in conn.execute(_DATABASE_GRANTS, {"role": oid}).fetchall():
        if _act_as(conn, grantor, grantor_oid, involved):
            with as_role(conn, grantor):
                conn.execute(
                    sql.SQL("REVOKE ALL ON DATABASE {} FROM {} CASCADE").format(_ident(datname), _ident(victim))
                )


# -- 2. grants and objects inside other databases ----------------------------------------------

# Each row: kind, schema name (None: not in a schema), name, the acting grantor's name and OID, and the
# schemas the statement names (the grantor needs USAGE on them to look the object up).
_OBJECT_GRANTS = _grants_to_role(
    (
        """SELECT 'SCHEMA', NULL, n.nspname, g.rolname, g.oid, ARRAY[]::oid[]
  FROM pg_catalog.pg_namespace n
""",
        "n.nspacl",
    ),
    (
        """SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, n.nspname, c.relname, g.rolname, g.oid,
       ARRAY[n.oid]
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
""",
        "c.relacl",
    ),
    (
        """SELECT 'TABLE', n.nspname, c.relname, g.rolname, g.oid, ARRAY[n.oid]
  FROM pg_catalog.pg_attribute t
  JOIN pg_catalog.pg_class c ON c.oid = t.attrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
""",
        "t.attacl",
    ),
    (
        """SELECT CASE t.typtype WHEN 'd' THEN 'DOMAIN' ELSE 'TYPE' END, n.nspname, t.typname, g.rolname, g.oid,
       ARRAY[n.oid]
  FROM pg_catalog.pg_type t
  JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
""",
        "t.typacl",
    ),
    (
        """SELECT 'LARGE OBJECT', NULL, l.oid::text, g.rolname, g.oid, ARRAY[]::oid[]
  FROM pg_catalog.pg_largeobject_metadata l
""",
        "l.lomacl",
    ),
)

# Routines are named with their argument types (schema-qualified type names: `pg_catalog._int4` is int4[]),
# so the statement names the routine's schema and those of its argument types.
_ROUTINE_GRANTS = _grants_to_role(
    (
        """SELECT DISTINCT n.nspname, p.proname, g.rolname, g.oid,
       ARRAY(SELECT tn.nspname FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS u(typ, i)
               JOIN pg_catalog.pg_type ty ON ty.oid = u.typ
               JOIN pg_catalog.pg_namespace tn ON tn.oid = ty.typnamespace ORDER BY u.i),
       ARRAY(SELECT ty.typname FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS u(typ, i)
               JOIN pg_catalog.pg_type ty ON ty.oid = u.typ ORDER BY u.i),
       n.oid || ARRAY(SELECT ty.typnamespace FROM unnest(p.proargtypes::oid[]) AS u(typ)
                        JOIN pg_catalog.pg_type ty ON ty.oid = u.typ)
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
""",
        "p.proacl",
    ),
)

_DEFAULT_PRIVILEGES = """
SELECT DISTINCT r.rolname, r.oid, n.nspname, d.defaclobjtype
  FROM pg_catalog.pg_default_acl d
  JOIN pg_catalog.pg_roles r ON r.oid = d.defaclrole
  LEFT JOIN pg_catalog.pg_namespace n ON n.oid = d.defaclnamespace
 CROSS JOIN LATERAL pg_catalog.aclexplode(d.defaclacl) a
 WHERE a.grantee = %(role)s AND d.defaclrole <> %(role)s
"""
# pg_default_acl.defaclobjtype -> the object kind of ALTER DEFAULT PRIVILEGES (L: 18 and later)
_DEFAULT_KINDS = {
    "r": sql.SQL("TABLES"),
    "S": sql.SQL("SEQUENCES"),
    "f": sql.SQL("FUNCTIONS"),
    "T": sql.SQL("TYPES"),
    "n": sql.SQL("SCHEMAS"),
    "L": sql.SQL("LARGE OBJECTS"),
}

_POLICIES = """
SELECT p.polname, n.nspname, c.relname, o.rolname, o.oid,
       ARRAY(SELECT r.rolname FROM unnest(p.polroles) AS x(role)
               JOIN pg_catalog.pg_roles r ON r.oid = x.role WHERE x.role <> %(role)s ORDER BY r.rolname),
       0::oid = ANY (p.polroles), n.oid
  FROM pg_catalog.pg_policy p
  JOIN pg_catalog.pg_class c ON c.oid = p.polrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_catalog.pg_roles o ON o.oid = c.relowner
 WHERE %(role)s = ANY (p.polroles)
"""


_DATABASE_OWNER = """
SELECT o.rolname, o.oid FROM pg_catalog.pg_database d JOIN pg_catalog.pg_roles o ON o.oid = d.datdba
 WHERE d.datname = pg_catalog.current_database()
"""


def _acting_for(conn: psycopg.Connection, role: str, role_oid: int) -> tuple[str, int]:
    """The role that acts for `role`: itself, or for `pg_database_owner` (a database's owner may give it
    objects and default privileges) the database's owner, who holds its privileges there."""
    if role != "pg_database_owner":
        return role, role_oid
    row = conn.execute(_DATABASE_OWNER).fetchone()
    return (str(row[0]), int(row[1])) if row is not None else (role, role_oid)


def _act_as(conn: psycopg.Connection, role: str, role_oid: int, involved: Involved) -> bool:
    """Whether the provider may act as `role` (a tenant it created); remembers it for a retry.

    Never the provisioner itself: ending its sessions would end the provider's own.
    """
    if role == conn.info.user or not may_set_role(conn, role_oid):
        return False
    involved[role] = role_oid
    return True


_WITHOUT_USAGE = """
SELECT n.nspname, o.rolname, o.oid
  FROM pg_catalog.pg_namespace n
  JOIN pg_catalog.pg_roles o ON o.oid = n.nspowner
 WHERE n.oid = ANY (%(schemas)s::oid[]) AND NOT pg_catalog.has_schema_privilege(%(actor)s::oid, n.oid, 'USAGE')
"""


@contextmanager
def _usage_lent(
    conn: psycopg.Connection, actor: str, actor_oid: int, schemas: list[int], involved: Involved
) -> Iterator[None]:
    """USAGE on `schemas` for `actor` while the block runs, where a schema's owner took it away.

    A statement that names `s.t` needs USAGE on `s` just to look `t` up, and the owner of `s` may
    revoke it from anyone, itself included (owners always keep the right to grant it again). So the
    role acting for the owner lends it, and takes it back after the block, in the same transaction:
    the schema's privileges end as they were. A schema whose owner the provider may not act as stays
    as it is (the statement then fails, and the drop is retried).
    """
    lent: list[tuple[str, str]] = []
    if schemas:
        found = conn.execute(_WITHOUT_USAGE, {"schemas": schemas, "actor": actor_oid}).fetchall()
        for schema, schema_owner, schema_owner_oid in found:
            owner, owner_oid = _acting_for(conn, schema_owner, schema_owner_oid)
            if _act_as(conn, owner, owner_oid, involved):
                with as_role(conn, owner):
                    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(_ident(schema), _ident(actor)))
                lent.append((schema, owner))
    yield
    for schema, owner in lent:
        with as_role(conn, owner):
            conn.execute(sql.SQL("REVOKE USAGE ON SCHEMA {} FROM {}").format(_ident(schema), _ident(actor)))


def _as_grantor(
    conn: psycopg.Connection,
    grantor: str,
    grantor_oid: int,
    schemas: list[int],
    statement: sql.Composed,
    involved: Involved,
) -> None:
    """Run `statement` as (the role acting for) the grantor, if the provider may act as it, with USAGE on
    the schemas it names."""
    grantor, grantor_oid = _acting_for(conn, grantor, grantor_oid)
    if not _act_as(conn, grantor, grantor_oid, involved):
        return
    with _usage_lent(conn, grantor, grantor_oid, schemas, involved), as_role(conn, grantor):
        conn.execute(statement)


# The object kinds _OBJECT_GRANTS names, as keywords of REVOKE ... ON <kind>.
_KINDS = {kind: sql.SQL(kind) for kind in ("SCHEMA", "TABLE", "SEQUENCE", "TYPE", "DOMAIN", "LARGE OBJECT")}


def _revoke_object_grants(conn: psycopg.Connection, victim: str, oid: int, involved: Involved) -> None:
    for kind, schema, name, grantor, grantor_oid, schemas in conn.execute(_OBJECT_GRANTS, {"role": oid}).fetchall():
        if kind == "LARGE OBJECT":
            target: sql.Composable = sql.Literal(int(name))
        elif schema is None:
            target = _ident(name)
        else:
            target = _ident(schema, name)
        statement = sql.SQL("REVOKE ALL ON {} {} FROM {} CASCADE").format(_KINDS[kind], target, _ident(victim))
        _as_grantor(conn, grantor, grantor_oid, schemas, statement, involved)
    for schema, name, grantor, grantor_oid, arg_schemas, arg_types, schemas in conn.execute(
        _ROUTINE_GRANTS, {"role": oid}
    ).fetchall():
        args = sql.SQL(", ").join(_ident(s, t) for s, t in zip(arg_schemas, arg_types, strict=True))
        statement = sql.SQL("REVOKE ALL ON ROUTINE {}({}) FROM {} CASCADE").format(
            _ident(schema, name), args, _ident(victim)
        )
        _as_grantor(conn, grantor, grantor_oid, schemas, statement, involved)


def _revoke_default_privileges(conn: psycopg.Connection, victim: str, oid: int, involved: Involved) -> None:
    """As (the role acting for) the defaults' owner, FOR ROLE that owner (IN SCHEMA needs no USAGE)."""
    for owner, owner_oid, schema, objtype in conn.execute(_DEFAULT_PRIVILEGES, {"role": oid}).fetchall():
        kind = _DEFAULT_KINDS.get(objtype)
        if kind is None:
            continue
        scope = sql.SQL("IN SCHEMA {} ").format(_ident(schema)) if schema is not None else sql.SQL("")
        statement = sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} {}REVOKE ALL ON {} FROM {} CASCADE").format(
            _ident(owner), scope, kind, _ident(victim)
        )
        _as_grantor(conn, owner, owner_oid, [], statement, involved)


def _leave_policies(conn: psycopg.Connection, oid: int, involved: Involved) -> None:
    for policy, schema, table, owner, owner_oid, others, public, schema_oid in conn.execute(
        _POLICIES, {"role": oid}
    ).fetchall():
        roles = [_ident(role) for role in others] + ([sql.SQL("PUBLIC")] if public else [])
        if roles:
            statement = sql.SQL("ALTER POLICY {} ON {} TO {}").format(
                _ident(policy), _ident(schema, table), sql.SQL(", ").join(roles)
            )
        else:
            statement = sql.SQL("DROP POLICY {} ON {}").format(_ident(policy), _ident(schema, table))
        _as_grantor(conn, owner, owner_oid, [schema_oid], statement, involved)


def _release_in_database(conn: psycopg.Connection, victim: str, oid: int, involved: Involved) -> None:
    """Everything that references the victim in the database `conn` is in (see the module docstring)."""
    _revoke_object_grants(conn, victim, oid, involved)
    _revoke_default_privileges(conn, victim, oid, involved)
    _leave_policies(conn, oid, involved)
    with as_role(conn, victim):
        conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(_ident(victim)))


# -- entering another tenant's database ----------------------------------------------------------


@dataclass(frozen=True)
class _Database:
    """A database as the provisioner's admin session sees it, with what it takes to enter it."""

    name: str
    owner: str
    owner_oid: int
    allow_connections: bool
    connection_limit: int
    may_connect: bool  # the provisioner holds CONNECT (itself, or through PUBLIC)

    def letting_in(self, me: str) -> list[tuple[sql.Composed, sql.Composed]]:
        """(statement, its undo) the owner runs so that the provisioner can open a session here."""
        target = _ident(self.name)
        changes: list[tuple[sql.Composed, sql.Composed]] = []
        if not self.may_connect:
            changes.append(
                (
                    sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(target, _ident(me)),
                    sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(target, _ident(me)),
                )
            )
        if not self.allow_connections:
            changes.append(
                (
                    sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(target),
                    sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(target),
                )
            )
        if self.connection_limit >= 0:
            limit = sql.Literal(self.connection_limit)
            changes.append(
                (
                    sql.SQL("ALTER DATABASE {} CONNECTION LIMIT -1").format(target),
                    sql.SQL("ALTER DATABASE {} CONNECTION LIMIT {}").format(target, limit),
                )
            )
        return changes


_DATABASE = """
SELECT d.datname, o.rolname, o.oid, d.datallowconn, d.datconnlimit,
       pg_catalog.has_database_privilege(session_user, d.oid, 'CONNECT')
  FROM pg_catalog.pg_database d
  JOIN pg_catalog.pg_roles o ON o.oid = d.datdba
 WHERE d.datname = %(name)s
"""
_REFERENCING_DATABASES = """
SELECT d.datname
  FROM pg_catalog.pg_database d
 WHERE d.oid IN (SELECT s.dbid FROM pg_catalog.pg_shdepend s
                  WHERE s.refclassid = 'pg_catalog.pg_authid'::regclass AND s.refobjid = %(role)s)
 ORDER BY d.datname
"""


@contextmanager
def _entry_lock(conn: psycopg.Connection, datname: str) -> Iterator[None]:
    """One drop at a time lets itself into a database (session-level advisory lock on the admin session)."""
    key = {"key": f"dbprovider enter {datname}"}
    conn.execute("SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtextextended(%(key)s, 0))", key)
    try:
        yield
    finally:
        if not conn.broken and not conn.closed:
            conn.execute("SELECT pg_catalog.pg_advisory_unlock(pg_catalog.hashtextextended(%(key)s, 0))", key)


@contextmanager
def _entered(conn: psycopg.Connection, datname: str, involved: Involved) -> Iterator[psycopg.Connection | None]:
    """A session in another database (None: not a tenant's, not entered), let in by its owner.

    The provisioner has no CONNECT on a tenant's database, and the tenant may have closed it
    (ALLOW_CONNECTIONS false: a disabled tenant) or limited its connections. As the owner, and only
    while the session is being opened: GRANT CONNECT to the provisioner, ALLOW_CONNECTIONS true,
    CONNECTION LIMIT -1, each undone right after (they are checked at login only). Drops letting
    themselves into one database take turns (`_entry_lock`).
    """
    me = conn.info.user
    with _entry_lock(conn, datname):
        row = conn.execute(_DATABASE, {"name": datname}).fetchone()
        if row is None:
            inside = None  # dropped meanwhile: nothing left in it
        else:
            database = _Database(*row)
            changes = database.letting_in(me)
            if changes and not _act_as(conn, database.owner, database.owner_oid, involved):
                inside = None  # not a tenant's database: what references the victim there stays
            else:
                inside = _open_with(conn, database, changes)
    if inside is None:
        yield None
        return
    with inside:
        yield inside


def _open_with(
    conn: psycopg.Connection, database: _Database, changes: list[tuple[sql.Composed, sql.Composed]]
) -> psycopg.Connection:
    try:
        if changes:
            with as_role(conn, database.owner):
                for let_in, _ in changes:
                    conn.execute(let_in)
        try:
            return connect_database(conn, database.name)
        except psycopg.OperationalError:
            raise _NotEntered() from None
    finally:
        if changes and not conn.broken and not conn.closed:
            with as_role(conn, database.owner):
                for _, undo in reversed(changes):
                    conn.execute(undo)


_LEFT_IN = """
SELECT d.datname, o.rolname, o.oid
  FROM pg_catalog.pg_database d
  JOIN pg_catalog.pg_roles o ON o.oid = d.datdba
 CROSS JOIN LATERAL pg_catalog.aclexplode(d.datacl) a
 WHERE a.grantee = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = session_user)
   AND a.grantor = d.datdba AND d.datname <> pg_catalog.current_database()
"""


def _revoke_left_connect(conn: psycopg.Connection, involved: Involved) -> None:
    """CONNECT a tenant's database still grants the provisioner (an interrupted drop left it): revoke."""
    me = conn.info.user
    for datname, owner, owner_oid in conn.execute(_LEFT_IN).fetchall():
        if not _act_as(conn, owner, owner_oid, involved):
            continue
        with _entry_lock(conn, datname), as_role(conn, owner):
            conn.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(_ident(datname), _ident(me)))


# -- the drop ----------------------------------------------------------------------------------------


def _sessions(stack: ExitStack, conn: psycopg.Connection, oid: int, involved: Involved) -> list[psycopg.Connection]:
    """A session in every database that references the victim (the admin session for its own), entered
    before anything changes there, so the changes themselves run back to back."""
    sessions: list[psycopg.Connection] = []
    for (datname,) in conn.execute(_REFERENCING_DATABASES, {"role": oid}).fetchall():
        if datname == conn.info.dbname:
            sessions.append(conn)
            continue
        inside = stack.enter_context(_entered(conn, datname, involved))
        if inside is not None:
            sessions.append(inside)
    return sessions


def _attempt(conn: psycopg.Connection, victim: str, oid: int, involved: Involved, end_theirs: bool) -> None:
    """One try: enter the databases, end the sessions of the tenants found granting last time
    (`end_theirs`), then clean each database in a transaction of its own, the last one together
    with the database-level grants and `DROP ROLE` (a grant made meanwhile fails that transaction)."""
    _revoke_left_connect(conn, involved)
    with ExitStack() as stack:
        sessions = _sessions(stack, conn, oid, involved)
        if end_theirs:
            # Right before the changes: a tenant granting in a loop must log in again first, which
            # takes longer than the transaction below.
            for role, role_oid in involved.items():
                end_sessions(conn, role, role_oid)
        last = sessions[-1] if sessions else conn
        for session in sessions[:-1]:
            with session.transaction():
                _release_in_database(session, victim, oid, involved)
        with last.transaction():
            if sessions:
                _release_in_database(last, victim, oid, involved)
            _revoke_database_grants(last, victim, oid, involved)
            last.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(_ident(victim)))


_REMAINING = """
SELECT count(*), count(DISTINCT s.dbid)
  FROM pg_catalog.pg_shdepend s
 WHERE s.refclassid = 'pg_catalog.pg_authid'::regclass AND s.refobjid = %(role)s
"""


def _still_referenced(conn: psycopg.Connection, oid: int) -> SqlFailure:
    row = conn.execute(_REMAINING, {"role": oid}).fetchone()
    references, databases = row if row is not None else (0, 0)
    return SqlFailure(
        OP_DROP,
        errors.DEPENDENT_OBJECTS,
        detail=f"{references} grant(s) or object(s) in {databases} database(s) still reference the tenant role: "
        "made by a role the provider did not create, in a database it cannot enter, or made again meanwhile",
    )


# Failures a tenant may cause in its own database or with its grants, by class: what the condition
# message says was in the way (the drop is retried; no name of the other tenant is given).
_OBSTACLES = {
    errors.INSUFFICIENT_PRIVILEGE: "a privilege the cleanup needs was denied",
    errors.LOCK_TIMEOUT: "a lock held in another tenant's database outlasted every attempt",
    errors.OBJECT_IN_USE: "another tenant's database was in use",
    errors.TIMEOUT: "a statement ran out of time",
    errors.READ_ONLY: "a session was read-only",
    errors.CONNECTION_LOST: "a session was ended",
    errors.NOT_FOUND: "another tenant's objects changed while they were cleaned up",
    errors.CONFLICT: "another tenant changed its grants meanwhile",
}
# Failures another try may cure at once: a lock (the holder's sessions are ended first), objects that
# another tenant dropped or made between the catalog read and the statement.
_TRY_AGAIN = (
    pgerrors.LockNotAvailable,
    pgerrors.ObjectInUse,
    pgerrors.UndefinedObject,
    pgerrors.UndefinedTable,
    pgerrors.UndefinedFunction,
    pgerrors.InvalidSchemaName,
    pgerrors.DuplicateObject,
)


def _blocked(exc: psycopg.Error) -> SqlFailure:
    """A failure of the cleanup of other tenants' grants: retried, and saying what was in the way."""
    failure = errors.classify(exc, OP_DROP)
    obstacle = _OBSTACLES.get(failure.error_class, "an unexpected error")
    return SqlFailure(
        OP_DROP,
        failure.error_class,
        retryable=True,
        sqlstate=failure.sqlstate,
        detail=f"what other tenants granted to the tenant role could not be removed yet: {obstacle}; retried",
    )


def drop_role(conn: psycopg.Connection, victim: str, oid: int) -> None:
    """Remove what other roles granted to the tenant role, then `DROP ROLE` it (see the module docstring).

    Tried `SESSION_RETRIES` times: a tenant whose open transaction locks what must change, or that
    grants again (or drops what it granted) in between, gets its sessions ended right before the
    next try's changes. Fails with a `SqlFailure` after the last: `dependent_objects` (final) when a
    role the provider did not create granted something; anything else another tenant may cause is
    retryable and names the obstacle.
    """
    involved: Involved = {}
    for attempt in range(SESSION_RETRIES):
        last = attempt + 1 >= SESSION_RETRIES
        try:
            _attempt(conn, victim, oid, involved, end_theirs=attempt > 0)
            return
        except pgerrors.DependentObjectsStillExist:
            if last:
                raise _still_referenced(conn, oid) from None
        except _TRY_AGAIN as exc:
            if last:
                raise _blocked(exc) from None
        except _NotEntered:
            if last:
                raise SqlFailure(
                    OP_DROP, errors.CONFLICT, detail="another tenant's database refused the provider's session"
                ) from None
        except psycopg.Error as exc:
            raise _blocked(exc) from None
