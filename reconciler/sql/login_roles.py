"""Two login roles per tenant that take turns, so a rotation can keep the old credentials working.

PostgreSQL keeps one password per role. A rotation with an overlap therefore sets the new password
on the tenant's other login role, hands that one out, and takes the previous one's login away only
when the overlap is over. The roles:

- the tenant role `t` (`TenantSpec.name`): owns the database and everything in it, as always;
- its alternate `t_alt` (`domain.naming.alternate_name`), made by the first rotation that needs it:
  LOGIN, a member of `t` (INHERIT and SET), `ALTER ROLE t_alt SET role = t` so that what its sessions
  create is owned by `t`, the same connection limit as `t`. It reaches the database through `t`'s
  CONNECT. The provisioner holds SET (never INHERIT) on it as on `t`, to end its sessions.

Neither role can change the other's attributes: neither has CREATEROLE, and `t` is not a member of
`t_alt`. A session of `t_alt` acts as `t`, the same tenant, with nothing more.

Statements (each operation reads the catalog first, so a re-run after a crash at any point converges):

    make the alternate (one transaction):
        CREATE ROLE t_alt NOLOGIN CONNECTION LIMIT n
        GRANT t_alt TO CURRENT_USER WITH SET TRUE, INHERIT FALSE     (16+; before 16: GRANT t_alt TO CURRENT_USER)
        GRANT t TO t_alt WITH INHERIT TRUE, SET TRUE                  (16+; before 16: GRANT t TO t_alt)
        ALTER ROLE t_alt SET role = 't'
    hand out:  ALTER ROLE <login> LOGIN PASSWORD '<SCRAM verifier>' CONNECTION LIMIT n
    retire:    ALTER ROLE <other> NOLOGIN PASSWORD NULL   (and, when asked, its sessions ended)
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from domain.naming import alternate_name
from reconciler.sql import errors
from reconciler.sql.errors import SqlFailure
from reconciler.sql.provisioner import SET_OPTION_MAJOR
from reconciler.sql.roles import end_sessions as _end_sessions
from reconciler.sql.session import OPERATION_TIMEOUT, Admin, run_operation
from reconciler.sql.tenant import (
    OP_ROTATE,
    TenantState,
    _ensure_membership,
    read_state,
    scram_verifier,
    validate_connection_limit,
    validate_tenant_name,
)

OP_RETIRE = "retire"

# The alternate's membership in the tenant role, with INHERIT and SET (before 16, INHERIT is the
# member's attribute and every membership allows SET ROLE), and its own settings as (database, text).
_ALTERNATE = """
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
                WHERE m.roleid = %(tenant)s AND m.member = %(alternate)s {options}),
       coalesce((SELECT array_agg(x.setdatabase::text || ' ' || s.setting ORDER BY s.setting)
                   FROM pg_catalog.pg_db_role_setting x, unnest(x.setconfig) AS s(setting)
                  WHERE x.setrole = %(alternate)s), '{{}}')
"""


def other_login(name: str, login: str) -> str:
    """The login role of the tenant `name` that is not `login`."""
    alternate = alternate_name(name)
    if login == name:
        return alternate
    if login == alternate:
        return name
    raise ValueError("the login role must be the tenant role or its alternate")


def alternate_setting(name: str) -> str:
    """The one role setting the provider gives the alternate of tenant `name`, as `pg_db_role_setting` shows it."""
    return f"role={name}"


def alternate_problems(conn: psycopg.Connection, name: str, state: TenantState) -> list[str]:
    """What differs on the tenant's alternate from what the provider made of it (empty: nothing, or
    there is no alternate): the membership in the tenant role and exactly one setting, `role`."""
    if state.alternate_oid is None or state.role_oid is None:
        return []
    member, settings = _read_alternate(conn, state)
    problems = []
    if not member:
        problems.append("the alternate role is not a member of the tenant role")
    if list(settings) != [f"0 {alternate_setting(name)}"]:
        problems.append("parameters set for the alternate role other than the provider's")
    return problems


def _read_alternate(conn: psycopg.Connection, state: TenantState) -> tuple[bool, list[str]]:
    modern = conn.info.server_version >= SET_OPTION_MAJOR * 10000
    options = "AND m.inherit_option AND m.set_option" if modern else ""
    row = conn.execute(
        sql.SQL(_ALTERNATE.format(options=options)),
        {"tenant": state.role_oid, "alternate": state.alternate_oid},
    ).fetchone()
    assert row is not None
    return bool(row[0]), list(row[1])


def ensure_alternate(conn: psycopg.Connection, name: str, connection_limit: int) -> int:
    """Make the tenant's alternate as the module docstring says (what is there is kept); its oid."""
    alternate = alternate_name(name)
    with conn.transaction():
        state = read_state(conn, name)
        if state.role_oid is None:
            raise SqlFailure(OP_ROTATE, errors.NOT_FOUND, detail="the tenant role does not exist")
        if state.alternate_oid is None:
            conn.execute(
                sql.SQL("CREATE ROLE {} NOLOGIN CONNECTION LIMIT {}").format(
                    sql.Identifier(alternate), sql.Literal(connection_limit)
                )
            )
            state = read_state(conn, name)
        assert state.alternate_oid is not None
        _ensure_membership(conn, alternate, state.alternate_oid)
        member, settings = _read_alternate(conn, state)
        if not member:
            grant = "GRANT {} TO {}"
            if conn.info.server_version >= SET_OPTION_MAJOR * 10000:
                grant += " WITH INHERIT TRUE, SET TRUE"
            conn.execute(sql.SQL(grant).format(sql.Identifier(name), sql.Identifier(alternate)))
        if settings != [f"0 {alternate_setting(name)}"]:
            conn.execute(sql.SQL("ALTER ROLE {} RESET ALL").format(sql.Identifier(alternate)))
            conn.execute(sql.SQL("ALTER ROLE {} SET role = {}").format(sql.Identifier(alternate), sql.Literal(name)))
        return state.alternate_oid


