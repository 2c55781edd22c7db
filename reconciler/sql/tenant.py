"""The SQL of one tenant on a shard: a LOGIN role and a database of the same name that only it reaches.

Plain functions over (admin connection or `AdminSession`, desired state). Every public operation is
bounded by `timeout` (default `OPERATION_TIMEOUT`), retried on a new session after a connection
loss when given an `AdminSession`, reads the catalog before each change (so re-running it after a
crash at any point converges), and fails only with a sanitized `SqlFailure`.

Provisioning (`PROVISIONING_STEPS`, run by `ensure_tenant`), each step skipped when the catalog
shows it done:

1. role:       CREATE ROLE t LOGIN PASSWORD '<SCRAM verifier>' CONNECTION LIMIT n
               COMMENT ON ROLE t IS '<ownership record>'   (same transaction)
2. membership: GRANT t TO CURRENT_USER WITH SET TRUE, INHERIT FALSE   (16+)
               GRANT t TO CURRENT_USER                                 (before 16, NOINHERIT provisioner)
3. database:   CREATE DATABASE t OWNER t TEMPLATE template0 ALLOW_CONNECTIONS false
4. open:       SET ROLE t; REVOKE ALL ON DATABASE t FROM PUBLIC; GRANT CONNECT ON DATABASE t TO t;
               [GRANT CONNECT ON DATABASE t TO <pooler>;] ALTER DATABASE t ALLOW_CONNECTIONS true; RESET ROLE

Passwords are sent only as SCRAM-SHA-256 verifiers computed here, so no statement (not even with
log_statement=all) carries a plaintext password.

The database is copied from `template0`: nobody can connect to it, so a tenant's session on
`template1` cannot make CREATE DATABASE fail, and nothing a tenant planted in `template1` reaches
another tenant's database. A shard behind pgBouncer whose `auth_query` runs in each database
(`TenantSpec.pooler`) copies from the template its administrators name instead (Percona keeps the
auth function in `template1`, which a prepared shard closes to PUBLIC), and grants the pooler's
`auth_user` CONNECT as it opens the database.

A tenant cannot block its own disable or drop: every statement a tenant session could hold up
(a lock on its role or database row, a session in its database) runs after the tenant's sessions
are ended, and is tried again (ending sessions again) when it meets `lock_timeout` or
`object_in_use` (`SESSION_RETRIES`).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql
from psycopg.rows import dict_row

from domain.naming import PG_IDENTIFIER_MAX_BYTES, PG_IDENTIFIER_RE, alternate_name
from domain.settings import SETTINGS
from reconciler.sql import errors
from reconciler.sql.errors import SqlFailure
from reconciler.sql.foreign_grants import drop_role
from reconciler.sql.provisioner import SET_OPTION_MAJOR
from reconciler.sql.roles import as_role as _as_role
from reconciler.sql.roles import end_sessions as _end_sessions
from reconciler.sql.roles import has_sessions as _has_sessions
from reconciler.sql.scram_keys import DEFAULT_ITERATIONS, ScramKeys
from reconciler.sql.session import OPERATION_TIMEOUT, Admin, run_operation
from reconciler.sql.tenant_login import remember_login

SCRAM_ITERATIONS = DEFAULT_ITERATIONS  # PostgreSQL's default scram_iterations
# Disable and drop: attempts of the whole close sequence when a tenant session blocks it (each
# ends the tenant's sessions first); each attempt waits at most the session's lock_timeout.
SESSION_RETRIES = SETTINGS.sql.blocked_attempts
TEMPLATE_DATABASE = "template0"

# Operation names, as they appear in "<operation> failed: <class>".
OP_CREATE = "create"
OP_SET_LIMIT = "set limit"
OP_ROTATE = "rotate"
OP_DISABLE = "disable"
OP_ENABLE = "enable"
OP_DROP = "drop"
OP_INSPECT = "inspect"
OP_RESTORE = "restore"
OP_OWNERSHIP = "ownership"


# -- desired and observed state ----------------------------------------------------------------


def validate_tenant_name(name: object) -> str:
    """A tenant name as `domain.naming.tenant_name` makes them: a plain lowercase identifier."""
    if (
        not isinstance(name, str)
        or re.fullmatch(PG_IDENTIFIER_RE, name) is None
        or len(name.encode()) > PG_IDENTIFIER_MAX_BYTES
        or name.startswith("pg_")
    ):
        raise ValueError("tenant name must be a lowercase identifier of at most 63 bytes, not pg_-prefixed")
    return name


def validate_password(password: object) -> str:
    """Printable ASCII, so PostgreSQL's SASLprep leaves it unchanged and the verifier matches."""
    if not isinstance(password, str) or not password or not all(" " <= ch <= "~" for ch in password):
        raise ValueError("tenant password must be non-empty printable ASCII")
    return password


