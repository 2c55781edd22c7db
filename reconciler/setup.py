"""Wires the Shard, Database and Consumer controllers onto a ControllerManager.

The composition root (`dbprovider manager`) calls `register_controllers` once; the informers it
registers are the shared ones the API reads too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from pydantic import ValidationError

from domain.admin_access import OutsidePod
from domain.conditions import READY, find_condition
from domain.config import InstallConfig
from domain.connection_budget import database_limit
from domain.constants import CREDENTIALS_SECRET_SELECTOR, CREDENTIALS_SECRET_SUFFIX, Engine
from domain.objects import ShardState
from domain.quota import counts_against_quota
from domain.specs import ShardSpec, parse_shard
from informers import SECRETS, Informer, Rest, object_key, split_key
from informers.informer import Handler
from reconciler.consumer_controller import ConsumerController
from reconciler.database import DatabaseController
from reconciler.events import EventRecorder
from reconciler.fleet_metrics import EngineCollector
from reconciler.resources import (
    BY_CONSUMER,
    BY_SHARD,
    CONSUMERS,
    DATABASE_CLUSTERS,
    DATABASES,
    SHARDS,
    database_consumer,
    database_shard,
)
from reconciler.runtime import Controller, ControllerManager, Lanes
from reconciler.shard.admin import AdminPolicy, AdminSessions
from reconciler.shard.budget import ShardBudgets
from reconciler.shard.controller import PING_INTERVAL, ShardController
from reconciler.sql.session import APPLICATION_NAME
from reconciler.worker_metrics import DatabaseWorkersCollector

SHARD_WORKERS = 4


def replica_application_name(instance: str) -> str:
    """`dbprovider/<replica>`: which replica sent a statement shows in the shard's activity and logs."""
    return f"{APPLICATION_NAME}/{instance}"[:63]  # PostgreSQL keeps at most 63 bytes


@dataclass
class Controllers:
    shards: ShardController
    databases: DatabaseController
    consumers: ConsumerController
    sessions: AdminSessions
    events: EventRecorder
    rest: Rest

    def close(self) -> None:
        """After the manager stopped: send the queued Events, close the shards' admin sessions and
        the controllers' apiserver client."""
        self.events.close()
        self.sessions.close_all()
        self.rest.api_client.close()


COUNT_COALESCE_SECONDS = 1.0
# During a burst a count is refreshed at most this often: each refresh is a status write, its watch
# event in every replica and one more pass of the Shard (bench.fleet: 0.75 Shard writes per new
# database with 1 s, 20 shards each refreshed about once a second for the whole burst).
COUNT_BURST_GAP = 5.0


