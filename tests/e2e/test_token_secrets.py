"""Token Secrets on a real `dbprovider manager` process: one Secret watch whatever the number of
Consumers, changes applied within the documented second, and a hash listed by two Consumers denied to
both in every state of either, logged once per change (never the hash)."""

from __future__ import annotations

import copy
import json
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import requests

from dbprovider.devstack import DevStack
from domain.constants import API_VERSION
from domain.resources import CONSUMERS
from domain.tokens import hash_token
from harness import KubeControlPlane, PostgresServer
from informers import SECRETS, Resource, Rest
from tests.support.common import b64, unique, wait_for
from tests.support.devstack import install_stack
from tests.support.replica import ManagerReplica

RELEASE, NAMESPACE, ELSEWHERE = "tokentest", "tokentest-system", "tokentest-elsewhere"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
LIST = "/v1/databases"
# docs/api.md: "Changes take effect within about a second". A correctness bound, not a benchmark: a
# design that re-reads Secrets periodically, or waits for a relist, misses it by far.
PROPAGATION_BOUND = 5.0


@pytest.fixture(scope="module")
def stack(kube: KubeControlPlane, postgres_pool, tmp_path_factory) -> Iterator[DevStack]:
    postgres: PostgresServer = postgres_pool.get("18")
    kube.ensure_namespace(ELSEWHERE)
    created = install_stack(kube, postgres, tmp_path_factory.mktemp("tokens"), RELEASE)
    yield created
    created.unregister()


@pytest.fixture(scope="module")
def replica(stack: DevStack, tmp_path_factory) -> Iterator[ManagerReplica]:
    started = ManagerReplica(stack, "tokens", tmp_path_factory.mktemp("token-replica"))
    try:
        started.wait_ready()
        yield started
    finally:
        started.kill()
    logs = started.log.read_text().lower()
    assert not any(value in logs for value in SENSITIVE), "a token or its hash appeared in the manager's log"


SENSITIVE: set[str] = set()  # every token and hash this module made: none may appear in the log


def token() -> str:
    value = secrets.token_hex(32)
    SENSITIVE.update((value, hash_token(value)))
    return value


def write_secret(admin: Rest, name: str, lines: list[str], key: str = "sha256", namespace: str = NAMESPACE) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "data": {key: b64("".join(f"{line}\n" for line in lines))},
    }
    try:
        admin.create(SECRETS, body, namespace)
    except Exception as exc:
        if getattr(exc, "status", None) != 409:
            raise
        admin.replace(SECRETS, body)


def new_consumer(admin: Rest, tokens: list[str]) -> str:
    name = unique("tok")
    write_secret(admin, f"{name}-token", [hash_token(t) for t in tokens])
    admin.create(
        CONSUMERS,
        {
            "apiVersion": API_VERSION,
            "kind": "Consumer",
            "metadata": {"name": name},
            "spec": {"tokenSecretRef": {"namespace": NAMESPACE, "name": f"{name}-token", "key": "sha256"}},
        },
    )
    return name


def status(replica: ManagerReplica, token_: str) -> int:
    try:
        return replica.call("GET", LIST, token_).status_code
    except requests.RequestException:
        return 0


def wait_status(replica: ManagerReplica, token_: str, code: int, timeout: float = 20) -> float:
    """Seconds until the replica answers `code` for this token."""
    started = time.monotonic()
    wait_for(lambda: status(replica, token_) == code, timeout, f"HTTP {code}")
    return time.monotonic() - started


def log_lines(replica: ManagerReplica, pattern: str) -> list[str]:
    found = []
    for line in replica.log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            message = json.loads(line).get("message", "")
            if re.search(pattern, message):
                found.append(message)
    return found


def apiserver_watches(kube: KubeControlPlane, resource: str) -> int:
    """Open WATCH requests on `resource`, from the apiserver's own gauge."""
    configuration = kube.configuration()
    text = requests.get(
        f"{kube.url}/metrics",
        cert=(configuration.cert_file, configuration.key_file),
        verify=configuration.ssl_ca_cert,
        timeout=30,
    ).text
    total = 0
    for line in text.splitlines():
        if (
            line.startswith("apiserver_longrunning_requests{")
            and 'verb="WATCH"' in line
            and f'resource="{resource}"' in line
        ):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


# -- one watch ----------------------------------------------------------------------------------


def test_secret_watches_do_not_grow_with_the_consumers(
    replica: ManagerReplica, admin: Rest, kube: KubeControlPlane
) -> None:
    before = apiserver_watches(kube, "secrets")
    tokens = [token() for _ in range(30)]
    for value in tokens:
        new_consumer(admin, [value])
    for value in tokens:
        wait_status(replica, value, 200)
    assert apiserver_watches(kube, "secrets") == before


