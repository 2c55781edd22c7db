"""Helpers of the shard SQL tests: endpoints, tenant specs, catalog reads as superuser (the statement
log is harness.statement_log's `StatementLog`)."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from harness import PostgresServer
from reconciler.sql.session import AdminEndpoint, connect_admin
from reconciler.sql.tenant import PROVISIONING_STEPS, TenantSpec


def admin_endpoint(
    server: PostgresServer, user: str | None = None, password: str | None = None, sslmode: str = "require"
) -> AdminEndpoint:
    """The provisioner's endpoint; TLS (the default sslmode) as in production, or a mode without it as
    an install that names the shard in shardTLS.cleartextShards allows."""
    return AdminEndpoint(
        host="127.0.0.1",
        port=server.port,
        user=user or server.PROVISIONER,
        password=password or server.provisioner_password,
        sslmode=sslmode,
        cleartext_allowed=sslmode in ("disable", "allow", "prefer"),
    )


def new_spec(connection_limit: int = 5) -> TenantSpec:
    return TenantSpec(f"t_sql_{uuid.uuid4().hex[:12]}", secrets.token_urlsafe(24), connection_limit)


def run_steps(server: PostgresServer, spec: TenantSpec, count: int) -> None:
    """Run the first `count` provisioning steps, as an attempt that crashed after step `count` would."""
    with connect_admin(admin_endpoint(server)) as conn:
        for step in PROVISIONING_STEPS[:count]:
            step(conn, spec)


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


def can_connect(server: PostgresServer, user: str, password: str, dbname: str) -> bool:
    try:
        server.connect(user, password, dbname).close()
    except psycopg.OperationalError:
        return False
    return True


@contextmanager
def as_tenant(server: PostgresServer, spec: TenantSpec, dbname: str | None = None) -> Iterator[psycopg.Connection]:
    """An autocommit session of the tenant, in its own database unless `dbname` says otherwise."""
    with server.connect(spec.name, spec.password, dbname or spec.name, autocommit=True) as conn:
        yield conn
