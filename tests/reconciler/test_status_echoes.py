"""The watch event of a Shard's or Consumer's own status write wakes no pass; another writer's change
to the same status does, and is undone. A new Database takes two passes (placement, then SQL and Ready):
the event of its Ready write wakes none. A Database change that leaves its Shard's and Consumer's counts
alone schedules no count refresh.

Before, the echo of each count write brought one more pass, which during a burst wrote the count
again at once (bench.fleet: 0.67 Shard status writes per new database where COUNT_BURST_GAP allows
about 0.4). Runs the manager's controllers as the provider's ServiceAccount on the real apiserver; the
Shard is checked every 10 minutes here, so no periodic pass falls between the writes counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from domain.constants import API_VERSION, FINALIZER_TENANT, KIND_CONSUMER
from domain.naming import database_object_name
from domain.resources import CONSUMERS, DATABASES, SHARDS
from harness import PostgresServer
from informers import SECRETS, Rest, object_key
from informers.informer import resource_version_of
from reconciler.runtime import Controller
from tests.reconciler.conftest import NAMESPACE
from tests.support.common import wait_for
from tests.support.in_process_manager import InProcessManager


def _controller(manager: InProcessManager, name: str) -> Controller:
    return next(c for c in manager.manager.controllers if c.name == name)


def _reconciles(manager: InProcessManager, controller: str) -> float:
    value = manager.manager.metrics.registry.get_sample_value("dbprovider_reconciles_total", {"controller": controller})
    return value or 0.0


def _idle(controller: Controller) -> bool:
    """No key of the controller queued now or being reconciled (a later, delayed check does not count)."""
    return len(controller.queue) == 0 and controller.queue.processing() == 0


def _consumer(rest: Rest, name: str) -> str:
    """A Consumer (its token Secret is not needed: only its databaseCount is looked at)."""
    token = {"namespace": NAMESPACE, "name": f"{name}-token", "key": "sha256"}
    body = {"apiVersion": API_VERSION, "kind": KIND_CONSUMER, "metadata": {"name": name}}
    rest.create(CONSUMERS, {**body, "spec": {"tokenSecretRef": token}})
    return name


@pytest.mark.parametrize("kind", ["shard", "consumer"])
def test_a_status_write_is_not_followed_by_a_pass_for_its_own_event(
    kind: str, postgres_pool: Any, fleet: Any, start_manager: Callable[..., InProcessManager], admin_rest: Rest
) -> None:
    server: PostgresServer = postgres_pool.get("16")
    shard = fleet.shard(server)
    consumer = _consumer(admin_rest, fleet.name("consumer"))
    try:
        resource, name = (SHARDS, shard) if kind == "shard" else (CONSUMERS, consumer)
        manager = start_manager(shard_ping_interval=600.0)
        fleet.wait_shard(shard, "Ok")
        wait_for(
            lambda: admin_rest.get(resource, name).get("status", {}).get("databaseCount") == 0,
            what=f"the {kind}'s databaseCount written",
        )
        controller = _controller(manager, kind)
        informer = manager.manager.informers.informer(resource)
        seen: list[str] = []  # resourceVersions of the object's events, after the controller's handler had them
        informer.add_handler(
            lambda _type, _old, new: (
                seen.append(resource_version_of(new) or "") if new and new["metadata"]["name"] == name else None
            ),
            replay=False,
        )
        settled = admin_rest.get(resource, name)
        wait_for(
            lambda: resource_version_of(informer.get(name) or {}) == resource_version_of(settled) and _idle(controller),
            what=f"the {kind} controller done with its writes",
        )
        before = _reconciles(manager, kind)

        # Another writer (a user, an older replica) sets a wrong count: its event wakes a pass, which
        # writes the count back; the event of that write wakes none.
        admin_rest.patch(resource, name, {"status": {"databaseCount": 99}}, subresource="status")
        restored = wait_for(
            lambda: (obj := admin_rest.get(resource, name))["status"]["databaseCount"] == 0 and obj,
            what=f"the {kind}'s count written back",
        )
        wait_for(lambda: resource_version_of(restored) in seen, what="the event of the controller's own write")
        wait_for(lambda: _idle(controller), what=f"the {kind} controller idle")
        assert _reconciles(manager, kind) - before == 1
        assert admin_rest.get(resource, name)["metadata"]["resourceVersion"] == resource_version_of(restored)
    finally:
        admin_rest.delete(CONSUMERS, consumer)


class _EventBeforeAnswer:
    """The controllers' apiserver client, except that a Secret create answers only once the cache holds
    the Secret: the create's watch event is handled before its answer (seen in CI under load)."""

    def __init__(self, rest: Rest, secrets: Any) -> None:
        self._rest, self._secrets = rest, secrets

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rest, name)

    def create(self, resource: Any, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        created: dict[str, Any] = self._rest.create(resource, body, namespace)
        if resource == SECRETS:
            key, version = object_key(created), resource_version_of(created)
            wait_for(lambda: resource_version_of(self._secrets.get(key) or {}) == version, what="the create's event")
        return created


@pytest.mark.parametrize("order", ["answer first", "event first"])
def test_a_new_database_takes_two_passes_and_its_ready_write_wakes_none(
    order: str, postgres_pool: Any, fleet: Any, start_manager: Callable[..., InProcessManager], admin_rest: Rest
) -> None:
    shard = fleet.shard(postgres_pool.get("16"))
    manager = start_manager()
    if order == "event first":
        credentials = manager.controllers.databases.secrets
        credentials.rest = _EventBeforeAnswer(credentials.rest, credentials.secrets)  # type: ignore[assignment]
    fleet.wait_shard(shard, "Ok")
    controller = _controller(manager, "database")
    databases = manager.manager.informers.informer(DATABASES, NAMESPACE)
    wait_for(lambda: _idle(controller), what="the database controller idle")
    before = _reconciles(manager, "database")
    queued: list[str] = []  # every key queued by an event (not the delayed re-checks)
    add = controller.queue.add
    controller.queue.add = lambda key: (queued.append(key), add(key))[1]  # type: ignore[method-assign]

    # As the API creates it: with the finalizer (a first pass that adds it would write once more).
    name = database_object_name(fleet.consumer, f"two-passes-{order.split()[0]}")
    body = {
        "apiVersion": API_VERSION,
        "kind": "Database",
        "metadata": {"name": name, "namespace": NAMESPACE, "finalizers": [FINALIZER_TENANT]},
        "spec": {"consumer": fleet.consumer, "externalId": f"two-passes-{order.split()[0]}", "sizeClass": ""},
    }
    admin_rest.create(DATABASES, body, NAMESPACE)
    fleet.databases.append(name)
    ready = fleet.wait_phase(name, "Ready")
    key = f"{NAMESPACE}/{name}"
    wait_for(
        lambda: resource_version_of(databases.get(key) or {}) == resource_version_of(ready) and _idle(controller),
        what="the Ready write's event handled",
    )
    assert _reconciles(manager, "database") - before == 2  # placement; SQL, login and Ready
    # Queued by its create's event and by the placement write's: the Secret's event echoes our create,
    # the Ready write's our write. Under load a third add could, with the cache behind the placement
    # write, run a third pass that only waits for the cache.
    assert queued.count(key) == 2
    assert fleet.get_database(name)["metadata"]["resourceVersion"] == resource_version_of(ready)


def test_a_database_change_that_keeps_the_counts_schedules_no_count_refresh(
    postgres_pool: Any, fleet: Any, start_manager: Callable[..., InProcessManager], admin_rest: Rest
) -> None:
    shard = fleet.shard(postgres_pool.get("16"))
    manager = start_manager(shard_ping_interval=600.0)
    fleet.wait_shard(shard, "Ok")
    name = fleet.database("counted")
    fleet.wait_phase(name, "Ready")
    key, consumer = f"{NAMESPACE}/{name}", fleet.consumer
    shards, consumers = _controller(manager, "shard"), _controller(manager, "consumer")
    databases = manager.manager.informers.informer(DATABASES, NAMESPACE)
    seen: list[str] = []  # the Database's resourceVersions, after the count handlers had their events
    databases.add_handler(
        lambda _type, _old, new: (
            seen.append(resource_version_of(new) or "") if new and object_key(new) == key else None
        ),
        replay=False,
    )

    def refresh_due(controller: Controller, name: str) -> bool:
        due = controller.queue.due_in(name)
        return due is not None and due <= 5.0  # a count refresh (the Shard's next check is minutes away)

    wait_for(
        lambda: not refresh_due(shards, shard) and not refresh_due(consumers, consumer) and _idle(consumers),
        what="the counts refreshed",
    )
    labelled = admin_rest.patch(DATABASES, name, {"metadata": {"labels": {"team": "a"}}}, NAMESPACE)
    wait_for(lambda: resource_version_of(labelled) in seen, what="the label's event handled")
    assert not refresh_due(shards, shard) and not refresh_due(consumers, consumer)
    assert _idle(consumers)

    fleet.request_delete(name)  # deleted: it commits no connections (a change that counts still refreshes)
    wait_for(lambda: fleet.get_shard(shard)["status"].get("connectionsCommitted") == 0, what="the budget freed")
