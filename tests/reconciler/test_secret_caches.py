"""Which Secrets of the release namespace the provider keeps in memory: only what it needs.

The controllers and the API of one replica run in-process on the shared informers, as the provider's
ServiceAccount (RBAC on). Credentials Secrets are cached by label (their metadata and a digest, never their
data: the password is read from the apiserver when it is needed), token Secrets by the names the
Consumers give (found through one metadata-only watch, which holds names and versions, never data);
an admin Secret, even a listed one in the release namespace, is read by name when needed and never
cached, even when a Consumer names it, and no other Secret of the namespace is either.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator

import pytest

from api.app import build_api
from api.auth import AuthState
from domain.constants import API_VERSION
from domain.credentials import DIGEST
from domain.resources import CONSUMERS
from harness import PostgresServer
from informers import SECRETS, Rest
from tests.reconciler.conftest import BASE_CONFIG, NAMESPACE, install_config
from tests.support.common import b64, condition, wait_for
from tests.support.in_process_manager import InProcessManager


class Objects:
    """Secrets and Consumers this test creates, removed afterwards."""

    def __init__(self, rest: Rest) -> None:
        self.rest = rest
        self.secrets: list[str] = []
        self.consumers: list[str] = []

    def secret(self, name: str, data: dict[str, str]) -> str:
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "data": {k: b64(v) for k, v in data.items()},
        }
        self.rest.create(SECRETS, body, NAMESPACE)
        self.secrets.append(name)
        return name

    def consumer(self, name: str, token_secret: str) -> str:
        body = {
            "apiVersion": API_VERSION,
            "kind": "Consumer",
            "metadata": {"name": name},
            "spec": {"tokenSecretRef": {"namespace": NAMESPACE, "name": token_secret, "key": "sha256"}},
        }
        self.rest.create(CONSUMERS, body)
        self.consumers.append(name)
        return name

    def cleanup(self) -> None:
        for name in self.consumers:
            try:
                self.rest.delete(CONSUMERS, name)
            except Exception:  # noqa: BLE001 - deleted by the test
                pass
        for name in self.secrets:
            self.rest.delete(SECRETS, name, NAMESPACE)


@pytest.fixture
def objects(admin_rest: Rest) -> Iterator[Objects]:
    created = Objects(admin_rest)
    yield created
    created.cleanup()


@pytest.fixture
def pg18(postgres_pool) -> PostgresServer:
    return postgres_pool.get("18")


def cached_secrets(manager: InProcessManager) -> set[str]:
    """Every Secret the replica holds more of than its name: in a (not metadata-only) informer or a by-name cache."""
    shared = manager.manager.informers
    informers = [i for i in shared.all() if i.resource == SECRETS and not i.metadata_only]
    held = {key for informer in informers for key in informer.keys()}
    for named in shared.all_named():
        held |= {f"{named.namespace}/{name}" for name in named.names()}
    return held


def secret_watches(manager: InProcessManager) -> list[str]:
    return [repr(i) for i in manager.manager.informers.all() if i.resource == SECRETS]


def metadata_entries(manager: InProcessManager) -> list[dict]:
    """What the metadata-only informers of Secrets hold."""
    shared = manager.manager.informers
    return [obj for i in shared.all() if i.resource == SECRETS and i.metadata_only for obj in i.list()]


def test_admin_and_other_secrets_of_the_release_namespace_are_never_cached(
    pg18, fleet, objects, admin_rest, provider_client
):
    suffix = uuid.uuid4().hex[:6]
    admin = objects.secret(
        f"rectest-admin-rel-{suffix}", {"user": pg18.PROVISIONER, "password": pg18.provisioner_password}
    )
    other = objects.secret(f"rectest-unrelated-{suffix}", {"tls.key": "not a real key"})
    token = "t" * 64
    token_secret = objects.secret(f"rectest-token-{suffix}", {"sha256": hashlib.sha256(token.encode()).hexdigest()})
    consumer = objects.consumer(f"rectest-cache-{suffix}", token_secret)
    # A Consumer naming the admin Secret as its token Secret does not get it read either.
    greedy = objects.consumer(f"rectest-greedy-{suffix}", admin)

    config = install_config(shardSecrets=[*BASE_CONFIG["shardSecrets"], {"namespace": NAMESPACE, "name": admin}])
    manager = InProcessManager(provider_client, config, NAMESPACE, "rectest-manager", f"rectest-cache-{suffix}")
    api = build_api(config, manager.manager.informers)  # the API's informers, as `dbprovider manager` wires them
    manager.start()
    try:
        shard = fleet.shard(pg18, secret_ref={"namespace": NAMESPACE, "name": admin})
        wait_for(
            lambda: (c := condition(fleet.get_shard(shard), "Ready")) is not None and c["reason"] == "Ok",
            what="the shard to be Ready with the listed admin Secret of the release namespace",
        )
        db = fleet.database(f"cache-{suffix}")
        fleet.wait_phase(db, "Ready")
        wait_for(lambda: api.tokens.state(consumer) == AuthState.OK, what="the consumer's token to be indexed")
        wait_for(lambda: f"{NAMESPACE}/{db}-credentials" in cached_secrets(manager), what="the credentials cached")
        credentials = next(i for i in manager.manager.informers.all() if i.resource == SECRETS and not i.metadata_only)
        held = credentials.get(f"{NAMESPACE}/{db}-credentials")
        assert held is not None and "data" not in held and DIGEST in held  # provisioned: the password read live

        wait_for(lambda: api.tokens.state(greedy) == AuthState.ADMIN_SECRET, what="the greedy consumer refused")
        cached = cached_secrets(manager)
        assert f"{NAMESPACE}/{token_secret}" in cached
        assert f"{NAMESPACE}/{admin}" not in cached
        assert f"{NAMESPACE}/{other}" not in cached
        assert all(key.endswith("-credentials") for key in cached - {f"{NAMESPACE}/{token_secret}"})
        # Two watches of Secrets, whatever the number of Consumers: credentials by label, the rest as metadata.
        assert len(secret_watches(manager)) == 2, secret_watches(manager)
        # The metadata index knows the admin Secret's name, nothing of its content.
        entries = {e["metadata"]["name"]: e for e in metadata_entries(manager)}
        assert set(entries[admin]) == {"metadata"}
        assert set(entries[admin]["metadata"]) <= {"name", "namespace", "uid", "resourceVersion"}
        assert not any(name.endswith("-credentials") for name in entries)

        # A Consumer that is gone takes its token Secret out of the cache.
        admin_rest.delete(CONSUMERS, consumer)
        wait_for(
            lambda: f"{NAMESPACE}/{token_secret}" not in cached_secrets(manager),
            what="the token Secret of a deleted Consumer to leave the cache",
        )
    finally:
        manager.stop()
