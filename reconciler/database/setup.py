"""Wires the Database controller: its lanes, its queue's watches and its worker gauges.

A Database is looked at when it changes (not on the echo of a pass's last write), when its credentials
Secret changes (not on the echo of our own create), and when the Shard it is placed on changes what the
Database depends on; an unplaced one whenever any Shard does (it may fit now).
"""

from __future__ import annotations

from typing import Any

from domain.admin_access import OutsidePod
from domain.conditions import READY, find_condition
from domain.config import InstallConfig
from domain.constants import CREDENTIALS_SECRET_SUFFIX
from domain.objects import ShardState
from domain.resources import BY_SHARD, database_shard
from informers import Informer, Rest, object_key
from reconciler.database.controller import DatabaseController
from reconciler.database.shard_sql import shard_spec
from reconciler.events import EventRecorder
from reconciler.placement_index import PlacementIndex
from reconciler.runtime import Controller, ControllerManager, Lanes, Wakeups
from reconciler.shard.setup import ShardSetup
from reconciler.worker_metrics import DatabaseWorkersCollector


def setup_databases(
    manager: ControllerManager,
    config: InstallConfig,
    namespace: str,
    rest: Rest,
    databases: Informer,
    secrets: Informer,
    shards: Informer,
    events: EventRecorder,
    shard_setup: ShardSetup,
    *,
    outside_pod: OutsidePod,
    placement: PlacementIndex,
) -> DatabaseController:
    """The Database controller on `manager`, on the Shard controller's admin sessions."""
    wakeups = Wakeups()
    logic = DatabaseController(
        rest,
        config,
        namespace,
        databases,
        shards,
        secrets,
        events,
        shard_setup.sessions,
        outside_pod.admin_host,
        policy=shard_setup.policy,
        wakeups=wakeups,
        on_shard_trouble=shard_setup.suspects.suspect,  # a failed statement triggers a shard check
        placement=placement,
        repairs=shard_setup.repairs,
    )
    # A lane per shard: at most workersPerShard passes on one shard's databases (and on placement) at
    # once, workersTotal in all, the lanes taking turns; a hung shard holds only its own lane's workers.
    controller = Controller(
        "database",
        logic.reconcile,
        workers=config.workers_total,
        lanes=Lanes(logic.lane, config.workers_per_shard),
        settled=logic.settled,  # a start looks at 100,000 Ready databases: most need no worker
        wakeups=wakeups,
    )
    manager.metrics.registry.register(
        DatabaseWorkersCollector(
            lambda: controller.queue.lane_stats(),
            shards.keys,
            config.workers_per_shard,
            config.workers_total,
        )
    )
    controller.watch(databases, echo=logic.writes.echoes.echo)  # not the echo of a pass's last write

    def credentials_owner(secret: dict[str, Any]) -> list[str]:
        key = object_key(secret)  # namespace/name
        if not key.endswith(CREDENTIALS_SECRET_SUFFIX) or logic.secrets.own_create(secret):
            return []  # not a credentials Secret, or our own create's echo (secret.py: no pass needed)
        return [key[: -len(CREDENTIALS_SECRET_SUFFIX)]]

    controller.watch(secrets, credentials_owner)

    def on_shard(event_type: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if _shard_inputs(old) == _shard_inputs(new):
            return  # e.g. only databaseCount changed: nothing for the databases
        shard = new if new is not None else old
        assert shard is not None  # an event has an object
        for key in databases.index_keys(BY_SHARD, object_key(shard)):
            controller.enqueue(key)
        for db in databases.list():  # unplaced databases may fit now
            if not database_shard(db):
                controller.enqueue(object_key(db))

    shards.add_handler(on_shard, replay=False)

    def verify_after_failover(shard: str) -> None:  # a shard's timeline changed (reconciler.shard.failover)
        for key in databases.index_keys(BY_SHARD, shard):
            controller.enqueue(key)

    shard_setup.repairs.wake = verify_after_failover
    manager.add_controller(controller)
    return logic


def _shard_inputs(shard: dict[str, Any] | None) -> tuple[Any, ...]:
    """What of a Shard the Database controller depends on: spec (client block...), readiness, budget
    (a larger budget may fit a waiting database). A status that does not validate reads as empty.

    A spec that does not validate counts as itself (raw: it has no model), so fixing or breaking it wakes
    the databases too.
    """
    if shard is None:
        return (None,)
    spec = shard_spec(shard)
    status = ShardState.parse_lenient_status(shard)[0].status
    ready = find_condition(status.conditions, READY)
    readiness = None if ready is None else ready.status
    return (shard.get("spec") if spec is None else spec, readiness, status.connection_budget)
