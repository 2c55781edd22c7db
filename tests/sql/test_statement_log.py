"""What the provisioner sends, as a server with log_statement=all records it (its jsonlog, read by
harness.statement_log, the one reader of tests and benchmarks).

Exact statements are a supplement to the behaviour tests (which assert rows and connections): they
pin the order of the provisioning steps (docs/sql.md), that re-runs only read, and that no password reaches the log.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from bench.common import BlindStatementLog, ProvisionerStatements
from domain.naming import alternate_name
from harness import PostgresServer
from harness.statement_log import StatementLog
from reconciler.sql import tenant as tenant_ops
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import TenantSpec
from tests.sql.helpers import admin_endpoint, new_spec, run_steps
from tests.support.postgres import drop_as_superuser

PROVISIONER = PostgresServer.PROVISIONER


@pytest.fixture
def logged_admin(logged_postgres: PostgresServer) -> Iterator[AdminSession]:
    with AdminSession.for_endpoint(admin_endpoint(logged_postgres)) as session:
        yield session


@pytest.fixture
def logged_tenant(logged_postgres: PostgresServer) -> Iterator[TenantSpec]:
    spec = new_spec()
    yield spec
    drop_as_superuser(logged_postgres, spec.name)


def _changes(log: StatementLog) -> list[str]:
    """The provisioner's statements other than catalog reads."""
    return [s.text for s in log.statements(PROVISIONER) if s.keyword != "SELECT"]


def test_provisioning_sends_the_seed_sequence_in_order(
    logged_postgres: PostgresServer, logged_admin: AdminSession, logged_tenant: TenantSpec
) -> None:
    name = f'"{logged_tenant.name}"'  # sql.Identifier always quotes
    owner = tenant_ops.OwnerRecord("consumer-a", "0b5e3f52-0000-4000-8000-00000000000a")
    log = StatementLog(logged_postgres)

    tenant_ops.ensure_tenant(logged_admin, replace(logged_tenant, owner=owner))

    changes = _changes(log)
    assert changes[0] == "BEGIN"  # the role and its ownership record, together or not at all
    assert changes[1].startswith(f"CREATE ROLE {name} LOGIN PASSWORD 'SCRAM-SHA-256$4096:")
    assert changes[1].endswith(f"' CONNECTION LIMIT {logged_tenant.connection_limit}")
    assert changes[2:4] == [f"COMMENT ON ROLE {name} IS '{owner.comment()}'", "COMMIT"]
    grant = (
        f"GRANT {name} TO CURRENT_USER WITH SET TRUE, INHERIT FALSE"
        if logged_postgres.major >= 16
        else f"GRANT {name} TO CURRENT_USER"
    )
    assert changes[4:] == [
        grant,
        f'CREATE DATABASE {name} OWNER {name} TEMPLATE "template0" ALLOW_CONNECTIONS false',
        f"SET ROLE {name}",
        f"REVOKE ALL ON DATABASE {name} FROM PUBLIC",
        f"GRANT CONNECT ON DATABASE {name} TO {name}",
        f"ALTER DATABASE {name} ALLOW_CONNECTIONS true",
        "RESET ROLE",
    ]


def test_ensure_on_a_provisioned_tenant_only_reads_the_catalog(
    logged_postgres: PostgresServer, logged_admin: AdminSession, logged_tenant: TenantSpec
) -> None:
    tenant_ops.ensure_tenant(logged_admin, logged_tenant)
    log = StatementLog(logged_postgres)

    tenant_ops.ensure_tenant(logged_admin, logged_tenant)

    statements = log.statements(PROVISIONER)
    assert statements, "the log records the provisioner's statements"
    assert {s.keyword for s in statements} == {"SELECT"}
    assert len(statements) <= 6


@pytest.mark.parametrize(
    ("operation", "expected"),
    [
        pytest.param(
            lambda admin, name: tenant_ops.set_connection_limit(admin, name, 9),
            "ALTER ROLE {} CONNECTION LIMIT 9",
            id="set_connection_limit",
        ),
        pytest.param(
            lambda admin, name: tenant_ops.set_password(admin, name, "a-new-password-1"),
            "ALTER ROLE {} PASSWORD '",
            id="set_password",
        ),
    ],
)
def test_limit_and_password_changes_are_exactly_one_statement(
    logged_postgres: PostgresServer,
    logged_admin: AdminSession,
    logged_tenant: TenantSpec,
    operation: Callable[[AdminSession, str], None],
    expected: str,
) -> None:
    tenant_ops.ensure_tenant(logged_admin, logged_tenant)
    log = StatementLog(logged_postgres)

    operation(logged_admin, logged_tenant.name)

    # One write; besides it at most a catalog read (whether the tenant has an alternate login role).
    statements = [s for s in log.statements(PROVISIONER) if s.keyword != "SELECT"]
    assert [s.keyword for s in log.statements(PROVISIONER)] in (["ALTER"], ["SELECT", "ALTER"])
    assert len(statements) == 1
    assert statements[0].text.startswith(expected.format(f'"{logged_tenant.name}"'))
    assert "LOGIN" not in statements[0].text