def validate_connection_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < -1:
        raise ValueError("connection limit must be an integer >= -1 (-1: no limit)")
    return limit


@dataclass(frozen=True)
class OwnerRecord:
    """Which Database owns a tenant, kept in the role's COMMENT so a restore can check it.

    The comment is JSON (`{"consumer": ..., "databaseUid": ...}`). Only a role with CREATEROLE (and,
    from 16 on, ADMIN on the role) may change it, so the tenant cannot forge it; everybody on the
    server can read it (`pg_shdescription`), like the role names.
    """

    consumer: str
    database_uid: str

    def __post_init__(self) -> None:
        if not self.consumer or not self.database_uid:
            raise ValueError("an ownership record names a consumer and a Database UID")

    def comment(self) -> str:
        return json.dumps({"consumer": self.consumer, "databaseUid": self.database_uid}, sort_keys=True)

    @classmethod
    def parse(cls, comment: str | None) -> OwnerRecord | None:
        """The record in a role comment; None for no comment or one that is not ours."""
        if not comment:
            return None
        try:
            data = json.loads(comment)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        consumer, uid = data.get("consumer"), data.get("databaseUid")
        if not isinstance(consumer, str) or not isinstance(uid, str) or not consumer or not uid:
            return None
        return cls(consumer, uid)


@dataclass(frozen=True)
class TenantSpec:
    """The desired tenant: `name` is both the role and the database name; `owner` goes into its comment."""

    name: str
    password: str = field(repr=False)
    connection_limit: int
    owner: OwnerRecord | None = None
    pooler: PoolerAccess | None = None
    # The login role handed out with `password`: the tenant role (None) or its alternate (a move
    # carries the alternate, acting as the tenant, to the target).
    login: str | None = None

    def __post_init__(self) -> None:
        validate_tenant_name(self.name)
        validate_password(self.password)
        validate_connection_limit(self.connection_limit)
        if self.login not in (None, self.name, alternate_name(self.name)):
            raise ValueError("the login role must be the tenant role or its alternate")

    @property
    def login_role(self) -> str:
        """The role that logs in with `password`."""
        return self.login or self.name

    @property
    def template(self) -> str:
        return self.pooler.template if self.pooler is not None else TEMPLATE_DATABASE


@dataclass(frozen=True)
class PoolerAccess:
    """What a pgBouncer whose auth_query runs in each database needs of a new tenant database: CONNECT
    for its `auth_user`, and the auth function, copied from `template`."""

    auth_user: str
    template: str

    def __post_init__(self) -> None:
        for name in (self.auth_user, self.template):
            if re.fullmatch(PG_IDENTIFIER_RE, name) is None or len(name.encode()) > PG_IDENTIFIER_MAX_BYTES:
                raise ValueError("the pooler's auth_user and template must be plain identifiers")


@dataclass(frozen=True)
class TenantState:
    """What the shard's catalog shows for one tenant name."""

    name: str
    role_exists: bool
    can_login: bool
    connection_limit: int | None
    database_exists: bool
    owned_by_role: bool
    allow_connections: bool
    public_revoked: bool  # the database ACL has no entry for PUBLIC (not even the default one)
    tenant_can_connect: bool  # the ACL grants CONNECT to the tenant role explicitly
    role_oid: int | None = field(default=None, repr=False, compare=False)
    owner: OwnerRecord | None = field(default=None, compare=False)  # the role's ownership record
    # The tenant's alternate login role (`domain.naming.alternate_name`), made by the first rotation
    # with an overlap: its oid (None: it does not exist) and whether it may log in.
    alternate_oid: int | None = field(default=None, repr=False, compare=False)
    alternate_can_login: bool = field(default=False, compare=False)

    @property
    def absent(self) -> bool:
        return not self.role_exists and not self.database_exists

    @property
    def open(self) -> bool:
        """The database exists, belongs to the role, accepts connections and excludes PUBLIC."""
        return (
            self.database_exists
            and self.owned_by_role
            and self.allow_connections
            and self.public_revoked
            and self.tenant_can_connect
        )

    @property
    def provisioned(self) -> bool:
        """Everything `ensure_tenant` makes is there, and the tenant can log in."""
        return self.role_exists and self.can_login and self.open

    @property
    def disabled(self) -> bool:
        """Nobody can log in as the tenant and its database takes no connections."""
        return (
            not self.absent
            and not (self.role_exists and self.can_login)
            and not self.alternate_can_login
            and not (self.database_exists and self.allow_connections)
        )

    @property
    def role_oids(self) -> tuple[int, ...]:
        """The oids of the tenant role and of its alternate, those that exist."""
        return tuple(oid for oid in (self.role_oid, self.alternate_oid) if oid is not None)


