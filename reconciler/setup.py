"""Wires the Shard, Database, Consumer, DatabaseMove and drain controllers onto a ControllerManager.

The composition root (`dbprovider manager`) calls `register_controllers` once; the informers it
registers are the shared ones the API reads too. Each controller is wired by its own package's setup
(reconciler/shard/setup.py, reconciler/database/setup.py, reconciler/consumer/setup.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from domain.admin_access import OutsidePod
from domain.config import InstallConfig
from domain.connection_budget import database_limit
from domain.constants import CREDENTIALS_SECRET_SELECTOR, Engine
from domain.resources import (
    BY_CONSUMER,
    BY_SHARD,
    CONSUMERS,
    DATABASE_CLUSTERS,
    DATABASES,
    SHARDS,
    database_consumer,
    database_shard,
)
from informers import SECRETS, Informer, Rest
from reconciler.consumer.controller import ConsumerController
from reconciler.consumer.setup import setup_consumers
from reconciler.database import DatabaseController
from reconciler.database.setup import setup_databases
from reconciler.drain.setup import setup_drains
from reconciler.events import EventRecorder
from reconciler.fleet_metrics import EngineCollector
from reconciler.move.controller import MoveController
from reconciler.move.setup import setup_moves
from reconciler.placement_index import placement_index
from reconciler.runtime import ControllerManager
from reconciler.shard.admin import AdminSessions
from reconciler.shard.controller import PING_INTERVAL, ShardController
from reconciler.shard.setup import setup_shards
from reconciler.sql.session import APPLICATION_NAME


@dataclass
class Controllers:
    shards: ShardController
    databases: DatabaseController
    consumers: ConsumerController
    moves: MoveController
    sessions: AdminSessions
    events: EventRecorder
    rest: Rest

    def close(self) -> None:
        """After the manager stopped: send the queued Events, close the shards' admin sessions and
        the controllers' apiserver client."""
        self.events.close()
        self.sessions.close_all()
        self.rest.api_client.close()


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
    rest = manager.rest.without_retries().fenced(manager.fence, user_agent=f"{APPLICATION_NAME}-controllers/{instance}")
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

    # Shared by placement and the Shard controller's suspects: a shard in trouble gets no placement at once.
    placement = placement_index(config, shards, databases)
    shard_setup = setup_shards(
        manager,
        config,
        namespace,
        rest,
        shards,
        databases,
        clusters,
        instance=instance,
        outside_pod=outside_pod,
        placement=placement,
        ping_interval=shard_ping_interval,
    )
    events = EventRecorder(rest, instance)
    database_logic = setup_databases(
        manager,
        config,
        namespace,
        rest,
        databases,
        secrets,
        shards,
        events,
        shard_setup,
        outside_pod=outside_pod,
        placement=placement,
    )
    consumer_logic = setup_consumers(manager, rest, consumers, databases)
    move_logic = setup_moves(
        manager,
        namespace,
        rest,
        databases,
        shards,
        policy=shard_setup.policy,
        outside_pod=outside_pod,
        events=events,
        config=config,
        placement=placement,
    )
    setup_drains(
        manager, namespace, rest, shards, databases, move_logic.moves, placement, partial(database_limit, config=config)
    )
    return Controllers(
        shard_setup.controller, database_logic, consumer_logic, move_logic, shard_setup.sessions, events, rest
    )
