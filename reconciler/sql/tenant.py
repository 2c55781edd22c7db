"""The SQL of one tenant on a shard: a LOGIN role and a database of the same name that only it reaches.

Plain functions over (admin connection or `AdminSession`, desired state). Every public operation is
bounded by `timeout` (default `OPERATION_TIMEOUT`), retried on a new session after a connection
loss when given an `AdminSession`, reads the catalog before each change (so re-running it after a
crash at any point converges), and fails only with a sanitized `SqlFailure`.

Provisioning (`PROVISIONING_STEPS`, run by `ensure_tenant`), each step skipped when the catalog
shows it done:

1. role:       CREATE ROLE t LOGIN PASSWORD '<SCRAM verifier>' CONNECTION LIMIT n
2. membership: GRANT t TO CURRENT_USER WITH SET TRUE, INHERIT FALSE   (16+)
               GRANT t TO CURRENT_USER                                 (before 16, NOINHERIT provisioner)
3. database:   CREATE DATABASE t OWNER t ALLOW_CONNECTIONS false
4. open:       SET ROLE t; REVOKE ALL ON DATABASE t FROM PUBLIC; GRANT CONNECT ON DATABASE t TO t;
               ALTER DATABASE t ALLOW_CONNECTIONS true; RESET ROLE

Passwords are sent only as SCRAM-SHA-256 verifiers computed here, so no statement (not even with
log_statement=all) carries a plaintext password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from domain.naming import PG_IDENTIFIER_MAX_BYTES, PG_IDENTIFIER_RE
from reconciler.sql import errors
from reconciler.sql.errors import SqlFailure
from reconciler.sql.provisioner import SET_OPTION_MAJOR
from reconciler.sql.session import OPERATION_TIMEOUT, Admin, run_operation

SCRAM_ITERATIONS = 4096  # PostgreSQL's default scram_iterations
SCRAM_SALT_BYTES = 16
TERMINATE_WAIT_MS = 5000  # pg_terminate_backend(pid, timeout) waits for the backend to exit (14+)

# Operation names, as they appear in "<operation> failed: <class>".
OP_CREATE = "create"
OP_SET_LIMIT = "set limit"
OP_ROTATE = "rotate"
OP_DISABLE = "disable"
OP_ENABLE = "enable"
OP_DROP = "drop"
OP_INSPECT = "inspect"


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
class TenantSpec:
    """The desired tenant: `name` is both the role and the database name."""

    name: str
    password: str = field(repr=False)
    connection_limit: int

    def __post_init__(self) -> None:
        validate_tenant_name(self.name)
        validate_password(self.password)
        validate_connection_limit(self.connection_limit)


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
            and not (self.database_exists and self.allow_connections)
        )


_STATE = """
SELECT r.oid, coalesce(r.rolcanlogin, false), r.rolconnlimit,
       d.oid IS NOT NULL, coalesce(d.datdba = r.oid, false), coalesce(d.datallowconn, false),
       coalesce(d.datacl IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM pg_catalog.aclexplode(d.datacl) a WHERE a.grantee = 0),
                false),
       coalesce(EXISTS (SELECT 1 FROM pg_catalog.aclexplode(d.datacl) a
                         WHERE a.grantee = r.oid AND a.privilege_type = 'CONNECT'), false)
  FROM (VALUES (%(name)s::text)) AS n(name)
  LEFT JOIN pg_catalog.pg_roles r ON r.rolname = n.name
  LEFT JOIN pg_catalog.pg_database d ON d.datname = n.name
"""


def read_state(conn: psycopg.Connection, name: str) -> TenantState:
    """One catalog read (no bound, no classification: for use inside an operation)."""
    row = conn.execute(_STATE, {"name": name}).fetchone()
    assert row is not None
    role_oid, can_login, limit, db_exists, owned, allow, public_revoked, tenant_connect = row
    return TenantState(
        name=name,
        role_exists=role_oid is not None,
        can_login=can_login,
        connection_limit=limit,
        database_exists=db_exists,
        owned_by_role=owned,
        allow_connections=allow,
        public_revoked=public_revoked,
        tenant_can_connect=tenant_connect,
        role_oid=role_oid,
    )


# -- SCRAM -------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def scram_verifier(password: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for `password` (RFC 5802 / RFC 7677).

    `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`; PostgreSQL stores a verifier given
    as PASSWORD as it is. Printable ASCII passwords need no SASLprep normalisation.
    """
    validate_password(password)
    salt = os.urandom(SCRAM_SALT_BYTES) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    return f"SCRAM-SHA-256${iterations}:{_b64(salt)}${_b64(stored_key)}:{_b64(server_key)}"


