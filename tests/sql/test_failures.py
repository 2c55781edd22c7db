"""Failures: sanitized classes, the bound on every operation, and retries after a connection loss."""

from __future__ import annotations

import base64
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace

import psutil
import psycopg
import pytest
from psycopg import sql

from harness import PostgresServer
from harness.process import free_port
from reconciler.sql.deadlines import DEADLINES
from reconciler.sql.errors import SqlFailure, classify, is_auth_failure
from reconciler.sql.session import AdminEndpoint, AdminSession, connect_admin
from reconciler.sql.tenant import (
    TenantSpec,
    ensure_tenant,
    scram_verifier,
    set_connection_limit,
    tenant_state,
)
from tests.sql.helpers import (
    admin_endpoint,
    backend_pids,
    run_steps,
    terminate,
)
from tests.support.common import wait_for
from tests.support.postgres import catalog_counts, login_role

# -- classification of real driver errors -------------------------------------------------------


def _wrong_password(server: PostgresServer) -> None:
    connect_admin(admin_endpoint(server, password="not-the-password"))


def _unknown_role(server: PostgresServer) -> None:
    connect_admin(admin_endpoint(server, user="nobody_here", password="x"))


def _nologin_role(server: PostgresServer) -> None:
    with login_role(server, "nologin", "NOLOGIN") as (user, password):
        connect_admin(admin_endpoint(server, user, password))


def _nothing_listening(server: PostgresServer) -> None:
    connect_admin(AdminEndpoint("127.0.0.1", free_port(), "provisioner", "x"))


def _missing_database(server: PostgresServer) -> None:
    connect_admin(replace(admin_endpoint(server), dbname="no_such_db"))


def _statement_timeout(server: PostgresServer) -> None:
    with connect_admin(admin_endpoint(server), statement_timeout="50ms") as conn:
        conn.execute("SELECT pg_sleep(5)")


def _lock_timeout(server: PostgresServer) -> None:
    with server.superuser_connection() as holder, connect_admin(admin_endpoint(server), lock_timeout="50ms") as conn:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE pg_catalog.pg_database IN ACCESS EXCLUSIVE MODE")
        try:
            conn.execute("SELECT count(*) FROM pg_catalog.pg_database")
        finally:
            holder.execute("ROLLBACK")


def _insufficient_privilege(server: PostgresServer) -> None:
    with connect_admin(admin_endpoint(server)) as conn:
        conn.execute("ALTER ROLE postgres NOLOGIN")


def _terminated(server: PostgresServer) -> None:
    with connect_admin(admin_endpoint(server), application_name="sqltest-terminated") as conn:
        terminate(server, backend_pids(server, "sqltest-terminated"))
        conn.execute("SELECT 1")


def _closed(server: PostgresServer) -> None:
    conn = connect_admin(admin_endpoint(server))
    conn.close()
    conn.execute("SELECT 1")


CAUSES: list[tuple[Callable[[PostgresServer], None], str, bool]] = [
    (_wrong_password, "auth_failed", True),
    (_unknown_role, "auth_failed", True),
    (_nologin_role, "auth_failed", True),
    (_nothing_listening, "unreachable", True),
    (_missing_database, "not_found", False),
    (_statement_timeout, "timeout", True),
    (_lock_timeout, "lock_timeout", True),
    (_insufficient_privilege, "insufficient_privilege", False),
    (_terminated, "connection_lost", True),
    (_closed, "connection_lost", True),
]


@pytest.mark.parametrize(("cause", "error_class", "retryable"), CAUSES, ids=[c[0].__name__[1:] for c in CAUSES])
def test_driver_errors_are_classified_without_driver_text(
    postgres: PostgresServer, cause: Callable[[PostgresServer], None], error_class: str, retryable: bool
) -> None:
    with pytest.raises(psycopg.Error) as raised:
        cause(postgres)

    failure = classify(raised.value, "create")

    assert (failure.error_class, failure.retryable) == (error_class, retryable)
    assert str(failure) == f"create failed: {error_class}"
    assert is_auth_failure(raised.value) is (error_class == "auth_failed")
    assert is_auth_failure(failure) is (error_class == "auth_failed")
    for leaked in ("FATAL", "ERROR", "127.0.0.1", postgres.provisioner_password, "not-the-password"):
        assert leaked not in str(failure) and leaked not in repr(failure)


