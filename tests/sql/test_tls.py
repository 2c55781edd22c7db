"""The admin connection's trust store and authentication, against real PostgreSQL with ssl=on."""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest

from harness import PostgresServer
from harness.postgres import shard_ca
from reconciler.sql.errors import classify
from reconciler.sql.session import connect_admin
from tests.sql.helpers import admin_endpoint


def _refusal(endpoint) -> tuple[psycopg.OperationalError, str]:
    with pytest.raises(psycopg.OperationalError) as caught:
        connect_admin(endpoint)
    return caught.value, str(classify(caught.value, "check"))


def test_verify_full_uses_the_system_trust_store_by_default(postgres: PostgresServer) -> None:
    """sslrootcert=system: the harness CA is in no system store, so the server is not trusted."""
    exc, failure = _refusal(replace(admin_endpoint(postgres), sslmode="verify-full", sslrootcert="system"))
    assert "certificate verify failed" in str(exc)  # the trust store was read, not a missing ~/.postgresql
    assert failure == "check failed: tls_failed"


def test_verify_ca_without_a_ca_bundle_says_what_to_configure(postgres: PostgresServer) -> None:
    _, failure = _refusal(replace(admin_endpoint(postgres), sslmode="verify-ca", sslrootcert="system"))
    assert failure == (
        "check failed: tls_failed (verify-ca needs the install's shardTLS.caBundle; "
        "the system trust store works with verify-full only)"
    )


@pytest.mark.parametrize("sslmode", ["require", "verify-ca", "verify-full", "disable"])
def test_scram_logins_work_in_every_mode(postgres: PostgresServer, sslmode: str) -> None:
    ca = str(shard_ca().ca_file) if sslmode.startswith("verify") else None
    endpoint = replace(admin_endpoint(postgres, sslmode=sslmode), sslrootcert=ca)
    with connect_admin(endpoint) as conn:
        (ssl,) = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
    assert ssl is (sslmode != "disable")


def test_the_bundled_libpq_supports_require_auth_and_sslrootcert_system() -> None:
    """Both arrived in libpq 16; psycopg[binary] brings its own libpq, whatever the image has."""
    assert psycopg.pq.version() >= 160000