# -- building blocks ---------------------------------------------------------------------------


def _refuse(error_class: str, detail: str) -> SqlFailure:
    # The operation name is filled in by run_operation (SqlFailure.for_operation).
    return SqlFailure(OP_CREATE, error_class, detail=detail)


def _ident(name: str) -> sql.Identifier:
    return sql.Identifier(name)


@contextmanager
def _as_role(conn: psycopg.Connection, name: str) -> Iterator[None]:
    """Run owner-only statements as the tenant role (needs SET on it), then return to ourselves."""
    conn.execute(sql.SQL("SET ROLE {}").format(_ident(name)))
    try:
        yield
    finally:
        if not conn.broken and not conn.closed:
            conn.execute("RESET ROLE")


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
        ).fetchone()
        if not row[0]:
            conn.execute(
                sql.SQL("GRANT {} TO CURRENT_USER WITH SET TRUE, INHERIT FALSE").format(_ident(name))
            )
    else:
        row = conn.execute(
            """
            SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
                            WHERE m.roleid = %(role)s
                              AND m.member = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user)),
                   (SELECT rolinherit FROM pg_catalog.pg_roles WHERE rolname = current_user)
            """,
            {"role": role_oid},
        ).fetchone()
        member, inherit = row
        if inherit:
            raise _refuse(
                errors.INVALID_PROVISIONER,
                "before PostgreSQL 16 the provisioner role must be NOINHERIT, else it would gain the "
                "tenant's privileges",
            )
        if not member:
            conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(_ident(name)))
    # Whatever the dialect or the server's createrole_self_grant: never hold the tenant's privileges.
    row = conn.execute("SELECT pg_catalog.pg_has_role(current_user, %(role)s::oid, 'USAGE')", {"role": role_oid})
    if row.fetchone()[0]:
        raise _refuse(
            errors.INVALID_PROVISIONER,
            "the provisioner role inherits the tenant role's privileges (check NOINHERIT and "
            "createrole_self_grant)",
        )


def _open(conn: psycopg.Connection, name: str, state: TenantState) -> None:
    """Revoke PUBLIC, grant CONNECT to the tenant, and only then accept connections (as the owner)."""
    needs_acl = not state.public_revoked or not state.tenant_can_connect
    if not needs_acl and state.allow_connections:
        return
    with _as_role(conn, name):
        if needs_acl:
            conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(_ident(name)))
            conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(_ident(name), _ident(name)))
        if not state.allow_connections:
            conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(_ident(name)))


def _terminate_sessions(conn: psycopg.Connection, role_oid: int) -> None:
    """End every session of the tenant role. Must run under SET ROLE tenant.

    Signalling another backend needs the privileges of its role (or pg_signal_backend). The
    provisioner does not inherit the tenant's privileges, so it cannot do this as itself on 15, 16
    or 18; as the tenant (SET ROLE) it can, and only for the tenant's own sessions.
    """
    # pg_terminate_backend(pid, timeout) (14+) waits until the backend has gone.
    if conn.info.server_version >= 140000:
        conn.execute(_TERMINATE_AND_WAIT, {"role": role_oid, "wait": TERMINATE_WAIT_MS}).fetchall()
    else:
        conn.execute(_TERMINATE, {"role": role_oid}).fetchall()


_TERMINATE_AND_WAIT = """
SELECT pg_catalog.pg_terminate_backend(pid, %(wait)s::bigint) FROM pg_catalog.pg_stat_activity
 WHERE usesysid = %(role)s AND pid <> pg_catalog.pg_backend_pid()
"""
_TERMINATE = """
SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
 WHERE usesysid = %(role)s AND pid <> pg_catalog.pg_backend_pid()
"""


def _one_statement(statement: sql.Composed) -> Callable[[psycopg.Connection], None]:
    def body(conn: psycopg.Connection) -> None:
        conn.execute(statement)

    return body


def _has_sessions(conn: psycopg.Connection, role_oid: int) -> bool:
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity"
        " WHERE usesysid = %(role)s AND pid <> pg_catalog.pg_backend_pid())",
        {"role": role_oid},
    ).fetchone()
    return bool(row[0])


# -- provisioning steps (each: check the catalog, then at most its own statements) --------------


