"""SCRAM keys for fresh logins (reconciler.sql.scram_keys), against the real servers (18, 16, 15).

The salt read from the first steps of a login gives the keys of the stored verifier; logins with the
keys work in every sslmode; keys the server no longer accepts (a new salt, a new password) cost one
more login with the password and are replaced; reading the salt leaves nothing in the server log.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from dataclasses import replace

import psycopg
import pytest
from psycopg import sql

from harness import PostgresServer
from harness.postgres import shard_ca
from harness.statement_log import parse_records
from reconciler.sql import scram_keys, tenant_login
from reconciler.sql.errors import SqlFailure, classify
from reconciler.sql.scram_keys import SaltSource, SaltUnavailable, ScramKeys, read_salt
from reconciler.sql.session import (
    ADMIN_KEYS,
    AdminEndpoint,
    AdminSession,
    admin_keys_key,
    connect_admin,
    run_operation,
)
from reconciler.sql.tenant import TenantSpec, ensure_tenant
from reconciler.sql.tenant_login import TenantLogin, log_in, remember_login
from tests.sql.helpers import admin_endpoint
from tests.support.postgres import login_role

pytestmark = pytest.mark.skipif(not scram_keys.SUPPORTED, reason="libpq < 18 takes no SCRAM keys")


def _stored(server: PostgresServer, role: str) -> str:
    [(stored,)] = server.query("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role,))
    return str(stored)


def _endpoint(server: PostgresServer, user: str, password: str, sslmode: str = "require") -> AdminEndpoint:
    ca = str(shard_ca().ca_file) if sslmode.startswith("verify") else None
    return replace(admin_endpoint(server, user, password, sslmode=sslmode), sslrootcert=ca)


def _source(endpoint: AdminEndpoint) -> SaltSource:
    return SaltSource(
        endpoint.host, endpoint.port, endpoint.user, endpoint.dbname, endpoint.sslmode, endpoint.sslrootcert
    )


def _used_keys(conn: psycopg.Connection) -> bool:
    return "scram_client_key" in conn.info.get_parameters()


@pytest.fixture
def role(postgres: PostgresServer) -> Iterator[tuple[str, str]]:
    with login_role(postgres, "scramkeys") as created:
        yield created


def _set_password(server: PostgresServer, role: str, password: str, iterations: int = 4096) -> int:
    """Set `role`'s password as the server computes verifiers; the iteration count used (before 16
    there is no scram_iterations: always 4096)."""
    with server.superuser_connection() as conn:
        if server.major >= 16:
            conn.execute(sql.SQL("SET scram_iterations = {}").format(sql.Literal(iterations)))
        else:
            iterations = 4096
        conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
    return iterations


@pytest.mark.parametrize("sslmode", ["require", "verify-ca", "verify-full", "disable", "prefer"])
def test_the_salt_read_gives_the_keys_of_the_stored_verifier(
    postgres: PostgresServer, role: tuple[str, str], sslmode: str
) -> None:
    user, password = role
    expected = _set_password(postgres, user, password, iterations=1234)  # the server's count, not a default
    endpoint = _endpoint(postgres, user, password, sslmode)

    salt, iterations = read_salt(_source(endpoint), timeout=10)

    assert iterations == expected
    assert ScramKeys.derive(password, salt, iterations).verifier() == _stored(postgres, user)


def test_reading_the_salt_leaves_nothing_in_the_server_log(postgres: PostgresServer, role: tuple[str, str]) -> None:
    """The exchange hangs up before answering the server's challenge, after a TLS close_notify: the
    server ends that backend silently, as for pg_isready (no FATAL, no SSL or receive error)."""
    user, password = role
    postgres.mark_log()
    before = len(parse_records(postgres.statement_log()))
    for sslmode in ("require", "verify-full", "disable"):
        read_salt(_source(_endpoint(postgres, user, password, sslmode)), timeout=10)

    records = parse_records(postgres.statement_log())[before:]

    assert [(r.severity, r.message) for r in records if r.severity not in ("LOG", "DEBUG") or user in r.message] == []
    assert not [r.message for r in records if "SSL" in r.message or "could not" in r.message]


def test_a_server_that_fails_verification_gives_no_salt(postgres: PostgresServer, role: tuple[str, str]) -> None:
    """The same verification as the login's: the harness CA is in no system trust store."""
    user, password = role
    endpoint = replace(_endpoint(postgres, user, password, "verify-full"), sslrootcert="system")
    with pytest.raises(SaltUnavailable):
        read_salt(_source(endpoint), timeout=10)


def test_admin_logins_after_the_first_use_the_keys(postgres: PostgresServer, role: tuple[str, str]) -> None:
    user, password = role
    endpoint = _endpoint(postgres, user, password)

    with connect_admin(endpoint) as first:
        assert not _used_keys(first)  # the first login uses the password, then reads the salt
    with connect_admin(endpoint) as second:
        (who,) = second.execute("SELECT current_user").fetchone()
        assert _used_keys(second)
    assert who == user