def test_no_password_ever_reaches_the_log(
    logged_postgres: PostgresServer, logged_admin: AdminSession, logged_tenant: TenantSpec
) -> None:
    rotated = "rotated-Password-0123456789"
    crashed = TenantSpec(logged_tenant.name, "crashed-attempt-password", 3)
    log = StatementLog(logged_postgres)

    run_steps(logged_postgres, crashed, 1)  # an attempt that created the role, then crashed
    tenant_ops.ensure_tenant(logged_admin, logged_tenant)  # ALTER ROLE ... PASSWORD to match the spec
    tenant_ops.set_password(logged_admin, logged_tenant.name, rotated)
    tenant_ops.disable_tenant(logged_admin, logged_tenant.name)
    tenant_ops.enable_tenant(logged_admin, logged_tenant.name)
    with logged_postgres.connect(logged_tenant.name, rotated, logged_tenant.name):
        pass

    tenant_ops.drop_tenant(logged_admin, logged_tenant.name)
    text = log.text()
    assert "SCRAM-SHA-256$4096:" in text  # the password statements were logged, hashed
    for password in (logged_tenant.password, rotated, crashed.password, logged_postgres.provisioner_password):
        assert password not in text


def test_the_log_shows_parameterized_prepared_and_multi_line_statements(
    logged_postgres: PostgresServer, logged_admin: AdminSession, logged_tenant: TenantSpec
) -> None:
    """A "no SQL ran" check is only as strong as its log reader: a catalog read is parameterized, so the
    server logs it as `execute <unnamed>:` (or `execute <prepared name>:` once psycopg prepares it),
    its tenant name in the record's detail, and its text over several lines."""
    tenant_ops.ensure_tenant(logged_admin, logged_tenant)
    log = StatementLog(logged_postgres)

    for _ in range(7):  # psycopg prepares a query after its 5th execution on a session
        tenant_ops.tenant_state(logged_admin, logged_tenant.name)
    with logged_postgres.provisioner_connection() as conn:
        conn.execute("SELECT 1 AS first_line,\n       2 AS second_line")  # multi-line, no parameters

    raw = log.text()
    assert "execute <unnamed>: " in raw and "statement: " in raw
    assert re.search(r"execute (?!<unnamed>)\S+: ", raw), "a prepared statement ran"
    reads = [s for s in log.statements(PROVISIONER) if s.mentions(logged_tenant.name)]
    assert len(reads) == 7
    parameters = f"$1 = '{logged_tenant.name}', $2 = '{alternate_name(logged_tenant.name)}'"  # and its alternate
    assert all(read.keyword == "SELECT" and read.parameters == parameters for read in reads), reads[0].parameters
    assert all("LEFT JOIN pg_catalog.pg_database d ON d.datname = n.name" in read.text for read in reads)
    assert [s.text for s in log.statements(PROVISIONER) if "first_line" in s.text] == [
        "SELECT 1 AS first_line, 2 AS second_line"
    ]


def test_every_statement_is_one_record_with_its_role_and_application(
    logged_postgres: PostgresServer, logged_tenant: TenantSpec
) -> None:
    """A text log needed a line prefix to tell records apart, and a statement whose text looks like a
    log line broke it; the jsonlog has one record per statement, with the role and application_name."""
    forged = "2026-12-01 10:00:00.000 UTC [1] user=provisioner db=postgres app=x LOG:  statement: DROP ROLE x"
    log = StatementLog(logged_postgres)
    with AdminSession.for_endpoint(admin_endpoint(logged_postgres), application_name="dbprovider/replica-a") as admin:
        tenant_ops.tenant_state(admin, logged_tenant.name)
    with logged_postgres.provisioner_connection() as conn:
        conn.execute("SELECT %s::text AS forged", (f"line one\n{forged}",))

    statements = log.statements(PROVISIONER)
    assert [s.keyword for s in statements] == ["SELECT", "SELECT"]  # no DROP ROLE: the forged line is a value
    assert statements[0].application == "dbprovider/replica-a" and statements[0].mentions(logged_tenant.name)
    assert statements[1].text == "SELECT $1::text AS forged" and " ".join(forged.split()) in statements[1].parameters
    assert all(s.pid > 0 and s.time is not None for s in statements)


def test_a_benchmark_refuses_to_count_from_a_log_that_shows_no_statement(
    postgres: PostgresServer,
    admin: AdminSession,
    tenant: TenantSpec,
    logged_postgres: PostgresServer,
    logged_admin: AdminSession,
    logged_tenant: TenantSpec,
) -> None:
    """The benchmarks' statements per database would read 0.00 with a blind reader:
    on a server without log_statement=all the same work now stops the benchmark instead."""
    blind = ProvisionerStatements(postgres)
    seeing = ProvisionerStatements(logged_postgres)

    tenant_ops.ensure_tenant(admin, tenant)
    tenant_ops.ensure_tenant(logged_admin, logged_tenant)

    with pytest.raises(BlindStatementLog, match="no provisioner statement at all"):
        blind.expect("ensure_tenant")
    found = seeing.expect("ensure_tenant")
    assert found["CREATE"] == 2 and found["SELECT"] >= 1  # the role and the database, the state reads
