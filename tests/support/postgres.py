"""Real PostgreSQL for the suites: the servers of a run, and superuser helpers for test set-up and clean-up.

DBPROVIDER_PG_FLAVORS (default "18,16,15") selects the PostgreSQL majors the `postgres` fixture
runs over.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql

from domain.naming import alternate_name
from harness import POSTGRES_FLAVORS, PostgresServer

PG_FLAVORS = [f.strip() for f in os.environ.get("DBPROVIDER_PG_FLAVORS", "18,16,15").split(",") if f.strip()]


def client_tools_root(root: Path, *majors: str) -> Path:
    """`root` laid out as the image lays out its client tools (`<major>/bin/pg_dump`, ...), one
    directory per major of `majors` made of the harness's build of that major; for DBPROVIDER_PG_TOOLS."""
    for major in majors:
        (root / major).mkdir(parents=True, exist_ok=True)
        (root / major / "bin").symlink_to(POSTGRES_FLAVORS[major].locate())
    return root


class PostgresPool:
    """Starts each PostgreSQL flavor at most once per run and stops them all at the end.

    With `log_statements`, its servers log every statement (log_statement=all), for tests that
    prove which SQL ran, or that none did; `settings` are more server settings (e.g. wal_level).
    """

    def __init__(self, log_statements: bool = False, settings: dict[str, str] | None = None) -> None:
        self.log_statements = log_statements
        self.settings = dict(settings or {})
        self._servers: dict[str, PostgresServer] = {}

    def get(self, flavor: str) -> PostgresServer:
        if flavor not in self._servers:
            server = PostgresServer(flavor, log_statements=self.log_statements, settings=self.settings)
            self._servers[flavor] = server.start()
        return self._servers[flavor]

    def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()


def drop_as_superuser(server: PostgresServer, *names: str) -> None:
    """Remove tenants (roles and databases of these names, and their alternate login roles) whatever
    state a test left them in."""
    with server.superuser_connection() as conn:
        for name in names:
            alternate = alternate_name(name)
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (alternate,))
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s OR datname = %s",
                (name, name),
            )
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(alternate)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@contextmanager
def login_role(server: PostgresServer, prefix: str, attributes: str = "LOGIN") -> Iterator[tuple[str, str]]:
    """A throwaway role created by the superuser, with CONNECT on `postgres` as the shard preparation
    leaves it to admin and monitoring roles; yields (name, password)."""
    name, password = f"{prefix}_{uuid.uuid4().hex[:10]}", secrets.token_urlsafe(18)
    with server.superuser_connection() as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} " + attributes + " PASSWORD {}").format(sql.Identifier(name), sql.Literal(password))
        )
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE postgres TO {}").format(sql.Identifier(name)))
    try:
        yield name, password
    finally:
        with server.superuser_connection() as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
            # Tenants a throwaway provisioner created are the test's to drop; its grants go with it.
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def role_comment(server: PostgresServer, role: str) -> str | None:
    """The comment on `role` (a tenant's ownership record), None without one or without the role."""
    rows = server.query("SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = %s", (role,))
    return rows[0][0] if rows else None


def catalog_counts(server: PostgresServer, name: str) -> tuple[int, int]:
    """How many roles and databases of this name exist (read as superuser)."""
    with server.superuser_connection() as conn:
        roles = conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (name,)).fetchone()[0]
        dbs = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone()[0]
    return roles, dbs


def tenant_exists(server: PostgresServer, name: str) -> tuple[bool, bool]:
    """(role exists, database exists) as the superuser sees it."""
    roles, dbs = catalog_counts(server, name)
    return bool(roles), bool(dbs)


def is_alive(conn: psycopg.Connection) -> bool:
    """Whether a client session still works (False once the server ended it)."""
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True