def ensure_role(conn: psycopg.Connection, spec: TenantSpec) -> bool:
    """Step 1: the LOGIN role with the spec's password and connection limit.

    Returns True when the tenant was already finished (database open): then nothing was changed,
    not even the password.
    """
    state = read_state(conn, spec.name)
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
    verifier = sql.Literal(scram_verifier(spec.password))
    conn.execute(sql.SQL(statement).format(_ident(spec.name), verifier, sql.Literal(spec.connection_limit)))
    return False


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
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {} ALLOW_CONNECTIONS false").format(
                _ident(spec.name), _ident(spec.name)
            )
        )


def open_database(conn: psycopg.Connection, spec: TenantSpec) -> None:
    """Step 4: as the owner, revoke PUBLIC, grant CONNECT to the tenant, then allow connections."""
    state = read_state(conn, spec.name)
    if not state.database_exists:
        raise _refuse(errors.NOT_FOUND, "the tenant database does not exist")
    _check_owner(state)
    _open(conn, spec.name, state)


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
    """Exactly one `ALTER ROLE ... CONNECTION LIMIT` (operation "set limit"); LOGIN is untouched."""
    validate_tenant_name(name)
    validate_connection_limit(limit)
    statement = sql.SQL("ALTER ROLE {} CONNECTION LIMIT {}").format(_ident(name), sql.Literal(limit))
    run_operation(admin, OP_SET_LIMIT, _one_statement(statement), timeout=timeout)


def set_password(admin: Admin, name: str, password: str, *, timeout: float = OPERATION_TIMEOUT) -> None:
    """Exactly one `ALTER ROLE ... PASSWORD '<SCRAM verifier>'` (operation "rotate")."""
    validate_tenant_name(name)
    statement = sql.SQL("ALTER ROLE {} PASSWORD {}").format(_ident(name), sql.Literal(scram_verifier(password)))
    run_operation(admin, OP_ROTATE, _one_statement(statement), timeout=timeout)


def disable_tenant(admin: Admin, name: str, *, timeout: float = OPERATION_TIMEOUT) -> None:
    """NOLOGIN, ALLOW_CONNECTIONS false, and end the tenant's sessions (operation "disable").

    Nothing is dropped; `enable_tenant` restores access with the same credentials. A tenant that
    does not exist is already disabled.
    """
    validate_tenant_name(name)

    def body(conn: psycopg.Connection) -> None:
        state = read_state(conn, name)
        _check_owner(state)
        if not state.role_exists or state.role_oid is None:
            return  # no role: nobody can log in as it (and it can own no database)
        if state.can_login:
            conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(_ident(name)))
        close = state.database_exists and state.allow_connections
        if close or _has_sessions(conn, state.role_oid):
            _ensure_membership(conn, name, state.role_oid)
            with _as_role(conn, name):
                if close:
                    conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(_ident(name)))
                _terminate_sessions(conn, state.role_oid)

    run_operation(admin, OP_DISABLE, body, timeout=timeout)


def enable_tenant(admin: Admin, name: str, *, timeout: float = OPERATION_TIMEOUT) -> None:
    """LOGIN and ALLOW_CONNECTIONS true again, with the unchanged password (operation "enable")."""
    validate_tenant_name(name)

    def body(conn: psycopg.Connection) -> None:
        state = read_state(conn, name)
        if not state.role_exists or not state.database_exists or state.role_oid is None:
            raise _refuse(errors.NOT_FOUND, "the tenant role or database does not exist")
        _check_owner(state)
        if not state.can_login:
            conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(_ident(name)))
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
        state = read_state(conn, name)
        _check_owner(state)
        if not state.role_exists or state.role_oid is None:
            return  # no role, hence no database of it either: already dropped
        if state.can_login:
            conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(_ident(name)))
        if state.database_exists or _has_sessions(conn, state.role_oid):
            _ensure_membership(conn, name, state.role_oid)
            with _as_role(conn, name):
                if state.database_exists and state.allow_connections:
                    conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(_ident(name)))
                _terminate_sessions(conn, state.role_oid)
                if state.database_exists:
                    # Waits up to 5 s for the terminated backends to exit, else object_in_use.
                    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(_ident(name)))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(_ident(name)))

    run_operation(admin, OP_DROP, body, timeout=timeout)


def tenant_state(admin: Admin, name: str, *, timeout: float = OPERATION_TIMEOUT) -> TenantState:
    """The catalog's view of one tenant (operation "inspect"), for the controllers' checks."""
    validate_tenant_name(name)
    return run_operation(admin, OP_INSPECT, lambda conn: read_state(conn, name), timeout=timeout)
