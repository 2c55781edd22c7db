"""The quota across replicas: concurrent PUTs of one consumer on 2 and 3 `dbprovider manager` processes
never create more than maxDatabases, a create the apiserver refuses gives its slot back at once, and a
replica killed with its create in flight holds one slot for at most the reservation timeout."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from dbprovider.devstack import DevStack
from domain.naming import quota_ledger_name
from domain.quota import QuotaLedger
from domain.resources import CONSUMERS, DATABASES, SHARDS
from harness import KubeControlPlane, PostgresServer
from informers import CONFIGMAPS, Rest
from tests.support.admission_webhook import RefusingWebhook
from tests.support.common import unique, wait_for
from tests.support.devstack import install_stack
from tests.support.replica import ManagerReplica

NAMESPACE = "quotatest-system"
RESERVATION_TIMEOUT = 8.0  # --quota-reservation-timeout of every replica here (the default is 120 s)
PUTS = 40
MAX_DATABASES = 5


@pytest.fixture(scope="module")
def stack(kube: KubeControlPlane, postgres_pool, tmp_path_factory) -> Iterator[DevStack]:
    postgres: PostgresServer = postgres_pool.get("18")
    created = install_stack(
        kube, postgres, tmp_path_factory.mktemp("quota"), "quotatest", softDelete={"retention": "0"}
    )
    with kube.admin_client() as client:  # the burst's databases need no shard: placement is not under test
        Rest(client).patch(SHARDS, created.shard, {"spec": {"accepting": False}})
    yield created
    created.unregister()


def start(stack: DevStack, name: str, log_dir: Path) -> ManagerReplica:
    return ManagerReplica(stack, name, log_dir, ("--quota-reservation-timeout", str(RESERVATION_TIMEOUT)))


@pytest.fixture(scope="module")
def replicas(stack: DevStack, tmp_path_factory) -> Iterator[list[ManagerReplica]]:
    log_dir = tmp_path_factory.mktemp("quota-replicas")
    started = [start(stack, f"quota-{n}", log_dir) for n in range(3)]
    try:
        for replica in started:
            replica.wait_ready()
        yield started
    finally:
        for replica in started:
            replica.kill()


def new_consumer(stack: DevStack, admin: Rest, replicas: list[ManagerReplica], max_databases: int) -> tuple[str, str]:
    """A fresh consumer (name, token) every replica already authenticates."""
    name = unique("quota-c")
    token = stack.add_consumer(admin, name, max_databases)
    for replica in replicas:
        authenticated = lambda r=replica: r.call("GET", "/v1/databases", token).status_code == 200  # noqa: E731
        wait_for(authenticated, 30, f"{name} on {replica.name}")
    return name, token


def databases_of(admin: Rest, consumer: str) -> list[str]:
    items = admin.list(DATABASES, NAMESPACE)["items"]
    return sorted(db["spec"]["externalId"] for db in items if db["spec"]["consumer"] == consumer)


def counted(admin: Rest, consumer: str) -> set[str]:
    """The externalIds holding a slot in the consumer's quota ledger."""
    ledger = QuotaLedger.parse(consumer, admin.get(CONFIGMAPS, quota_ledger_name(consumer), NAMESPACE))
    return set(ledger.held())


