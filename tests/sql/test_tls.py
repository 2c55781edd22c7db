"""The admin connection's trust store and authentication, against real PostgreSQL with ssl=on."""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest

from harness import PostgresServer
from harness.certs import CertFiles, CertificateAuthority
from harness.postgres import shard_ca
from harness.relay import SSL_REQUEST, PostgresRelay
from reconciler.sql.errors import classify
from reconciler.sql.session import AdminEndpoint, connect_admin
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


# -- a relay between the provider and the shard --------------------------------------------------------


@pytest.fixture(scope="module")
def relay_certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CertFiles]:
    """Certificates a relay on 127.0.0.1 presents: one from the shards' own CA (a relay that got hold
    of one), one from a CA nobody trusts."""
    foreign = CertificateAuthority(tmp_path_factory.mktemp("attacker-ca"), "attacker")
    return {"shard-ca": shard_ca().issue_server("relay-shard-ca"), "foreign-ca": foreign.issue_server("relay-foreign")}


def _login_through(relay: PostgresRelay, endpoint: AdminEndpoint) -> str | None:
    """The sanitized failure of a provider login through the relay, or None when it succeeded."""
    try:
        with connect_admin(replace(endpoint, port=relay.port)) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        return str(classify(exc, "check"))
    return None


def test_tls_passed_through_a_byte_relay_shows_it_nothing(postgres: PostgresServer) -> None:
    with PostgresRelay(postgres.port) as relay:
        assert _login_through(relay, admin_endpoint(postgres)) is None
    seen = bytes(relay.client_bytes)
    assert seen.startswith(SSL_REQUEST) and len(seen) > 200
    assert b"SCRAM-SHA-256" not in seen and postgres.PROVISIONER.encode() not in seen


def test_cleartext_through_a_byte_relay_is_readable_which_is_why_it_needs_an_opt_out(postgres: PostgresServer) -> None:
    """The control of the test above, and of the refusal: an install that allows cleartext for a shard
    lets whatever sits on the path read the login and use the session."""
    with PostgresRelay(postgres.port) as relay:
        assert _login_through(relay, admin_endpoint(postgres, sslmode="disable")) is None
    seen = bytes(relay.client_bytes)
    assert b"SCRAM-SHA-256" in seen and postgres.PROVISIONER.encode() in seen


@pytest.mark.parametrize("sslmode", ["disable", "allow", "prefer"])
def test_a_mode_that_may_go_without_tls_needs_the_opt_out(postgres: PostgresServer, sslmode: str) -> None:
    with pytest.raises(ValueError, match="may go without TLS"):
        AdminEndpoint("127.0.0.1", postgres.port, postgres.PROVISIONER, postgres.provisioner_password, sslmode)


@pytest.mark.parametrize("upstream_tls", [True, False], ids=["tls-to-server", "cleartext-to-server"])
@pytest.mark.parametrize("cert", ["shard-ca", "foreign-ca"])
@pytest.mark.parametrize("sslmode", ["require", "verify-ca", "verify-full"])
def test_a_relay_terminating_tls_never_gets_a_logged_in_session(
    postgres: PostgresServer, relay_certs: dict[str, CertFiles], sslmode: str, cert: str, upstream_tls: bool
) -> None:
    """SCRAM is bound to the provider's TLS channel: the relay's own certificate (even one the shards'
    CA signed) makes the server refuse the proof, or the provider refuses the relay."""
    endpoint = replace(
        admin_endpoint(postgres, sslmode=sslmode), sslrootcert=str(shard_ca().ca_file) if sslmode != "require" else None
    )
    refusals = postgres.statement_log().count("SCRAM channel binding check failed")
    with PostgresRelay(postgres.port, terminate_tls=relay_certs[cert], upstream_tls=upstream_tls) as relay:
        failure = _login_through(relay, endpoint)
    assert relay.connections >= 1
    assert relay.authenticated == 0
    if cert == "foreign-ca" and sslmode != "require":
        assert failure == "check failed: tls_failed"  # not even the TLS handshake
        return
    # Over TLS the server refuses the proof ("SCRAM channel binding check failed"); in cleartext it offers
    # no SCRAM-SHA-256-PLUS and the provider does not log in at all.
    assert failure is not None and failure.startswith("check failed: insecure_auth_refused")
    refused_by_server = postgres.statement_log().count("SCRAM channel binding check failed") - refusals
    assert refused_by_server == (1 if upstream_tls else 0)
    assert ("terminates TLS" in failure) is upstream_tls  # what the Shard's message tells the operator


def test_without_channel_binding_the_same_relay_gets_the_session(
    postgres: PostgresServer, relay_certs: dict[str, CertFiles]
) -> None:
    """Control: the relay above works; a client that does not insist on channel binding is taken over."""
    with PostgresRelay(postgres.port, terminate_tls=relay_certs["foreign-ca"]) as relay:
        with psycopg.connect(
            host="127.0.0.1",
            port=relay.port,
            user=postgres.PROVISIONER,
            password=postgres.provisioner_password,
            dbname="postgres",
            sslmode="require",
            channel_binding="disable",
        ) as conn:
            conn.execute("SELECT 1")
    assert relay.authenticated == 1