@pytest.mark.parametrize("sslmode", ["require", "verify-ca", "verify-full", "disable"])
def test_logins_with_keys_work_in_every_mode(postgres: PostgresServer, role: tuple[str, str], sslmode: str) -> None:
    user, password = role
    endpoint = _endpoint(postgres, user, password, sslmode)
    connect_admin(endpoint).close()
    with connect_admin(endpoint) as conn:
        (ssl,) = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
        assert _used_keys(conn)
    assert ssl is (sslmode != "disable")


def test_a_new_salt_on_the_server_falls_back_to_the_password_and_then_works(
    postgres: PostgresServer, role: tuple[str, str]
) -> None:
    """The password set again (a new salt): the cached keys are refused, the login goes on with the
    password, and the next login has keys of the new salt."""
    user, password = role
    endpoint = _endpoint(postgres, user, password)
    connect_admin(endpoint).close()
    old = ADMIN_KEYS.get(admin_keys_key(endpoint) or "")
    assert old is not None
    _set_password(postgres, user, password)

    with connect_admin(endpoint) as conn:
        conn.execute("SELECT 1")
        assert not _used_keys(conn)
    with connect_admin(endpoint) as conn:
        assert _used_keys(conn)

    new = ADMIN_KEYS.get(admin_keys_key(endpoint) or "")
    assert new is not None and new.salt != old.salt
    assert new.verifier() == _stored(postgres, user)


def test_a_rotated_password_fails_as_before_and_the_new_one_works(
    postgres: PostgresServer, role: tuple[str, str]
) -> None:
    user, password = role
    endpoint = _endpoint(postgres, user, password)
    connect_admin(endpoint).close()
    connect_admin(endpoint).close()  # keys cached and used
    _set_password(postgres, user, password + "-rotated")

    with pytest.raises(psycopg.OperationalError) as caught:
        connect_admin(endpoint)
    assert str(classify(caught.value, "check")) == "check failed: auth_failed"
    assert ADMIN_KEYS.get(admin_keys_key(endpoint) or "") is None  # refused keys are dropped

    rotated = replace(endpoint, password=password + "-rotated")
    connect_admin(rotated).close()
    with connect_admin(rotated) as conn:
        assert _used_keys(conn)


def test_keys_are_not_derived_for_a_password_saslprep_would_change(postgres: PostgresServer) -> None:
    password = "pässwörd-\u00a0x"  # non-ASCII: libpq's SASLprep maps it, so only libpq derives
    with login_role(postgres, "scramutf") as (user, _):
        _set_password(postgres, user, password)
        endpoint = _endpoint(postgres, user, password)
        for _ in range(2):
            with connect_admin(endpoint) as conn:
                assert not _used_keys(conn)
    assert admin_keys_key(endpoint) is None


def _tenant_login(server: PostgresServer, tenant: TenantSpec) -> TenantLogin:
    return TenantLogin(
        host="127.0.0.1",
        port=server.port,
        user=tenant.name,
        password=tenant.password,
        dbname=tenant.name,
        sslmode="require",
    )


def test_the_tenant_login_after_creation_uses_the_verifier_keys(
    postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
) -> None:
    """ensure_tenant remembers the keys of the verifier it sets; the login check uses them once."""
    ensure_tenant(admin, tenant)
    key = scram_keys.fingerprint(tenant.name, tenant.password)
    assert tenant_login._TENANT_KEYS.get(key) is not None

    log_in(_tenant_login(postgres, tenant), 10, "scramtest")

    assert tenant_login._TENANT_KEYS.get(key) is None  # used, then forgotten


def test_tenant_keys_the_server_refuses_cost_one_more_login(
    postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
) -> None:
    """Keys of a verifier that never reached the server (an attempt rolled back): the login works."""
    ensure_tenant(admin, tenant)
    remember_login(tenant.name, tenant.password, ScramKeys.new(tenant.password))

    log_in(_tenant_login(postgres, tenant), 10, "scramtest")

    with pytest.raises(SqlFailure) as caught:
        log_in(replace(_tenant_login(postgres, tenant), password="wrong-password"), 10, "scramtest")
    assert str(caught.value) == "login failed: auth_failed"


def test_keys_hide_in_reprs() -> None:
    keys = ScramKeys.new("secret-password")
    text = repr(keys)
    for secret in (keys.client_key, keys.server_key, keys.salt):
        assert base64.b64encode(secret).decode() not in text and secret.hex() not in text
    assert hashlib.sha256(keys.client_key).hexdigest() not in text


class _LeaseLost(Exception):
    pass


def test_a_replica_that_lost_its_lease_after_the_login_reads_no_salt(
    postgres: PostgresServer, role: tuple[str, str]
) -> None:
    """The salt read is a contact with the shard like any statement: the fence is asked first."""
    user, password = role
    endpoint = _endpoint(postgres, user, password)
    calls = []

    def fence() -> None:
        calls.append(1)
        if len(calls) > 1:  # the Lease was held for the login, lost right after it
            raise _LeaseLost()

    with AdminSession.for_endpoint(endpoint, fence=fence) as session:
        with pytest.raises(_LeaseLost):
            run_operation(session, "check", lambda conn: conn.execute("SELECT 1"))

    key = admin_keys_key(endpoint) or ""
    assert ADMIN_KEYS.get(key) is None and ADMIN_KEYS.wants(key)