def burst(replicas: list[ManagerReplica], token: str, count: int) -> Counter[int]:
    """`count` PUTs at once (each on its own connection), spread evenly over `replicas`."""
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(count)

    def put(index: int) -> None:
        replica = replicas[index % len(replicas)]
        barrier.wait()
        response = replica.call("PUT", f"/v1/databases/burst-{index}", token, timeout=60)
        with lock:
            statuses[response.status_code] += 1

    threads = [threading.Thread(target=put, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    return statuses


@pytest.mark.parametrize("trial", range(5))
@pytest.mark.parametrize("replica_count", [2, 3])
def test_concurrent_puts_on_several_replicas_create_exactly_the_quota(
    stack: DevStack, admin: Rest, replicas: list[ManagerReplica], replica_count: int, trial: int
) -> None:
    serving = replicas[:replica_count]
    consumer, token = new_consumer(stack, admin, serving, MAX_DATABASES)
    statuses = burst(serving, token, PUTS)
    assert statuses == {201: MAX_DATABASES, 429: PUTS - MAX_DATABASES}
    created = databases_of(admin, consumer)
    assert len(created) == MAX_DATABASES
    assert counted(admin, consumer) == set(created)
    # Every replica now refuses one more, whatever its cache shows.
    for replica in serving:
        assert replica.call("PUT", "/v1/databases/one-more", token).status_code == 429


def test_a_create_the_apiserver_refuses_gives_its_slot_back_at_once(
    stack: DevStack, admin: Rest, replicas: list[ManagerReplica], kube: KubeControlPlane, tmp_path: Path
) -> None:
    consumer, token = new_consumer(stack, admin, replicas[:2], 2)
    a, b = replicas[0], replicas[1]
    assert a.call("PUT", "/v1/databases/first", token).status_code == 201
    with RefusingWebhook(kube, tmp_path, NAMESPACE, "refused", hold=False):
        assert b.call("PUT", "/v1/databases/refused", token).status_code == 503
    assert counted(admin, consumer) == {"first"}
    assert a.call("PUT", "/v1/databases/second", token).status_code == 201
    assert b.call("PUT", "/v1/databases/third", token).status_code == 429
    assert databases_of(admin, consumer) == ["first", "second"]


def test_a_replica_killed_with_its_create_in_flight_holds_one_slot_until_the_timeout(
    stack: DevStack, admin: Rest, replicas: list[ManagerReplica], kube: KubeControlPlane, tmp_path: Path
) -> None:
    survivor = replicas[0]
    victim = start(stack, "quota-victim", tmp_path)
    try:
        victim.wait_ready()
        consumer, token = new_consumer(stack, admin, [survivor, victim], 3)
        for external_id in ("one", "two"):
            assert survivor.call("PUT", f"/v1/databases/{external_id}", token).status_code == 201
        with RefusingWebhook(kube, tmp_path, NAMESPACE, "doomed", hold=True) as webhook:
            put = threading.Thread(target=lambda: _ignore_errors(victim, token), daemon=True)
            put.start()
            webhook.wait_received()  # the slot is reserved and the create waits at the apiserver
            reserved = time.monotonic()
            assert counted(admin, consumer) == {"one", "two", "doomed"}
            victim.kill()
            webhook.release()  # the create is refused: no database, and no replica left to give the slot back
        # The slot still counts while it may belong to a create in flight ...
        assert survivor.call("PUT", "/v1/databases/three", token).status_code == 429
        # ... and is freed once the reservation timeout has passed.
        wait_for(
            lambda: survivor.call("PUT", "/v1/databases/three", token).status_code == 201,
            RESERVATION_TIMEOUT + 30,
            "the leaked slot to be freed",
        )
        held = time.monotonic() - reserved
        print(f"a killed replica's slot was freed {held:.1f} s after its reservation (timeout {RESERVATION_TIMEOUT} s)")
        assert RESERVATION_TIMEOUT - 1 <= held <= RESERVATION_TIMEOUT + 30
        assert survivor.call("PUT", "/v1/databases/four", token).status_code == 429
        assert databases_of(admin, consumer) == ["one", "three", "two"]
        assert counted(admin, consumer) == {"one", "two", "three"}
    finally:
        victim.kill()


def _ignore_errors(replica: ManagerReplica, token: str) -> None:
    try:
        replica.call("PUT", "/v1/databases/doomed", token, timeout=60)
    except requests.RequestException:
        pass  # the replica is killed while the request waits


@pytest.fixture(scope="module", autouse=True)
def _remove_consumers(admin: Rest) -> Iterator[None]:
    yield
    for consumer in admin.list(CONSUMERS)["items"]:
        if consumer["metadata"]["name"].startswith("quota-c-"):
            admin.delete(CONSUMERS, consumer["metadata"]["name"])