# One row, its columns named as TenantState's fields (and the role's comment, its ownership record).
_STATE = """
SELECT r.oid IS NOT NULL AS role_exists, coalesce(r.rolcanlogin, false) AS can_login,
       r.rolconnlimit AS connection_limit, d.oid IS NOT NULL AS database_exists,
       coalesce(d.datdba = r.oid, false) AS owned_by_role, coalesce(d.datallowconn, false) AS allow_connections,
       coalesce(d.datacl IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM pg_catalog.aclexplode(d.datacl) a WHERE a.grantee = 0),
                false) AS public_revoked,
       coalesce(EXISTS (SELECT 1 FROM pg_catalog.aclexplode(d.datacl) a
                         WHERE a.grantee = r.oid AND a.privilege_type = 'CONNECT'), false) AS tenant_can_connect,
       r.oid AS role_oid, pg_catalog.shobj_description(r.oid, 'pg_authid') AS comment,
       a.oid AS alternate_oid, coalesce(a.rolcanlogin, false) AS alternate_can_login
  FROM (VALUES (%(name)s::text)) AS n(name)
  LEFT JOIN pg_catalog.pg_roles r ON r.rolname = n.name
  LEFT JOIN pg_catalog.pg_database d ON d.datname = n.name
  LEFT JOIN pg_catalog.pg_roles a ON a.rolname = %(alternate)s
"""


def read_state(conn: psycopg.Connection, name: str) -> TenantState:
    """One catalog read (no bound, no classification: for use inside an operation)."""
    row = (
        conn.cursor(row_factory=dict_row).execute(_STATE, {"name": name, "alternate": alternate_name(name)}).fetchone()
    )
    assert row is not None
    comment = row.pop("comment")
    return TenantState(name=name, owner=OwnerRecord.parse(comment), **row)


# -- SCRAM -------------------------------------------------------------------------------------


