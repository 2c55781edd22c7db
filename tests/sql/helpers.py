"""Helpers of the shard SQL tests: endpoints, tenant specs, catalog reads as superuser, the statement log."""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from harness import PostgresServer
from harness.statement_log import LoggedStatement, parse_statement_log
from reconciler.sql.session import AdminEndpoint, connect_admin
from reconciler.sql.tenant import PROVISIONING_STEPS, TenantSpec


def admin_endpoint(
    server: PostgresServer, user: str | None = None, password: str | None = None, sslmode: str = "require"
) -> AdminEndpoint:
    """The provisioner's endpoint; TLS (the default sslmode) as in production."""
    return AdminEndpoint(
        host="127.0.0.1",
        port=server.port,
        user=user or server.PROVISIONER,
        password=password or server.provisioner_password,
        sslmode=sslmode,
    )


def new_spec(connection_limit: int = 5) -> TenantSpec:
    return TenantSpec(f"t_sql_{uuid.uuid4().hex[:12]}", secrets.token_urlsafe(24), connection_limit)


def drop_as_superuser(server: PostgresServer, *names: str) -> None:
    """Remove tenants (roles and databases of these names) whatever state a test left them in."""
    with server.superuser_connection() as conn:
        for name in names:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s OR datname = %s",
                (name, name),
            )
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def run_steps(server: PostgresServer, spec: TenantSpec, count: int) -> None:
    """Run the first `count` provisioning steps, as an attempt that crashed after step `count` would."""
    with connect_admin(admin_endpoint(server)) as conn:
        for step in PROVISIONING_STEPS[:count]:
            step(conn, spec)


def catalog_counts(server: PostgresServer, name: str) -> tuple[int, int]:
    """How many roles and databases of this name exist (read as superuser)."""
    with server.superuser_connection() as conn:
        roles = conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (name,)).fetchone()[0]
        dbs = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone()[0]
    return roles, dbs


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> object:
    """Poll until `predicate()` is truthy; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


@contextmanager
def login_role(server: PostgresServer, prefix: str, attributes: str = "LOGIN") -> Iterator[tuple[str, str]]:
    """A throwaway role created by the superuser; yields (name, password)."""
    name, password = f"{prefix}_{uuid.uuid4().hex[:10]}", secrets.token_urlsafe(18)
    with server.superuser_connection() as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} " + attributes + " PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(password)
            )
        )
    try:
        yield name, password
    finally:
        with server.superuser_connection() as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
            # Tenants a throwaway provisioner created are the test's to drop; its grants go with it.
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


class StatementLog:
    """Statements the server logged after this point (read from its log file)."""

    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        self.offset = len(server.statement_log())

    def text(self) -> str:
        return self.server.statement_log()[self.offset :]

    def statements(self, user: str | None = None) -> list[LoggedStatement]:
        return parse_statement_log(self.text(), user)


def backend_pids(server: PostgresServer, application_name: str, waiting: bool = False) -> list[int]:
    query = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
    if waiting:
        query += " AND wait_event_type = 'Lock'"
    with server.superuser_connection() as conn:
        return [row[0] for row in conn.execute(query, (application_name,))]


def terminate(server: PostgresServer, pids: list[int]) -> None:
    with server.superuser_connection() as conn:
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


def is_alive(conn: psycopg.Connection) -> bool:
    """Whether a client session still works (False once the server ended it)."""
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


def can_connect(server: PostgresServer, user: str, password: str, dbname: str) -> bool:
    try:
        server.connect(user, password, dbname).close()
    except psycopg.OperationalError:
        return False
    return True
