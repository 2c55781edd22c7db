"""The Database workers' admin endpoint cache: one Secret read per shard and window, never a stale
endpoint after a failure or a change of the Shard's admin block, and errors are never kept.

Reads real admin Secrets on the real apiserver.
"""

from __future__ import annotations

import uuid

import pytest

from domain.specs import parse_shard
from informers import SECRETS, Rest
from reconciler.shard.admin import AdminEndpointCache, AdminPolicy, AdminSecretInvalid
from tests.reconciler.conftest import NAMESPACE
from tests.support.common import b64


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def admin_secret(admin_rest: Rest, name: str, password: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {"user": b64("provisioner"), "password": b64(password)},
    }
    admin_rest.create(SECRETS, body, NAMESPACE)


def listed(*names: str) -> AdminPolicy:
    """shardSecrets naming these Secrets of the test namespace."""
    return AdminPolicy(frozenset((NAMESPACE, name) for name in names))


def shard_spec(secret: str, port: int = 5432):
    return parse_shard(
        {
            "spec": {
                "maxDatabases": 10,
                "perconaCluster": {"namespace": "databases", "name": "pg"},
                "admin": {
                    "serviceName": "pg-primary",
                    "port": port,
                    "secretRef": {"namespace": NAMESPACE, "name": secret},
                },
                "client": {"host": "pg.example.com", "port": 5432},
            }
        }
    )


@pytest.fixture
def secret_names(admin_rest: Rest):
    names: list[str] = []
    yield names
    for name in names:
        try:
            admin_rest.delete(SECRETS, name, NAMESPACE)
        except Exception:  # noqa: BLE001 - already gone
            pass


def test_one_read_per_window_and_a_fresh_read_after_forget_or_a_change(admin_rest, secret_names) -> None:
    first, second = f"aec-{uuid.uuid4().hex[:6]}-a", f"aec-{uuid.uuid4().hex[:6]}-b"
    secret_names += [first, second]
    admin_secret(admin_rest, first, "pw-one")
    admin_secret(admin_rest, second, "pw-two")
    clock = Clock()
    cache = AdminEndpointCache(admin_rest, listed(first, second), "127.0.0.1", ttl=10.0, clock=clock)

    assert cache.get("s1", shard_spec(first)).password == "pw-one"
    for _ in range(20):  # a burst of new databases on the shard
        assert cache.get("s1", shard_spec(first)).password == "pw-one"
    assert cache.reads == 1

    # The Secret is rotated: the workers see it once the window is over (well inside the 60 s).
    admin_rest.patch(SECRETS, first, {"data": {"password": b64("pw-rotated")}}, NAMESPACE)
    clock.now += 9.9
    assert cache.get("s1", shard_spec(first)).password == "pw-one"
    clock.now += 0.2
    assert cache.get("s1", shard_spec(first)).password == "pw-rotated"
    assert cache.reads == 2

    # A failed operation forgets it: the retry reads the Secret at once.
    admin_rest.patch(SECRETS, first, {"data": {"password": b64("pw-again")}}, NAMESPACE)
    cache.forget("s1")
    assert cache.get("s1", shard_spec(first)).password == "pw-again"

    # Another Secret or port in the Shard's admin block is read at once, and shards do not share.
    assert cache.get("s1", shard_spec(second)).password == "pw-two"
    assert cache.get("s1", shard_spec(second, port=6543)).port == 6543
    assert cache.get("s2", shard_spec(first)).password == "pw-again"
    assert cache.reads == 6


def test_an_unusable_secret_is_not_kept(admin_rest, secret_names) -> None:
    name = f"aec-{uuid.uuid4().hex[:6]}-late"
    secret_names.append(name)
    cache = AdminEndpointCache(admin_rest, listed(name), "127.0.0.1", ttl=10.0, clock=Clock())
    with pytest.raises(AdminSecretInvalid, match="not found"):
        cache.get("s1", shard_spec(name))
    admin_secret(admin_rest, name, "pw-late")  # the operator fixes it: used at the next retry
    assert cache.get("s1", shard_spec(name)).password == "pw-late"


def test_an_unlisted_secret_is_refused_without_being_read(admin_rest, secret_names) -> None:
    """Also in the release namespace: only shardSecrets are admin credentials."""
    usable, missing = f"aec-{uuid.uuid4().hex[:6]}-usable", f"aec-{uuid.uuid4().hex[:6]}-missing"
    secret_names.append(usable)
    admin_secret(admin_rest, usable, "pw-usable")
    cache = AdminEndpointCache(admin_rest, listed(f"{usable}-other"), "127.0.0.1", ttl=10.0, clock=Clock())
    with pytest.raises(AdminSecretInvalid, match="is not listed in the install's shardSecrets"):
        cache.get("s1", shard_spec(usable))
    # A Secret that does not exist gets the same answer, not "not found": nothing was read.
    with pytest.raises(AdminSecretInvalid, match="is not listed in the install's shardSecrets"):
        cache.get("s1", shard_spec(missing))
