"""The provisioner's login only reaches the server it belongs to, whatever a Shard says: a
relay in front of the real shard, in cleartext and over TLS; admin Secrets bound to their
endpoint. A refused Shard says why in its Ready condition and no connection is opened."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import PostgresServer
from harness.certs import CertFiles, CertificateAuthority
from harness.relay import PostgresRelay
from informers import SECRETS
from tests.reconciler.conftest import condition, install_config, wait_for_later_shard_check
from tests.support.common import b64


@pytest.fixture
def pg18(postgres_pool) -> PostgresServer:
    return postgres_pool.get("18")


@pytest.fixture
def relay(pg18: PostgresServer) -> Iterator[PostgresRelay]:
    """Copies bytes to and from the real shard."""
    with PostgresRelay(pg18.port) as running:
        yield running


@pytest.fixture(scope="module")
def attacker_cert(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return CertificateAuthority(Path(tmp_path_factory.mktemp("attacker")), "attacker").issue_server("relay")


def _a_few_more_checks(fleet, logged_pg: PostgresServer) -> None:
    """Let the Shard controller re-check every shard a couple of times (it pings each every 2 s here):
    a healthy shard on the statement-logging server is the clock."""
    fleet.wait_shard(fleet.shard(logged_pg), "Ok")
    for _ in range(2):
        wait_for_later_shard_check(logged_pg)


@pytest.mark.parametrize("sslmode", ["disable", "allow", "prefer"])
def test_a_mode_that_may_go_without_tls_is_refused_before_any_connection(
    pg18, relay, logged_pg, fleet, start_manager, sslmode
):
    name = fleet.shard(pg18, port=relay.port, sslmode=sslmode)
    start_manager()

    shard = fleet.wait_shard(name, "AdminTlsRequired")

    message = condition(shard, "Ready")["message"]
    assert f"admin.sslmode {sslmode} may log in without TLS" in message and "shardTLS.cleartextShards" in message
    assert condition(shard, "Ready")["status"] == "False"
    _a_few_more_checks(fleet, logged_pg)
    assert relay.connections == 0


def test_a_shard_named_in_cleartext_shards_logs_in_without_tls_and_a_relay_reads_it(pg18, relay, fleet, start_manager):
    """The opt-out works, and shows what it costs: the relay sees the whole login in cleartext."""
    name = fleet.shard(pg18, port=relay.port, sslmode="disable")
    start_manager(install_config(shardTLS={"cleartextShards": [name]}))

    fleet.wait_shard(name, "Ok")

    assert relay.connections >= 1
    assert b"SCRAM-SHA-256" in bytes(relay.client_bytes)


def test_tls_through_a_byte_relay_works_and_shows_it_nothing(pg18, relay, fleet, start_manager):
    name = fleet.shard(pg18, port=relay.port)  # sslmode require
    start_manager()

    fleet.wait_shard(name, "Ok")

    assert relay.connections >= 1
    assert b"SCRAM-SHA-256" not in bytes(relay.client_bytes)
    assert pg18.PROVISIONER.encode() not in bytes(relay.client_bytes)


@pytest.mark.parametrize("upstream_tls", [True, False], ids=["tls-to-shard", "cleartext-to-shard"])
def test_a_relay_terminating_tls_gets_no_session_and_the_shard_says_so(
    pg18, attacker_cert, fleet, start_manager, upstream_tls
):
    with PostgresRelay(pg18.port, terminate_tls=attacker_cert, upstream_tls=upstream_tls) as relay:
        name = fleet.shard(pg18, port=relay.port)  # sslmode require: the relay's certificate is accepted
        start_manager()

        shard = fleet.wait_shard(name, "AdminAuthFailed", "insecure_auth_refused")

        assert relay.connections >= 1
        assert relay.authenticated == 0
    message = condition(shard, "Ready")["message"]
    assert ("terminates TLS" in message) is upstream_tls
    assert pg18.provisioner_password not in str(shard)


# -- admin Secrets bound to an endpoint -------------------------------------------------------------


def _bind_secret(admin_rest, fleet, shard: str, host: str, port: int) -> None:
    """Give the shard's admin Secret the `host` and `port` keys a Percona pguser Secret has."""
    secret, namespace = fleet.admin_secret_of(shard)
    admin_rest.patch(SECRETS, secret, {"data": {"host": b64(host), "port": b64(str(port))}}, namespace)


def test_a_secret_is_sent_only_to_the_endpoint_it_names(pg18, relay, admin_rest, logged_pg, fleet, start_manager):
    own = fleet.shard(pg18)
    _bind_secret(admin_rest, fleet, own, f"{own}-primary.databases.svc.cluster.local", pg18.port)
    elsewhere = fleet.name("elsewhere")
    fleet.shard(pg18, name=elsewhere, port=relay.port, secret_ref=fleet.get_shard(own)["spec"]["admin"]["secretRef"])
    start_manager()

    fleet.wait_shard(own, "Ok")  # its Service and port are the Secret's (the cluster domain may follow)
    shard = fleet.wait_shard(elsewhere, "AdminEndpointMismatch")

    message = condition(shard, "Ready")["message"]
    assert f"may only be sent to {own}-primary.databases.svc.cluster.local:{pg18.port}" in message
    assert f"not to the Shard's {elsewhere}-primary.databases.svc:{relay.port}" in message
    _a_few_more_checks(fleet, logged_pg)
    assert relay.connections == 0


def test_the_install_can_bind_a_secret_that_names_no_endpoint(pg18, relay, logged_pg, fleet, start_manager):
    """shardSecrets[].host/port: for admin Secrets without host and port keys (not Percona's)."""
    name = fleet.shard(pg18, port=relay.port)
    secret, namespace = fleet.admin_secret_of(name)
    config = install_config()
    entries = [
        {"namespace": ref.namespace, "name": ref.name}
        | ({"host": f"{name}-primary.databases.svc", "port": pg18.port} if ref.name == secret else {})
        for ref in config.shard_secrets
    ]
    start_manager(install_config(shardSecrets=entries))

    shard = fleet.wait_shard(name, "AdminEndpointMismatch")

    assert f"may only be sent to {name}-primary.databases.svc:{pg18.port}" in condition(shard, "Ready")["message"]
    _a_few_more_checks(fleet, logged_pg)
    assert relay.connections == 0