def scram_verifier(password: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for `password` (RFC 5802 / RFC 7677).

    `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`; PostgreSQL stores a verifier given
    as PASSWORD as it is. Printable ASCII passwords need no SASLprep normalisation.
    """
    return _scram_keys(password, salt=salt, iterations=iterations).verifier()


def _scram_keys(password: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> ScramKeys:
    validate_password(password)
    if salt is None:
        return ScramKeys.new(password, iterations)
    return ScramKeys.derive(password, salt, iterations)


# -- building blocks ---------------------------------------------------------------------------


def _refuse(error_class: str, detail: str) -> SqlFailure:
    # The operation name is filled in by run_operation (SqlFailure.for_operation).
    return SqlFailure(OP_CREATE, error_class, detail=detail)


def _ident(name: str) -> sql.Identifier:
    return sql.Identifier(name)


def _check_owner(state: TenantState) -> None:
    if state.database_exists and not state.owned_by_role:
        raise _refuse(errors.NAME_TAKEN, "a database of this name exists and is not owned by the tenant role")


def _ensure_membership(conn: psycopg.Connection, name: str, role_oid: int) -> None:
    """Make the provisioner able to SET ROLE to the tenant without inheriting its privileges."""
    if conn.info.server_version >= SET_OPTION_MAJOR * 10000:
        row = conn.execute(
            """
            SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
                            WHERE m.roleid = %(role)s
                              AND m.member = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user)
                              AND m.set_option)
            """,
            {"role": role_oid},
        )
        if not _only_row(row)[0]:
            conn.execute(sql.SQL("GRANT {} TO CURRENT_USER WITH SET TRUE, INHERIT FALSE").format(_ident(name)))
    else:
        row = conn.execute(
            """
            SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
                            WHERE m.roleid = %(role)s
                              AND m.member = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user)),
                   (SELECT rolinherit FROM pg_catalog.pg_roles WHERE rolname = current_user)
            """,
            {"role": role_oid},
        )
        member, inherit = _only_row(row)
        if inherit:
            raise _refuse(
                errors.INVALID_PROVISIONER,
                "before PostgreSQL 16 the provisioner role must be NOINHERIT, else it would gain the "
                "tenant's privileges",
            )
        if not member:
            conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(_ident(name)))
    # Whatever the dialect or the server's createrole_self_grant: never hold the tenant's privileges.
    has_role = conn.execute("SELECT pg_catalog.pg_has_role(current_user, %(role)s::oid, 'USAGE')", {"role": role_oid})
    if _only_row(has_role)[0]:
        raise _refuse(
            errors.INVALID_PROVISIONER,
            "the provisioner role inherits the tenant role's privileges (check NOINHERIT and createrole_self_grant)",
        )


def _open(conn: psycopg.Connection, name: str, state: TenantState, pooler: PoolerAccess | None = None) -> None:
    """Revoke PUBLIC, grant CONNECT to the tenant (and the pooler's auth_user), and only then accept
    connections (as the owner)."""
    needs_acl = not state.public_revoked or not state.tenant_can_connect
    if not needs_acl and state.allow_connections:
        return
    with _as_role(conn, name):
        if needs_acl:
            conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(_ident(name)))
            conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(_ident(name), _ident(name)))
        if pooler is not None and not state.allow_connections:
            conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(_ident(name), _ident(pooler.auth_user)))
        if not state.allow_connections:
            conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(_ident(name)))


def _only_row(cursor: psycopg.Cursor[tuple[Any, ...]]) -> tuple[Any, ...]:
    """The row of a query that always returns exactly one (SELECT EXISTS ..., a function call)."""
    row = cursor.fetchone()
    if row is None:
        raise RuntimeError("the query returned no row")
    return row


def _one_statement(statement: sql.Composed) -> Callable[[psycopg.Connection], None]:
    def body(conn: psycopg.Connection) -> None:
        conn.execute(statement)

    return body


# -- provisioning steps (each: check the catalog, then at most its own statements) --------------


def ensure_role(conn: psycopg.Connection, spec: TenantSpec) -> bool:
    """Step 1: the LOGIN role with the spec's password and connection limit.

    Returns True when the tenant was already finished (database open): then nothing was changed,
    not even the password.
    """
    state = read_state(conn, spec.name)
    if state.role_exists:
        _ensure_owner(conn, spec, state)
    if not state.role_exists:
        statement = "CREATE ROLE {} LOGIN PASSWORD {} CONNECTION LIMIT {}"
    elif not (state.database_exists and state.allow_connections):
        # An earlier attempt stopped before the database opened: make the role match the spec (the
        # password comes from the credentials Secret, which is written before any SQL runs).
        statement = "ALTER ROLE {} LOGIN PASSWORD {} CONNECTION LIMIT {}"
    else:
        # A finished tenant (database open) is left alone: set_password, set_connection_limit and
        # enable_tenant change it deliberately.
        return True
    keys = _scram_keys(spec.password)
    remember_login(spec.name, spec.password, keys)  # the login check after creation skips PBKDF2
    verifier = sql.Literal(keys.verifier())
    role = sql.SQL(statement).format(_ident(spec.name), verifier, sql.Literal(spec.connection_limit))
    if state.role_exists or spec.owner is None:
        conn.execute(role)
        return False
    with conn.transaction():  # a new role never exists without its ownership record
        conn.execute(role)
        _comment(conn, spec.name, spec.owner)
    return False


def _comment(conn: psycopg.Connection, name: str, owner: OwnerRecord) -> None:
    conn.execute(sql.SQL("COMMENT ON ROLE {} IS {}").format(_ident(name), sql.Literal(owner.comment())))


def _ensure_owner(conn: psycopg.Connection, spec: TenantSpec, state: TenantState) -> None:
    """Provisioning found the role already there: it must be this Database's (its record), or one the
    provisioner made without a record (a build before records existed, interrupted), which gets one.

    Made by the provisioner is provable from PostgreSQL 16 on only (it holds ADMIN on what it
    created); before 16 CREATEROLE may comment on any role, so a role without a record is refused
    there: it may be somebody else's (docs/upgrade.md says how to check and record it by hand).
    """
    if spec.owner is None or state.owner == spec.owner:
        return
    if state.owner is not None:
        raise _refuse(errors.NAME_TAKEN, "the tenant role carries another Database's ownership record")
    problem = unrecorded_role_problem(conn, state)
    if problem is not None:
        raise _refuse(errors.NAME_TAKEN, problem)
    _comment(conn, spec.name, spec.owner)


def unrecorded_role_problem(conn: psycopg.Connection, state: TenantState) -> str | None:
    """Why provisioning must not take over the role of the tenant's name, which has no ownership
    record (None: the provisioner provably made it, and it is a plain tenant role)."""
    assert state.role_oid is not None
    evidence = read_role_evidence(conn, state.role_oid)
    if evidence.provisioner_admin is None:
        return (
            "a role of this name exists without an ownership record; before PostgreSQL 16 the provider cannot "
            "tell who made it"
        )
    problems = role_problems(evidence)
    return f"a role of this name exists that the provider did not make: {problems[0]}" if problems else None


def ensure_membership(conn: psycopg.Connection, spec: TenantSpec) -> None:
    """Step 2: SET (not INHERIT) on the tenant role, needed for OWNER and owner-only statements."""
    state = read_state(conn, spec.name)
    if not state.role_exists or state.role_oid is None:
        raise _refuse(errors.NOT_FOUND, "the tenant role does not exist")
    _ensure_membership(conn, spec.name, state.role_oid)


def ensure_database(conn: psycopg.Connection, spec: TenantSpec) -> None:
    """Step 3: the database, owned by the tenant and closed to everybody until step 4."""
    state = read_state(conn, spec.name)
    if not state.role_exists:
        raise _refuse(errors.NOT_FOUND, "the tenant role does not exist")
    _check_owner(state)
    if not state.database_exists:
        # template0 takes no connections: no tenant session can block the copy or plant objects in it.
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {} TEMPLATE {} ALLOW_CONNECTIONS false").format(
                _ident(spec.name), _ident(spec.name), _ident(spec.template)
            )
        )


def open_database(conn: psycopg.Connection, spec: TenantSpec) -> None:
    """Step 4: as the owner, revoke PUBLIC, grant CONNECT to the tenant, then allow connections."""
    state = read_state(conn, spec.name)
    if not state.database_exists:
        raise _refuse(errors.NOT_FOUND, "the tenant database does not exist")
    _check_owner(state)
    _open(conn, spec.name, state, spec.pooler)


PROVISIONING_STEPS: tuple[Callable[[psycopg.Connection, TenantSpec], object], ...] = (
    ensure_role,
    ensure_membership,
    ensure_database,
    open_database,
)


# -- operations --------------------------------------------------------------------------------


def ensure_tenant(admin: Admin, spec: TenantSpec, *, timeout: float = OPERATION_TIMEOUT) -> bool:
    """Create or finish the tenant (operation "create"). On a finished tenant it only reads.

    Returns True when the tenant was already finished, so a caller holding a new password knows
    it must still set it (`set_password`).
    """

    def body(conn: psycopg.Connection) -> bool:
        finished = ensure_role(conn, spec)
        for step in PROVISIONING_STEPS[1:]:
            step(conn, spec)
        return finished

    return run_operation(admin, OP_CREATE, body, timeout=timeout)


def set_connection_limit(admin: Admin, name: str, limit: int, *, timeout: float = OPERATION_TIMEOUT) -> None:
    """`ALTER ROLE ... CONNECTION LIMIT` on the tenant role and, where it exists, on its alternate
    (operation "set limit"); LOGIN is untouched."""
    validate_tenant_name(name)
    validate_connection_limit(limit)

    def body(conn: psycopg.Connection) -> None:
        roles = [name] + ([alternate_name(name)] if read_state(conn, name).alternate_oid is not None else [])
        for role in roles:
            conn.execute(sql.SQL("ALTER ROLE {} CONNECTION LIMIT {}").format(_ident(role), sql.Literal(limit)))

    run_operation(admin, OP_SET_LIMIT, body, timeout=timeout)


def set_password(
    admin: Admin, name: str, password: str, *, end_sessions: bool = False, timeout: float = OPERATION_TIMEOUT
) -> None:
    """Exactly one `ALTER ROLE ... PASSWORD '<SCRAM verifier>'` (operation "rotate").

    Sessions opened with the old password survive it (PostgreSQL checks a password only at login);
    `end_sessions` ends them afterwards, as the tenant, for a consumer rotating a leaked password.
    """
    validate_tenant_name(name)
    statement = sql.SQL("ALTER ROLE {} PASSWORD {}").format(_ident(name), sql.Literal(scram_verifier(password)))

    def body(conn: psycopg.Connection) -> None:
        conn.execute(statement)
        if end_sessions:
            state = read_state(conn, name)
            if state.role_oid is not None and _has_sessions(conn, state.role_oid):
                _ensure_membership(conn, name, state.role_oid)
                _end_sessions(conn, name, state.role_oid)

    run_operation(admin, OP_ROTATE, body, timeout=timeout)


def _close(conn: psycopg.Connection, name: str, state: TenantState) -> None:
    """NOLOGIN, ALLOW_CONNECTIONS false, no session left. Needs SET on the role.

    Sessions are ended before each statement a tenant session could hold up (an open transaction
    that altered its own role or database keeps that catalog row locked), and again at the end
    for any session that logged in meanwhile.
    """
    assert state.role_oid is not None
    _close_alternate(conn, name, state)
    _end_sessions(conn, name, state.role_oid)
    if state.can_login:
        conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(_ident(name)))
    if state.database_exists and state.allow_connections:
        _end_sessions(conn, name, state.role_oid)
        with _as_role(conn, name):
            conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(_ident(name)))
    _end_sessions(conn, name, state.role_oid)
    _close_alternate(conn, name, state)


def _close_alternate(conn: psycopg.Connection, name: str, state: TenantState) -> None:
    """NOLOGIN for the tenant's alternate, and none of its sessions left (as the alternate, on
    which the provisioner takes SET as on the tenant role)."""
    oid = state.alternate_oid
    if oid is None:
        return
    alternate = alternate_name(name)
    _ensure_membership(conn, alternate, oid)
    _end_sessions(conn, alternate, oid)
    if state.alternate_can_login:  # (the second call of a close finds it again: harmless)
        conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(_ident(alternate)))
    _end_sessions(conn, alternate, oid)


def _any_sessions(conn: psycopg.Connection, state: TenantState) -> bool:
    return any(_has_sessions(conn, oid) for oid in state.role_oids)


def _despite_sessions(
    conn: psycopg.Connection, name: str, steps: Callable[[psycopg.Connection, str, TenantState], None]
) -> None:
    """Run `steps` on a fresh catalog read; when a tenant session blocks them, run them again.

    A blocked statement fails with lock_timeout (a lock held by a tenant transaction) or
    object_in_use (a session still in the database); every attempt ends the tenant's sessions
    before such statements, so a tenant cannot stop its own disable or drop.
    """
    for attempt in range(SESSION_RETRIES):
        try:
            steps(conn, name, read_state(conn, name))
            return
        except (pgerrors.LockNotAvailable, pgerrors.ObjectInUse):
            if attempt + 1 >= SESSION_RETRIES:
                raise


def _disable_steps(conn: psycopg.Connection, name: str, state: TenantState) -> None:
    _check_owner(state)
    if not state.role_exists or state.role_oid is None:
        return  # no role: nobody can log in as it (and it can own no database)
    if state.disabled and not _any_sessions(conn, state):
        return
    _ensure_membership(conn, name, state.role_oid)
    _close(conn, name, state)


def _drop_steps(conn: psycopg.Connection, name: str, state: TenantState) -> None:
    _check_owner(state)
    if not state.role_exists or state.role_oid is None:
        return  # no role, hence no database of it either: already dropped
    _disable_steps(conn, name, state)
    with _as_role(conn, name):
        if state.database_exists:
            # Waits up to 5 s for the ended backends to exit, else object_in_use (tried again).
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(_ident(name)))
    if state.alternate_oid is not None:
        # The alternate first: it is a member of the tenant role. Whatever it owns in the tenant's
        # database went with the database; what it made elsewhere goes as the tenant's does.
        alternate = alternate_name(name)
        with _as_role(conn, alternate):
            conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(_ident(alternate)))
        drop_role(conn, alternate, state.alternate_oid)
    with _as_role(conn, name):
        # What the tenant made in the admin database (objects where PUBLIC may create, default
        # privileges anyone may set, and what another tenant built on them) would otherwise make
        # DROP ROLE fail with dependent_objects.
        conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(_ident(name)))
    # What other tenants granted to the role, in their own databases too, goes first (foreign_grants).
    drop_role(conn, name, state.role_oid)


def disable_tenant(admin: Admin, name: str, *, timeout: float = OPERATION_TIMEOUT) -> None:
    """NOLOGIN, ALLOW_CONNECTIONS false, and end the tenant's sessions (operation "disable").

    Nothing is dropped; `enable_tenant` restores access with the same credentials. A tenant that
    does not exist is already disabled. Sessions of the tenant holding locks are ended first.
    """
    validate_tenant_name(name)

    def body(conn: psycopg.Connection) -> None:
        _despite_sessions(conn, name, _disable_steps)

    run_operation(admin, OP_DISABLE, body, timeout=timeout)


def enable_tenant(admin: Admin, name: str, *, login: str | None = None, timeout: float = OPERATION_TIMEOUT) -> None:
    """LOGIN and ALLOW_CONNECTIONS true again, with the unchanged password (operation "enable").

    `login` is the role handed out to the consumer (the tenant role, or its alternate after a rotation
    with an overlap): only it may log in again; the other one stays NOLOGIN.
    """
    validate_tenant_name(name)
    login = name if login is None else login
    if login not in (name, alternate_name(name)):
        raise ValueError("the login role must be the tenant role or its alternate")

    def body(conn: psycopg.Connection) -> None:
        state = read_state(conn, name)
        if not state.role_exists or not state.database_exists or state.role_oid is None:
            raise _refuse(errors.NOT_FOUND, "the tenant role or database does not exist")
        _check_owner(state)
        if login != name and state.alternate_oid is None:
            raise _refuse(errors.NOT_FOUND, "the tenant's alternate role does not exist")
        can_login = state.can_login if login == name else state.alternate_can_login
        if not can_login:
            conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(_ident(login)))
        if not state.open:
            _ensure_membership(conn, name, state.role_oid)
            _open(conn, name, state)

    run_operation(admin, OP_ENABLE, body, timeout=timeout)


def drop_tenant(admin: Admin, name: str, *, timeout: float = OPERATION_TIMEOUT) -> None:
    """Drop the database (as its owner) and then the role (operation "drop"); idempotent.

    Closes the tenant first (NOLOGIN, ALLOW_CONNECTIONS false, sessions ended) so nothing can
    reconnect in between. Never drops a database of that name that the tenant role does not own.
    """
    validate_tenant_name(name)

    def body(conn: psycopg.Connection) -> None:
        _despite_sessions(conn, name, _drop_steps)

    run_operation(admin, OP_DROP, body, timeout=timeout)


def claim_tenant(
    admin: Admin,
    name: str,
    owner: OwnerRecord,
    released: Callable[[OwnerRecord], bool],
    *,
    timeout: float = OPERATION_TIMEOUT,
) -> None:
    """Restore: make `owner` the owner of an existing tenant (operation "restore").

    Allowed when the role's ownership record names `owner` already, or names the same consumer and
    a Database that `released(record)` confirms is gone; then the record is rewritten to `owner`.
    Otherwise `restore_refused`, and nothing on the shard changes. Restores of one tenant name
    are serialized by a transaction-scoped advisory lock, so two cannot both win; call `released`
    with a fresh (uncached) read, it runs under that lock.
    """
    validate_tenant_name(name)

    def body(conn: psycopg.Connection) -> None:
        with conn.transaction():
            _lock_tenant(conn, name)
            state = read_state(conn, name)
            if not state.role_exists or not state.database_exists:
                raise _restore_refused("there is no tenant role and database of this name on the shard")
            _check_owner(state)
            record = state.owner
            if record == owner:
                return  # claimed already (an earlier pass stopped before recording it)
            if record is None:
                raise _restore_refused("the tenant role carries no ownership record")
            if record.consumer != owner.consumer:
                raise _restore_refused("the tenant belongs to another consumer")
            if not released(record):
                raise _restore_refused("the Database that owns the tenant still exists")
            _comment(conn, name, owner)

    run_operation(admin, OP_RESTORE, body, timeout=timeout)


def _restore_refused(detail: str) -> SqlFailure:
    return SqlFailure(OP_RESTORE, errors.RESTORE_REFUSED, detail=detail)


# -- ownership of tenants made before ownership records existed --------------------------------


@dataclass(frozen=True)
class RoleEvidence:
    """What the catalog tells about who made a role: the provider's tenant roles are plain LOGIN roles,
    members of no role, owning no database but their own, and (from 16 on) administered by the
    provisioner, which holds ADMIN on every role it created."""

    attributes: tuple[str, ...]  # superuser, createdb, createrole, replication, bypassrls: the ones it has
    member_of: int
    other_databases: int
    provisioner_admin: bool | None  # None before PostgreSQL 16 (no such proof there)


_EVIDENCE = """
SELECT r.rolsuper, r.rolcreatedb, r.rolcreaterole, r.rolreplication, r.rolbypassrls,
       (SELECT count(*) FROM pg_catalog.pg_auth_members m WHERE m.member = r.oid),
       (SELECT count(*) FROM pg_catalog.pg_database d WHERE d.datdba = r.oid AND d.datname <> r.rolname),
       EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
                WHERE m.roleid = r.oid AND m.admin_option
                  AND m.member = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user))
  FROM pg_catalog.pg_roles r WHERE r.oid = %(role)s
