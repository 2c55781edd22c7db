"""The tenant's first login cannot be relayed unnoticed.

Bound to TLS where the endpoint offers channel binding: a relay that terminates TLS gets nothing.
Where it offers none (pgBouncer, here a relay whose own connection to the server has no TLS, so the
server offers SCRAM without channel binding), the login is unbound and the provider takes the tenant
back and looks: a relay that kept the session, set its own password, and granted the database and
future tables to another tenant is cut off, its password replaced, and what it did is found.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from psycopg import sql

from domain.naming import alternate_name
from harness import PostgresServer
from harness.certs import CertFiles, CertificateAuthority
from harness.relay import PostgresRelay
from reconciler.sql.errors import SqlFailure
from reconciler.sql.first_login import seal_first_login
from reconciler.sql.login_roles import hand_out
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import TenantSpec
from reconciler.sql.tenant_login import TenantLogin, log_in
from tests.sql.helpers import can_connect


@pytest.fixture(scope="module")
def relay_cert(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return CertificateAuthority(Path(tmp_path_factory.mktemp("relay")), "relay").issue_server("relay")


def _login(port: int, spec: TenantSpec) -> TenantLogin:
    return TenantLogin("127.0.0.1", port, spec.name, spec.password, sslmode="require", dbname=spec.name)


def _sessions_of(postgres: PostgresServer, role: str) -> int:
    [(count,)] = postgres.query("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (role,))
    return int(count)


def test_a_login_at_the_server_is_bound_to_tls(postgres: PostgresServer, provisioned: TenantSpec) -> None:
    assert log_in(_login(postgres.port, provisioned), 10, "logintest") is True


def test_a_relay_that_terminates_tls_gets_no_session(
    postgres: PostgresServer, provisioned: TenantSpec, relay_cert: CertFiles
) -> None:
    """The server offers channel binding through the relay's own TLS connection: the binding the client
    computed over the relay's certificate does not match, and nothing falls back to an unbound login."""
    with PostgresRelay(postgres.port, terminate_tls=relay_cert) as relay:
        with pytest.raises(SqlFailure) as failure:
            log_in(_login(relay.port, provisioned), 10, "logintest")

        assert failure.value.error_class == "insecure_auth_refused"
        assert relay.authenticated == 0


def test_an_endpoint_without_channel_binding_gets_an_unbound_login_and_an_empty_check(
    postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec, relay_cert: CertFiles
) -> None:
    """pgBouncer's case: TLS to the endpoint, no channel binding offered. An honest endpoint leaves nothing."""
    with PostgresRelay(postgres.port, terminate_tls=relay_cert, upstream_tls=False) as relay:
        assert log_in(_login(relay.port, provisioned), 10, "logintest") is False
        assert relay.authenticated == 1

    assert seal_first_login(admin, provisioned.name, provisioned.password) == []

    assert can_connect(postgres, provisioned.name, provisioned.password, provisioned.name)


def test_a_relay_without_channel_binding_is_cut_off_and_what_it_did_is_found(
    postgres: PostgresServer,
    admin: AdminSession,
    bystander: TenantSpec,
    provisioned: TenantSpec,
    relay_cert: CertFiles,
) -> None:
    """The relay wants another consumer's tenant (`bystander`, made first so that it is dropped last) to
    read the victim's data: CONNECT on the database, SELECT on every table the consumer will create."""
    database, other = sql.Identifier(provisioned.name), sql.Identifier(bystander.name)
    hijack = [
        sql.SQL(statement).format(d=database, o=other, me=database).as_string(None)
        for statement in (
            "GRANT CONNECT ON DATABASE {d} TO {o}",
            "ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO {o}",
            "ALTER ROLE {me} PASSWORD 'the-relay-knows-this'",
        )
    ]
    with PostgresRelay(postgres.port, terminate_tls=relay_cert, upstream_tls=False, hijack=hijack) as relay:
        assert log_in(_login(relay.port, provisioned), 10, "logintest") is False
        assert relay.authenticated == 1
        # Control: the relay keeps its session as the tenant, and its password works.
        assert _sessions_of(postgres, provisioned.name) == 1
        assert can_connect(postgres, provisioned.name, "the-relay-knows-this", provisioned.name)

        found = seal_first_login(admin, provisioned.name, provisioned.password)

        assert _sessions_of(postgres, provisioned.name) == 0
    assert found == ["3 object(s) or grant(s) in the database or of the role"]  # CONNECT; the defaults, and their grant
    assert not can_connect(postgres, provisioned.name, "the-relay-knows-this", provisioned.name)
    assert can_connect(postgres, provisioned.name, provisioned.password, provisioned.name)


def test_settings_and_a_connection_limit_a_relay_left_are_found(
    postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec
) -> None:
    """What the catalog check reads besides objects and grants (made here as the tenant, as a relay would)."""
    name = sql.Identifier(provisioned.name)
    with postgres.connect(provisioned.name, provisioned.password, provisioned.name, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER ROLE {} SET search_path = public").format(name))
        conn.execute(sql.SQL("ALTER DATABASE {} CONNECTION LIMIT 3").format(name))
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO PUBLIC").format(name))

    found = seal_first_login(admin, provisioned.name, provisioned.password)

    assert found == ["the database's privileges or its ALLOW_CONNECTIONS are not the provider's"]
    with postgres.superuser_connection() as su:
        su.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(name))
    assert seal_first_login(admin, provisioned.name, provisioned.password) == [
        "parameters set for the database or the role",
        "a connection limit on the database",
    ]


def test_a_first_login_on_the_alternate_takes_back_the_alternate(
    postgres: PostgresServer, admin: AdminSession, provisioned: TenantSpec, relay_cert: CertFiles
) -> None:
    """A tenant made again with its Secret naming the alternate login role (after a failover lost it): the
    first login is the alternate's, so the seal gives the alternate the provider's password and ends its
    sessions, and the tenant role stays without login or password."""
    name, alternate = provisioned.name, alternate_name(provisioned.name)
    hand_out(admin, name, alternate, provisioned.password, 5, retire_other=True)
    hijack = [
        "SET ROLE NONE",  # the alternate's own identity, not the tenant role its setting gives it
        sql.SQL("ALTER ROLE {} PASSWORD 'the-relay-knows-this'").format(sql.Identifier(alternate)).as_string(None),
        "RESET ROLE",  # back to the tenant role, as the login check expects
    ]
    with PostgresRelay(postgres.port, terminate_tls=relay_cert, upstream_tls=False, hijack=hijack) as relay:
        login = TenantLogin("127.0.0.1", relay.port, alternate, provisioned.password, sslmode="require", dbname=name)
        assert log_in(login, 10, "logintest") is False
        assert _sessions_of(postgres, alternate) == 1  # control: the relay keeps its session
        assert can_connect(postgres, alternate, "the-relay-knows-this", name)

        assert seal_first_login(admin, name, provisioned.password, login=alternate) == []

        assert _sessions_of(postgres, alternate) == 0
    assert not can_connect(postgres, alternate, "the-relay-knows-this", name)
    assert can_connect(postgres, alternate, provisioned.password, name)
    [(can_login, password)] = postgres.query(
        "SELECT rolcanlogin, rolpassword FROM pg_authid WHERE rolname = %s", (name,)
    )
    assert (can_login, password) == (False, None)
