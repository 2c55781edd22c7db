"""Acting as a tenant role on an admin session: SET ROLE to it, and ending its sessions.

The provisioner holds SET (never INHERIT) on every tenant role it created, so it can run the
statements only an owner or a grantor may run (`as_role`), and end that tenant's own sessions
(signalling a backend needs the privileges of its role). It cannot SET ROLE to a role it did not
create: `may_set_role` says which roles it may act as, before anything is tried.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from reconciler.sql.provisioner import SET_OPTION_MAJOR

TERMINATE_WAIT_MS = 5000  # pg_terminate_backend(pid, timeout) waits for the backend to exit (14+)


@contextmanager
def as_role(conn: psycopg.Connection, name: str) -> Iterator[None]:
    """Run owner-only statements as the tenant role (needs SET on it), then return to ourselves."""
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(name)))
    try:
        yield
    finally:
        # In a failed transaction the rollback undoes the SET ROLE (and RESET would fail, hiding the error).
        if not conn.broken and not conn.closed and conn.info.transaction_status != TransactionStatus.INERROR:
            conn.execute("RESET ROLE")


def may_set_role(conn: psycopg.Connection, role_oid: int) -> bool:
    """Whether this session's user may SET ROLE to the role: true for the tenant roles it created.

    From 16 on membership carries its own SET option; before 16 every membership allows SET ROLE.
    CREATEROLE alone never does (before 16 it could grant itself any role; the provider never does).
    """
    option = "SET" if conn.info.server_version >= SET_OPTION_MAJOR * 10000 else "MEMBER"
    row = conn.execute(
        "SELECT pg_catalog.pg_has_role(session_user, %(role)s::oid, %(option)s)", {"role": role_oid, "option": option}
    ).fetchone()
    return row is not None and bool(row[0])


def has_sessions(conn: psycopg.Connection, role_oid: int) -> bool:
    """Whether the role has a session on the server (other than this one)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity"
        " WHERE usesysid = %(role)s AND pid <> pg_catalog.pg_backend_pid())",
        {"role": role_oid},
    ).fetchone()
    return row is not None and bool(row[0])


def terminate_sessions(conn: psycopg.Connection, role_oid: int) -> None:
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


def end_sessions(conn: psycopg.Connection, name: str, role_oid: int) -> None:
    """End every session of the tenant, as the tenant (the only way the provisioner may)."""
    if has_sessions(conn, role_oid):
        with as_role(conn, name):
            terminate_sessions(conn, role_oid)


_TERMINATE_AND_WAIT = """
SELECT pg_catalog.pg_terminate_backend(pid, %(wait)s::bigint) FROM pg_catalog.pg_stat_activity
 WHERE usesysid = %(role)s AND pid <> pg_catalog.pg_backend_pid()
"""
_TERMINATE = """
SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
 WHERE usesysid = %(role)s AND pid <> pg_catalog.pg_backend_pid()
"""