"""
_ATTRIBUTES = ("superuser", "createdb", "createrole", "replication", "bypassrls")


def read_role_evidence(conn: psycopg.Connection, role_oid: int) -> RoleEvidence:
    row = conn.execute(_EVIDENCE, {"role": role_oid}).fetchone()
    assert row is not None
    attributes = tuple(name for name, has in zip(_ATTRIBUTES, row[:5], strict=True) if has)
    admin = row[7] if conn.info.server_version >= SET_OPTION_MAJOR * 10000 else None
    return RoleEvidence(attributes, row[5], row[6], admin)


def role_problems(evidence: RoleEvidence) -> list[str]:
    """Why a role does not look like one the provisioner made (empty: it does)."""
    problems = []
    if evidence.attributes:
        problems.append(f"the role has {', '.join(evidence.attributes)}")
    if evidence.member_of:
        problems.append("the role is a member of other roles")
    if evidence.other_databases:
        problems.append("the role owns other databases")
    if evidence.provisioner_admin is False:
        problems.append("the provisioner does not hold ADMIN on the role, so it did not create it")
    return problems


class Ownership(enum.StrEnum):
    """What a tenant's ownership record says about a Database that is Ready on it."""

    RECORDED = "recorded"  # the record names this Database
    ADOPTABLE = "adoptable"  # no record, and role and database are as the provider makes them
    ADOPTED = "adopted"  # was adoptable; the record has just been written
    FOREIGN = "foreign"  # no record, and something does not look like the provider's work
    OTHER_OWNER = "other_owner"  # the record names another Database
    MISSING = "missing"  # no role or no database of this name