def hand_out(
    admin: Admin,
    name: str,
    login: str,
    password: str,
    connection_limit: int,
    *,
    end_sessions: bool = False,
    retire_other: bool = False,
    timeout: float = OPERATION_TIMEOUT,
) -> None:
    """Set `password` on `login` (the tenant role or its alternate, made when missing) and let it log
    in (operation "rotate").

    `end_sessions` ends the sessions of `login` afterwards (a leaked password). `retire_other` takes
    the other role's login and password away in the same operation (a rotation without overlap, or
    one that ends an earlier overlap); its sessions are ended too when `end_sessions` is set.
    """
    validate_tenant_name(name)
    validate_connection_limit(connection_limit)
    other_login(name, login)  # validates `login`

    def body(conn: psycopg.Connection) -> None:
        hand_out_on(conn, name, login, password, connection_limit, end_sessions=end_sessions, retire_other=retire_other)

    run_operation(admin, OP_ROTATE, body, timeout=timeout)


def hand_out_on(
    conn: psycopg.Connection,
    name: str,
    login: str,
    password: str,
    connection_limit: int,
    *,
    end_sessions: bool = False,
    retire_other: bool = False,
) -> None:
    """`hand_out`'s statements on an open admin connection (a move gives the target the login role
    handed out on the source)."""
    other = other_login(name, login)
    if login != name:
        ensure_alternate(conn, name, connection_limit)
    conn.execute(
        sql.SQL("ALTER ROLE {} LOGIN PASSWORD {} CONNECTION LIMIT {}").format(
            sql.Identifier(login), sql.Literal(scram_verifier(password)), sql.Literal(connection_limit)
        )
    )
    if end_sessions:
        _end_sessions_of(conn, name, login)
    if retire_other:
        retire_on(conn, name, other, end_sessions=end_sessions)


def retire_login(
    admin: Admin, name: str, login: str, *, end_sessions: bool = False, timeout: float = OPERATION_TIMEOUT
) -> None:
    """NOLOGIN and no password for `login`, the role no longer handed out (operation "retire");
    its open sessions are ended only with `end_sessions`. A role that does not exist is retired."""
    validate_tenant_name(name)
    other_login(name, login)  # validates `login`

    def body(conn: psycopg.Connection) -> None:
        retire_on(conn, name, login, end_sessions=end_sessions)

    run_operation(admin, OP_RETIRE, body, timeout=timeout)


def retire_on(conn: psycopg.Connection, name: str, login: str, *, end_sessions: bool) -> None:
    """`retire_login`'s statements on an open admin connection."""
    state = read_state(conn, name)
    oid = state.role_oid if login == name else state.alternate_oid
    if oid is None:
        return
    conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN PASSWORD NULL").format(sql.Identifier(login)))
    if end_sessions:
        _end_sessions_of(conn, name, login)


def _end_sessions_of(conn: psycopg.Connection, name: str, login: str) -> None:
    state = read_state(conn, name)
    oid = state.role_oid if login == name else state.alternate_oid
    if oid is not None:
        _ensure_membership(conn, login, oid)
        _end_sessions(conn, login, oid)