# -- changes apply within the bound -------------------------------------------------------------


def test_token_secret_changes_apply_within_the_bound(replica: ManagerReplica, admin: Rest) -> None:
    old, new = token(), token()
    consumer = new_consumer(admin, [old])
    wait_status(replica, old, 200)
    secret = f"{consumer}-token"
    timings = {}
    write_secret(admin, secret, [hash_token(old), hash_token(new)])
    timings["a hash added"] = wait_status(replica, new, 200, PROPAGATION_BOUND)
    write_secret(admin, secret, [hash_token(new)])
    timings["a hash removed"] = wait_status(replica, old, 401, PROPAGATION_BOUND)
    admin.delete(SECRETS, secret, NAMESPACE)
    timings["the Secret deleted"] = wait_status(replica, new, 401, PROPAGATION_BOUND)
    write_secret(admin, secret, [hash_token(new)])
    timings["the Secret created again"] = wait_status(replica, new, 200, PROPAGATION_BOUND)
    print(f"token Secret propagation on a manager process: {timings}")


# -- conflicts ----------------------------------------------------------------------------------


@contextmanager
def consumer_schema_without_validation(admin: Rest) -> Iterator[None]:
    """For the length of the block, the Consumer CRD accepts any spec (an old or hand-edited schema), so
    a Consumer the provider cannot parse can exist; the installed schema is put back afterwards."""
    name = "consumers.db.bnerd.com"
    original = admin.get(CRDS, name)
    relaxed = copy.deepcopy(original)
    for version in relaxed["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        spec["properties"]["maxDatabases"].pop("minimum", None)
    admin.replace(CRDS, relaxed)
    try:
        yield
    finally:
        restored = admin.get(CRDS, name)
        restored["spec"] = original["spec"]
        admin.replace(CRDS, restored)


def into_state(admin: Rest, consumer: str, state: str) -> None:
    """Put one of two consumers listing a common hash into `state`."""
    if state == "disabled":
        admin.patch(CONSUMERS, consumer, {"spec": {"disabled": True}})
    elif state == "foreign-namespace":  # its Secret stays where it was; the ref no longer points there
        admin.patch(CONSUMERS, consumer, {"spec": {"tokenSecretRef": {"namespace": ELSEWHERE}}})
    elif state == "invalid-spec":
        with consumer_schema_without_validation(admin):
            wait_for(lambda: _try_patch(admin, consumer, {"spec": {"maxDatabases": -1}}), 30, "the relaxed schema")
    elif state == "key-missing":
        admin.patch(CONSUMERS, consumer, {"spec": {"tokenSecretRef": {"key": "no-such-key"}}})


def _try_patch(admin: Rest, name: str, patch: dict[str, Any]) -> bool:
    try:
        admin.patch(CONSUMERS, name, patch)
    except Exception as exc:  # 422 until the apiserver uses the relaxed schema
        if getattr(exc, "status", None) == 422:
            return False
        raise
    return True


STATES = ["enabled", "disabled", "foreign-namespace", "invalid-spec", "key-missing"]


@pytest.mark.parametrize("which", ["first", "second"])
@pytest.mark.parametrize("state", STATES)
def test_a_hash_listed_by_two_consumers_authenticates_neither_in_any_state(
    replica: ManagerReplica, admin: Rest, state: str, which: str
) -> None:
    shared, own_a, own_b = token(), token(), token()
    a = new_consumer(admin, [shared, own_a])
    b = new_consumer(admin, [shared, own_b])
    wait_status(replica, own_a, 200)
    wait_status(replica, own_b, 200)
    assert status(replica, shared) == 401
    conflict = rf"a token stopped authenticating: .*consumers {re.escape(min(a, b))} .*{re.escape(max(a, b))}"
    wait_for(lambda: len(log_lines(replica, conflict)) == 1, 10, "the conflict to be logged")

    changed, other = (a, own_b) if which == "first" else (b, own_a)
    own_changed = own_a if changed == a else own_b
    into_state(admin, changed, state)
    if state != "enabled":
        wait_status(replica, own_changed, 401)  # the change has reached the replica
    assert status(replica, other) == 200  # the other consumer's own token still works
    for _ in range(3):
        assert status(replica, shared) == 401
    assert len(log_lines(replica, conflict)) == 1  # the conflict did not change: nothing new logged

    # Resolving it (the changed consumer is deleted) lets the hash authenticate the other one; logged once.
    admin.delete(CONSUMERS, changed)
    wait_status(replica, shared, 200)
    resolved = rf"consumers {re.escape(min(a, b))}, {re.escape(max(a, b))} no longer list a common token hash"
    wait_for(lambda: len(log_lines(replica, resolved)) == 1, 10, "the end of the conflict to be logged")