@dataclass(frozen=True)
class OwnershipCheck:
    """The verdict on one tenant, and why (`problems`, sentences of the provider's own)."""

    verdict: Ownership
    problems: tuple[str, ...] = ()


def ownership_problems(state: TenantState, evidence: RoleEvidence, connection_limit: int | None) -> list[str]:
    """Why a provisioned tenant without a record is not adoptable: its role and database must be
    exactly as `ensure_tenant` leaves them, with the connection limit its Database recorded."""
    problems = role_problems(evidence)
    if not state.owned_by_role:
        problems.append("the database of this name is not owned by the role")
    if not (state.public_revoked and state.tenant_can_connect):
        problems.append("the database's privileges are not the provider's (PUBLIC revoked, CONNECT for the role)")
    if connection_limit is not None and state.connection_limit != connection_limit:
        problems.append("the role's connection limit is not the one its Database recorded")
    return problems


def inspect_ownership(
    conn: psycopg.Connection, name: str, owner: OwnerRecord, connection_limit: int | None
) -> OwnershipCheck:
    """The verdict on tenant `name` for the Database `owner` (reads only; the upgrade check uses it too)."""
    state = read_state(conn, name)
    if state.owner == owner:
        return OwnershipCheck(Ownership.RECORDED)
    if state.owner is not None:
        return OwnershipCheck(Ownership.OTHER_OWNER, ("the role's ownership record names another Database",))
    if not state.role_exists or not state.database_exists or state.role_oid is None:
        return OwnershipCheck(Ownership.MISSING, ("there is no role and database of this name",))
    problems = ownership_problems(state, read_role_evidence(conn, state.role_oid), connection_limit)
    return OwnershipCheck(Ownership.FOREIGN if problems else Ownership.ADOPTABLE, tuple(problems))


