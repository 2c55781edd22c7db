"""Shard admin credentials cannot be phished: only Secrets listed in shardSecrets are used, and the
provisioner's password goes only to a server that proves SCRAM.

A Shard writer controls the admin host, port, sslmode and Secret reference. The hostile server here
asks for the password in cleartext or as md5, as a phishing server would; the provider must hang up
without answering, and report a sanitized reason. Real apiserver, the provider's ServiceAccount.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from harness import PostgresServer
from informers import SECRETS, Rest
from tests.reconciler.conftest import BASE_CONFIG, NAMESPACE, SHARD_SECRETS_NAMESPACE, install_config
from tests.reconciler.hostile_postgres import CLEARTEXT, MD5, HostilePostgres
from tests.support.common import b64, condition


@pytest.fixture
def pg18(postgres_pool) -> PostgresServer:
    return postgres_pool.get("18")


@pytest.mark.parametrize("auth_code", [CLEARTEXT, MD5], ids=["cleartext", "md5"])
def test_no_password_goes_to_a_server_asking_for_cleartext_or_md5(pg18, fleet, start_manager, auth_code):
    password = f"phish-me-{uuid.uuid4().hex}"
    with HostilePostgres(auth_code) as hostile:
        name = fleet.shard(pg18, port=hostile.port, sslmode="disable", password=password)
        start_manager(install_config(shardTLS={"cleartextShards": [name]}))  # an install that allows cleartext
        shard = fleet.wait_shard(name, "AdminAuthFailed")
        assert hostile.hung_up.wait(15), "the provider neither answered nor hung up"
        assert hostile.startups and hostile.startups[0]["user"] == pg18.PROVISIONER  # it did try to log in
    sent = b"".join(hostile.replies)
    assert not sent.startswith(b"p"), "a PasswordMessage was sent"
    assert password.encode() not in sent
    message = condition(shard, "Ready")["message"]
    assert message == (
        "admin login failed: insecure_auth_refused (the server did not offer SCRAM authentication "
        "(with channel binding under TLS); no password was sent)"
    )
    assert password not in str(shard)


@pytest.fixture
def unlisted_secret(admin_rest: Rest, pg18: PostgresServer) -> Iterator[tuple[str, str]]:
    """A usable admin Secret (the real provisioner password) in the release namespace, not listed."""
    name = f"rectest-unlisted-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {"user": b64(pg18.PROVISIONER), "password": b64(pg18.provisioner_password)},
    }
    admin_rest.create(SECRETS, body, NAMESPACE)
    yield NAMESPACE, name
    admin_rest.delete(SECRETS, name, NAMESPACE)


@pytest.mark.parametrize("where", ["release-namespace", "shard-secrets-namespace"])
def test_an_unlisted_admin_secret_is_refused_before_any_connection(pg18, fleet, start_manager, unlisted_secret, where):
    namespace, secret = unlisted_secret
    if where == "shard-secrets-namespace":  # a namespace with listed names, but not this one
        namespace, secret = SHARD_SECRETS_NAMESPACE, "rectest-not-listed"
    with HostilePostgres(CLEARTEXT) as hostile:
        name = fleet.shard(pg18, port=hostile.port, secret_ref={"namespace": namespace, "name": secret})
        start_manager()
        shard = fleet.wait_shard(name, "AdminSecretInvalid")
        assert hostile.connections == 0
    ready = condition(shard, "Ready")
    assert ready["status"] == "False"
    assert ready["message"] == (
        f"admin Secret {namespace}/{secret} is not listed in the install's shardSecrets; "
        "it is not read and no connection is made"
    )


def test_a_listed_admin_secret_in_the_release_namespace_is_used(pg18, fleet, start_manager, unlisted_secret):
    """Listing it is what makes it usable (render warns about the placement, see test_render)."""
    namespace, secret = unlisted_secret
    config = install_config(shardSecrets=[*BASE_CONFIG["shardSecrets"], {"namespace": namespace, "name": secret}])
    name = fleet.shard(pg18, secret_ref={"namespace": namespace, "name": secret})
    start_manager(config)
    fleet.wait_shard(name, "Ok")