class TestOperationsFailSanitized:
    def test_wrong_admin_password_is_auth_failed_and_not_retried(
        self, postgres: PostgresServer, tenant: TenantSpec
    ) -> None:
        attempts = []

        def connect(timeout: float) -> psycopg.Connection:
            attempts.append(timeout)
            return connect_admin(admin_endpoint(postgres, password="wrong"), connect_timeout=timeout)

        with pytest.raises(SqlFailure) as failure:
            ensure_tenant(AdminSession(connect), tenant)

        assert str(failure.value) == "create failed: auth_failed"
        assert is_auth_failure(failure.value)
        assert len(attempts) == 1
        # Raised outside the driver's exception: no driver text hangs off it.
        assert failure.value.__cause__ is None and failure.value.__context__ is None

    def test_an_unreachable_shard_is_retried_within_the_bound(self, tenant: TenantSpec) -> None:
        session = AdminSession.for_endpoint(AdminEndpoint("127.0.0.1", free_port(), "provisioner", "x"))
        started = time.monotonic()
        with pytest.raises(SqlFailure) as failure:
            ensure_tenant(session, tenant, timeout=1.5)
        assert str(failure.value) == "create failed: unreachable" and failure.value.retryable
        assert time.monotonic() - started < 1.5

    def test_a_lock_held_elsewhere_is_lock_timeout(
        self, postgres: PostgresServer, endpoint: AdminEndpoint, tenant: TenantSpec
    ) -> None:
        run_steps(postgres, tenant, 4)
        with postgres.superuser_connection() as holder:
            holder.execute("BEGIN")
            holder.execute(sql.SQL("ALTER ROLE {} CONNECTION LIMIT 2").format(sql.Identifier(tenant.name)))
            try:
                with AdminSession.for_endpoint(endpoint, lock_timeout="100ms") as session:
                    with pytest.raises(SqlFailure) as failure:
                        set_connection_limit(session, tenant.name, 9)
            finally:
                holder.execute("ROLLBACK")
        assert str(failure.value) == "set limit failed: lock_timeout"


# -- the bound: a hung shard ---------------------------------------------------------------------


@contextmanager
def stopped(server: PostgresServer) -> Iterator[None]:
    """Freeze the server: TCP still connects (the kernel accepts), but no process answers.

    Every PostgreSQL child calls setsid(), so stopping the postmaster's process group alone would
    leave open sessions working: stop the postmaster first (no new children), then each child.
    """
    assert server._proc is not None
    postmaster = psutil.Process(server._proc.pid)
    os.killpg(os.getpgid(postmaster.pid), signal.SIGSTOP)
    children = postmaster.children(recursive=True)
    try:
        for child in children:
            os.killpg(os.getpgid(child.pid), signal.SIGSTOP)
        yield
    finally:
        for child in children:
            try:
                os.killpg(os.getpgid(child.pid), signal.SIGCONT)
            except ProcessLookupError:
                pass
        os.killpg(os.getpgid(postmaster.pid), signal.SIGCONT)


@pytest.mark.parametrize("session_open", [True, False], ids=["open-session", "new-session"])
def test_a_hung_shard_surfaces_as_timeout_within_the_bound(
    postgres: PostgresServer, endpoint: AdminEndpoint, tenant: TenantSpec, session_open: bool
) -> None:
    bound = 1.5
    with AdminSession.for_endpoint(endpoint) as session:
        if session_open:
            session.connection()
        with stopped(postgres):
            started = time.monotonic()
            with pytest.raises(SqlFailure) as failure:
                ensure_tenant(session, tenant, timeout=bound)
            elapsed = time.monotonic() - started

        assert str(failure.value) == "create failed: timeout" and failure.value.retryable
        # The cut or timed-out connection is closed at once (else its backend would linger).
        assert not _connections_to(postgres)
        # A new connection attempt cannot be bounded below libpq's minimum connect_timeout (2 s).
        assert elapsed < max(bound, 2.0) + 1.0
        # Once the shard answers again, the same session recovers (it opens a new connection).
        ensure_tenant(session, tenant)
        assert tenant_state(session, tenant.name).provisioned