def inspect_provisioning(conn: psycopg.Connection, name: str, owner: OwnerRecord) -> OwnershipCheck:
    """The verdict on tenant `name` for a Database still to be provisioned (reads only): what
    `ensure_tenant` will find. MISSING (nothing there yet) is the usual case."""
    state = read_state(conn, name)
    if not state.role_exists:
        return OwnershipCheck(Ownership.MISSING)
    if state.owner == owner:
        return OwnershipCheck(Ownership.RECORDED)
    if state.owner is not None:
        return OwnershipCheck(Ownership.OTHER_OWNER, ("the role's ownership record names another Database",))
    problem = unrecorded_role_problem(conn, state)
    return OwnershipCheck(Ownership.ADOPTABLE) if problem is None else OwnershipCheck(Ownership.FOREIGN, (problem,))


def confirm_ownership(
    admin: Admin, name: str, owner: OwnerRecord, connection_limit: int | None, *, timeout: float = OPERATION_TIMEOUT
) -> OwnershipCheck:
    """Operation "ownership": the record of a provisioned tenant names `owner`, or is written now.

    A tenant without a record (made before records existed) is adopted when it is adoptable
    (`ownership_problems`); the record is then written under the lock `claim_tenant` takes, after
    reading the catalog again. Anything else is only reported. One catalog read when the record is
    there already.
    """
    validate_tenant_name(name)

    def body(conn: psycopg.Connection) -> OwnershipCheck:
        check = inspect_ownership(conn, name, owner, connection_limit)
        if check.verdict != Ownership.ADOPTABLE:
            return check
        with conn.transaction():
            _lock_tenant(conn, name)
            check = inspect_ownership(conn, name, owner, connection_limit)
            if check.verdict != Ownership.ADOPTABLE:
                return check
            _comment(conn, name, owner)
        return OwnershipCheck(Ownership.ADOPTED)

    return run_operation(admin, OP_OWNERSHIP, body, timeout=timeout)


def _lock_tenant(conn: psycopg.Connection, name: str) -> None:
    """Serialize the writers of a tenant's ownership record (restore, adoption) until the transaction ends."""
    conn.execute(
        "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(%(key)s, 0))",
        {"key": f"dbprovider restore {name}"},
    )


def tenant_state(admin: Admin, name: str, *, timeout: float = OPERATION_TIMEOUT) -> TenantState:
    """The catalog's view of one tenant (operation "inspect"), for the controllers' checks."""
    validate_tenant_name(name)
    return run_operation(admin, OP_INSPECT, lambda conn: read_state(conn, name), timeout=timeout)
