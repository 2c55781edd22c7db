"""The PostgreSQL servers are real, of the right major, and the provisioner is what a shard's admin role must be."""

from __future__ import annotations

import socket

import psycopg
import pytest
from psycopg import errors, sql

from harness import PostgresServer


def test_reports_its_major_version(postgres: PostgresServer) -> None:
    [(version_num,)] = postgres.query("SHOW server_version_num", as_=postgres.PROVISIONER)
    assert int(version_num) // 10000 == postgres.major


def test_provisioner_has_exactly_the_seed_attributes(postgres: PostgresServer) -> None:
    [(superuser, login, createdb, createrole, inherit, replication, bypassrls)] = postgres.query(
        "SELECT rolsuper, rolcanlogin, rolcreatedb, rolcreaterole, rolinherit, rolreplication, rolbypassrls"
        " FROM pg_roles WHERE rolname = current_user",
        as_=postgres.PROVISIONER,
    )
    assert (superuser, login, createdb, createrole, replication, bypassrls) == (False, True, True, True, False, False)
    # Before 16 the pre-16 dialect needs a NOINHERIT provisioner (design.md).
    assert inherit is (postgres.major >= 16)


def test_password_authentication_over_tcp(postgres: PostgresServer) -> None:
    with pytest.raises(psycopg.OperationalError) as failure:
        postgres.connect(postgres.PROVISIONER, "wrong-password")
    assert "password authentication failed" in str(failure.value)
    with postgres.connect(postgres.PROVISIONER, postgres.provisioner_password) as conn:
        assert conn.execute("SELECT inet_server_addr()::text").fetchone()[0].startswith("127.0.0.1")


def test_provisioner_cannot_read_another_roles_database(postgres: PostgresServer) -> None:
    owner, dbname = f"harness_owner_{postgres.major}", f"harness_private_{postgres.major}"
    with postgres.superuser_connection() as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(dbname)))
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(owner)))
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(owner)))
        admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(dbname), sql.Identifier(owner)))
    with postgres.superuser_connection(dbname) as admin:
        admin.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(owner)))
        admin.execute("CREATE TABLE secret_rows (v text)")
        admin.execute("INSERT INTO secret_rows VALUES ('tenant data')")
    # With PUBLIC's default CONNECT the provisioner gets in, but cannot read the owner's table...
    with postgres.provisioner_connection(dbname) as conn:
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("SELECT v FROM secret_rows")
    # ...and once CONNECT is revoked from PUBLIC it cannot even connect.
    with postgres.superuser_connection() as admin:
        admin.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(sql.Identifier(dbname)))
    with pytest.raises(psycopg.OperationalError) as failure:
        postgres.provisioner_connection(dbname)
    assert "permission denied" in str(failure.value)
    # Not a superuser: it can neither grant itself the owner's role nor drop the database... on 16+.
    with postgres.provisioner_connection() as conn:
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(dbname)))


@pytest.mark.server  # starts servers of its own
def test_close_leaves_nothing_behind() -> None:
    server = PostgresServer("15").start()
    port, workdir, proc = server.port, server.workdir, server._proc
    server.close()
    assert proc is not None and proc.poll() is not None
    assert not workdir.exists()
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.server  # starts servers of its own
def test_a_crashed_server_restarts_on_its_data_and_accepts_sessions_when_start_returns() -> None:
    """start()/restart() return only once a session opens (not when the port listens): crash
    recovery refuses logins with "the database system is starting up" for a while."""
    server = PostgresServer("18", durable=True).start()
    try:
        port = server.port
        with server.provisioner_connection() as conn:
            conn.execute("CREATE DATABASE survives")
        server.crash()
        assert server.pid is None
        server.restart()
        assert server.port == port and server.pid is not None
        names = server.query("SELECT datname FROM pg_database", as_=server.PROVISIONER)  # at once: no retry loop
        assert ("survives",) in names
    finally:
        server.close()


@pytest.mark.server  # starts servers of its own
def test_only_a_durable_server_may_be_killed_and_it_commits_durably() -> None:
    """synchronous_commit=off (fast) would lose acknowledged commits to a kill: killing such a
    server is refused, and a durable one (what every killing suite starts) commits synchronously."""
    with PostgresServer("18") as fast:
        assert fast.query("SHOW synchronous_commit") == [("off",)]
        for kill in (fast.kill, fast.crash):
            with pytest.raises(RuntimeError, match="durable=True"):
                kill()
        assert fast.pid is not None  # refused before any signal
    with PostgresServer("18", durable=True) as durable:
        with durable.superuser_connection() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
            conn.execute("CREATE TABLE acknowledged (v int)")
            conn.execute("INSERT INTO acknowledged VALUES (1)")
        durable.crash()
        durable.restart()
        with durable.superuser_connection() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"  # a restart keeps it
            assert conn.execute("SELECT v FROM acknowledged").fetchall() == [(1,)]
    with pytest.raises(ValueError, match="synchronous_commit=on"):
        PostgresServer("18", settings={"synchronous_commit": "off"}, durable=True)


def test_the_server_is_prepared_as_docs_sql_md_asks(postgres: PostgresServer) -> None:
    """PUBLIC may not connect to postgres and template1; the provisioner keeps postgres, its admin database."""
    rows = postgres.query(
        "SELECT datname, has_database_privilege('public', oid, 'CONNECT'),"
        " has_database_privilege('provisioner', oid, 'CONNECT')"
        " FROM pg_database WHERE datname IN ('postgres', 'template1') ORDER BY 1"
    )
    assert rows == [("postgres", False, True), ("template1", False, False)]
    assert postgres.query("SELECT current_database()", as_=postgres.PROVISIONER) == [("postgres",)]