def _coalesced(
    controller: Controller, keys: Callable[[dict[str, Any]], list[str]], counted: Callable[[dict[str, Any]], object]
) -> Handler:
    """Database events -> the Shard/Consumer keys whose databaseCount they change, a second later, and
    during a burst at most every COUNT_BURST_GAP seconds.

    A burst of placements then writes each count once per COUNT_BURST_GAP, not once per database (the
    work queue keeps the earliest pending time of a key); a change after a quiet spell shows within a second.
    An update that keeps a database on the same keys with the same `counted(db)` (what it adds to their
    status) changes nothing there and wakes no pass: the Ready write of each new database, say, whose
    Consumer passes were half of them in bench.fleet (0.42 for 0.18 writes per new database).
    """
    scheduled: dict[str, float] = {}  # key -> when its last refresh was due (time.monotonic())
    lock = threading.Lock()

    def changed(old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[str]:
        before, after = keys(old) if old is not None else [], keys(new) if new is not None else []
        if old is None or new is None or counted(old) != counted(new):
            return [*before, *(key for key in after if key not in before)]
        return [key for key in (*before, *after) if (key in before) != (key in after)]

    def handler(event_type: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        now = time.monotonic()
        for key in changed(old, new):
            with lock:
                last = scheduled.get(key)
                if last is not None and last > now:
                    continue  # a refresh is due already; it counts this change too
                due = now + COUNT_COALESCE_SECONDS
                if last is not None:
                    due = max(due, last + COUNT_BURST_GAP)
                scheduled[key] = due
            controller.enqueue_after(key, due - now)

    return handler


def _typed_spec(shard: dict[str, Any]) -> ShardSpec | None:
    try:
        return parse_shard(shard)
    except ValidationError:
        return None


def _shard_inputs(shard: dict[str, Any] | None) -> tuple[Any, ...]:
    """What of a Shard the Database controller depends on: spec (client block...), readiness, budget
    (a larger budget may fit a waiting database). A status that does not validate reads as empty.

    A spec that does not validate counts as itself (raw: it has no model), so fixing or breaking it wakes
    the databases too.
    """
    if shard is None:
        return (None,)
    spec = _typed_spec(shard)
    status = ShardState.parse_lenient_status(shard)[0].status
    ready = find_condition(status.conditions, READY)
    readiness = None if ready is None else ready.status
    return (shard.get("spec") if spec is None else spec, readiness, status.connection_budget)


def register_controllers(
    manager: ControllerManager,
    config: InstallConfig,
    namespace: str,
    *,
    instance: str,
    outside_pod: OutsidePod,
    shard_ping_interval: float = PING_INTERVAL,
) -> Controllers:
    """`outside_pod`: how a manager outside a pod (dev, tests) reaches the shards; OutsidePod() in a pod."""
    informers = manager.informers
    # Every write of the controllers (status, finalizers, Secrets, Events, counts) and every
    # statement they send to a shard checks leadership first: a replica that lost (or may have
    # lost) the Lease writes nothing. The informers and the API keep the unfenced client.
    # Their User-Agent tells the controllers' writes from the API's in the apiserver's audit log.
    # On a client of their own without urllib3's hidden retries: a write the fence let through is sent
    # once; retried by the controller (after the fence again), never re-sent by the transport later,
    # e.g. an Event (no precondition) delivered after the link to a cut-off leader came back.
    # Each write is bounded below the Lease's renew deadline (leader.write_timeout), so none sent while
    # leading arrives after another replica may have taken over.
    rest = manager.rest.without_retries().fenced(
        manager.fence,
        user_agent=f"{APPLICATION_NAME}-controllers/{instance}",
        write_timeout=manager.write_timeout(),
    )
    shards = informers.informer(SHARDS)
    consumers = informers.informer(CONSUMERS)
    databases = informers.informer(DATABASES, namespace)
    # Only the credentials Secrets (by label): admin and other Secrets of the namespace stay uncached.
    secrets = informers.informer(SECRETS, namespace, label_selector=CREDENTIALS_SECRET_SELECTOR)
    databases.add_index(BY_SHARD, database_shard)
    databases.add_index(BY_CONSUMER, database_consumer)
    clusters: Informer | None = None
    if config.engines.cloudberry.enabled:
        # Optional: a missing or unserved Keldon CRD must not keep the replica from starting; the
        # cloudberry shards report EngineUnavailable meanwhile (and dbprovider_engine_available is 0).
        clusters = informers.informer(DATABASE_CLUSTERS)
        informers.mark_optional(clusters)
        manager.metrics.registry.register(EngineCollector({Engine.CLOUDBERRY.value: clusters.has_synced}))
    sessions = AdminSessions(fence=manager.fence, application_name=replica_application_name(instance))
    policy = AdminPolicy.from_config(config, outside_pod.ca_file)
    # A lost Lease (or shutdown) cuts every shard session at once, then closes them once the workers are done.
    manager.when_controllers_stopping(sessions.sever_all)
    manager.after_controllers_stop(sessions.close_all)

    shard_logic = ShardController(
        rest,
        shards,
        databases,
        clusters,
        sessions,
        outside_pod.admin_host,
        ping_interval=shard_ping_interval,
        policy=policy,
        budgets=ShardBudgets(config, databases, config.workers_per_shard),
    )
    # Several workers: each checks a different shard, so a dead shard's timeout delays no other.
    shard_controller = Controller("shard", shard_logic.reconcile, workers=SHARD_WORKERS)
    shard_logic.enqueue = shard_logic.echoes.enqueue = shard_controller.enqueue
    shard_controller.watch(shards, echo=shard_logic.echoes.echo)  # not the echo of its own status write
    # A Shard counts its databases and what their connection limits commit (shard_budget.py).
    commits = partial(database_limit, config=config)
    databases.add_handler(_coalesced(shard_controller, database_shard, commits), replay=False)
    if clusters is not None:

        def shards_of_cluster(cluster: dict[str, Any]) -> list[str]:
            ref = split_key(object_key(cluster))  # (namespace, name) of the Keldon DatabaseCluster
            return [
                object_key(s)
                for s in shards.list()
                if (spec := _typed_spec(s)) is not None
                and spec.keldon_cluster is not None
                and (spec.keldon_cluster.namespace, spec.keldon_cluster.name) == ref
            ]

        shard_controller.watch(clusters, shards_of_cluster)

    events = EventRecorder(rest, instance)
    db_logic = DatabaseController(
        rest,
        config,
        namespace,
        databases,
        shards,
        secrets,
        events,
        sessions,
        outside_pod.admin_host,
        policy=policy,
    )
    # A lane per shard: at most workersPerShard passes on one shard's databases (and on placement) at
    # once, workersTotal in all, the lanes taking turns; a hung shard holds only its own lane's workers.
    db_controller = Controller(
        "database",
        db_logic.reconcile,
        workers=config.workers_total,
        lanes=Lanes(db_logic.lane, config.workers_per_shard),
        settled=db_logic.settled,  # a start looks at 100,000 Ready databases: most need no worker
    )
    manager.metrics.registry.register(
        DatabaseWorkersCollector(
            lambda: db_controller.queue.lane_stats(),
            shards.keys,
            config.workers_per_shard,
            config.workers_total,
        )
    )

    def shard_trouble(shard: str, error_class: str | None = None) -> None:
        """SQL on the shard failed (or hangs) for a reason that is not the tenant's: no placement there
        until a check passes, and that check now."""
        db_logic.placement.suspend(shard)
        shard_logic.suspect(shard, error_class)

    db_logic.on_shard_trouble = shard_trouble  # a failed statement triggers a shard check
    sessions.on_slow = shard_trouble  # SQL hanging on a shard: check it now
    shard_logic.on_passed = db_logic.placement.clear
    db_logic.writes.echoes.enqueue = db_controller.enqueue
    db_logic.secrets.enqueue = db_controller.enqueue
    db_controller.watch(databases, echo=db_logic.writes.echoes.echo)  # not the echo of a pass's last write

    def credentials_owner(secret: dict[str, Any]) -> list[str]:
        key = object_key(secret)  # namespace/name
        if not key.endswith(CREDENTIALS_SECRET_SUFFIX) or db_logic.secrets.own_create(secret):
            return []  # not a credentials Secret, or our own create's echo (secret.py: no pass needed)
        return [key[: -len(CREDENTIALS_SECRET_SUFFIX)]]

    db_controller.watch(secrets, credentials_owner)

    def on_shard(event_type: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if _shard_inputs(old) == _shard_inputs(new):
            return  # e.g. only databaseCount changed: nothing for the databases
        shard = new if new is not None else old
        assert shard is not None  # an event has an object
        for key in databases.index_keys(BY_SHARD, object_key(shard)):
            db_controller.enqueue(key)
        for db in databases.list():  # unplaced databases may fit now
            if not database_shard(db):
                db_controller.enqueue(object_key(db))

    shards.add_handler(on_shard, replay=False)

    consumer_logic = ConsumerController(rest, consumers, databases)
    consumer_controller = Controller("consumer", consumer_logic.reconcile, workers=1)
    consumer_logic.echoes.enqueue = consumer_controller.enqueue
    consumer_controller.watch(consumers, echo=consumer_logic.echoes.echo)
    databases.add_handler(_coalesced(consumer_controller, database_consumer, counts_against_quota), replay=False)

    for controller in (shard_controller, db_controller, consumer_controller):
        manager.add_controller(controller)
    return Controllers(shard_logic, db_logic, consumer_logic, sessions, events, rest)