def _connections_to(server: PostgresServer) -> list[object]:
    return [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port == server.port]


# -- connection loss inside an operation ---------------------------------------------------------


def _hold_role_row(su: psycopg.Connection, name: str) -> None:
    su.execute(sql.SQL("ALTER ROLE {} CONNECTION LIMIT 2").format(sql.Identifier(name)))


def _hold_pg_database(su: psycopg.Connection, name: str) -> None:
    su.execute("LOCK TABLE pg_catalog.pg_database IN SHARE MODE")


# (steps already done, what the superuser's open transaction holds so the operation blocks there)
KILL_POINTS = {
    "while-adopting-the-role": (1, _hold_role_row),  # ALTER ROLE ... PASSWORD waits for the row
    "while-creating-the-database": (2, _hold_pg_database),  # CREATE DATABASE waits for pg_database
    "while-opening-the-database": (3, _hold_pg_database),  # REVOKE (under SET ROLE) waits likewise
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_session_killed_mid_operation_is_replaced_and_the_operation_converges(
    postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec, point: str
) -> None:
    done, hold = KILL_POINTS[point]
    run_steps(postgres, tenant, done)
    app = admin_application_name(admin)
    with postgres.superuser_connection() as su, ThreadPoolExecutor(1) as pool:
        su.execute("BEGIN")
        hold(su, tenant.name)
        running = pool.submit(ensure_tenant, admin, tenant)
        blocked = wait_for(lambda: backend_pids(postgres, app, waiting=True))
        terminate(postgres, blocked)  # as a failover would: the session dies mid-statement
        su.execute("ROLLBACK")
        running.result(timeout=30)

    assert admin.connects == 2
    assert tenant_state(admin, tenant.name).provisioned
    assert catalog_counts(postgres, tenant.name) == (1, 1)


def test_an_idle_session_lost_between_operations_is_replaced(
    postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
) -> None:
    ensure_tenant(admin, tenant)
    terminate(postgres, backend_pids(postgres, admin_application_name(admin)))

    set_connection_limit(admin, tenant.name, 4)

    assert admin.connects == 2
    assert tenant_state(admin, tenant.name).connection_limit == 4


def test_a_plain_connection_is_not_reopened(postgres: PostgresServer, tenant: TenantSpec) -> None:
    with connect_admin(admin_endpoint(postgres), application_name="sqltest-plain") as conn:
        terminate(postgres, backend_pids(postgres, "sqltest-plain"))
        with pytest.raises(SqlFailure) as failure:
            ensure_tenant(conn, tenant)
    assert str(failure.value) == "create failed: connection_lost" and failure.value.retryable


def admin_application_name(admin: AdminSession) -> str:
    return admin.connection().info.parameter_status("application_name")


# -- what never shows ---------------------------------------------------------------------------


def test_reprs_hide_passwords(postgres: PostgresServer, tenant: TenantSpec) -> None:
    endpoint = admin_endpoint(postgres)
    assert postgres.provisioner_password not in repr(endpoint)
    assert tenant.password not in repr(tenant)


def test_scram_verifier_is_what_postgres_computes_itself(postgres: PostgresServer) -> None:
    password = "Correct horse battery staple 9!"
    with login_role(postgres, "scram", "LOGIN") as (user, _):
        with postgres.superuser_connection() as su:
            su.execute("SET password_encryption = 'scram-sha-256'")
            su.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(user), sql.Literal(password)))
            stored = su.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (user,)).fetchone()[0]
    iterations, rest = stored.removeprefix("SCRAM-SHA-256$").split(":", 1)
    salt = base64.b64decode(rest.split("$", 1)[0])

    assert scram_verifier(password, salt=salt, iterations=int(iterations)) == stored


def test_the_bound_does_not_outlive_the_operation(admin: AdminSession, tenant: TenantSpec) -> None:
    """After a quick operation its watchdog is disarmed: it never cuts the session later."""
    pending = DEADLINES.pending()
    tenant_state(admin, tenant.name, timeout=0.3)
    conn = admin.connection()
    # Its cut was a deadline of the process' deadline thread; the operation's end cancelled it.
    assert DEADLINES.pending() == pending
    assert conn.execute("SELECT 1").fetchone() == (1,)
    assert admin.connection() is conn
