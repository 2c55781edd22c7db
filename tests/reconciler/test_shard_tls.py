"""The admin connection's TLS: require, verify-ca and verify-full against real PostgreSQL with ssl=on.

The harness servers' certificates come from one CA (harness.postgres.shard_ca), which the in-process
manager gets as its shard CA bundle, as shardTLS.caBundle mounts it in a pod. A CA that did not
sign the server's certificate, or a certificate for another host name, leaves the shard Unreachable
with a sanitized message.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import PostgresServer
from harness.certs import CertificateAuthority
from tests.support.common import condition

TLS_FAILED = "check failed: tls_failed"


def wait_ready(fleet, name: str, reason: str) -> dict:
    """The Ready condition, once it has `reason`."""
    return condition(fleet.wait_shard(name, reason), "Ready")


def provider_sessions_use_tls(server: PostgresServer) -> bool:
    """Whether the server sees the provider's admin sessions, and every one of them encrypted."""
    rows = server.query(
        "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)"
        " WHERE a.usename = 'provisioner' AND a.application_name LIKE 'dbprovider%'"
    )
    return bool(rows) and all(ssl for (ssl,) in rows)


@pytest.fixture(scope="module")
def other_ca() -> Iterator[Path]:
    """The CA file of a CA that signed none of the servers."""
    with tempfile.TemporaryDirectory(prefix="rectest-other-ca-") as directory:
        yield CertificateAuthority(Path(directory), "other").ca_file


@pytest.mark.parametrize("sslmode", ["require", "verify-ca", "verify-full"])
def test_tls_modes_succeed_with_the_right_ca(postgres, fleet, start_manager, sslmode):
    name = fleet.shard(postgres, sslmode=sslmode)
    start_manager()
    ready = wait_ready(fleet, name, "Ok")
    assert ready["status"] == "True"
    db = fleet.database(f"tls-{sslmode}")
    fleet.wait_phase(db, "Ready")
    # Shard checks use a fresh connection each time; the Database workers keep theirs open.
    assert provider_sessions_use_tls(postgres)


@pytest.mark.parametrize("sslmode", ["verify-ca", "verify-full"])
def test_a_wrong_ca_is_unreachable_with_a_sanitized_message(postgres, fleet, start_manager, other_ca, sslmode):
    name = fleet.shard(postgres, sslmode=sslmode)
    start_manager(shard_ca_file=str(other_ca))
    ready = wait_ready(fleet, name, "Unreachable")
    assert ready["message"] == TLS_FAILED
    # `require` encrypts without verifying: the same CA file does not stop it.
    plain = fleet.shard(postgres, sslmode="require")
    assert wait_ready(fleet, plain, "Ok")["status"] == "True"


@pytest.fixture
def misnamed_server(postgres) -> Iterator[PostgresServer]:
    """A server of the same flavor whose certificate names db.example.com only (not 127.0.0.1)."""
    flavor = str(postgres.major)
    with PostgresServer(flavor, tls_names=("db.example.com",), tls_ips=()) as server:
        yield server


def test_a_wrong_host_name_fails_verify_full_only(misnamed_server, fleet, start_manager):
    full = fleet.shard(misnamed_server, sslmode="verify-full")
    ca_only = fleet.shard(misnamed_server, sslmode="verify-ca")  # checks the CA, not the name
    start_manager()
    ready = wait_ready(fleet, full, "Unreachable")
    assert ready["message"] == TLS_FAILED
    assert wait_ready(fleet, ca_only, "Ok")["status"] == "True"
