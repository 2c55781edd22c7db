"""Wires the Shard controller: its admin sessions (shared with the Database workers), its queue and watches.

A Shard is checked when it changes, when its Keldon DatabaseCluster changes, when its databaseCount
changes (paced: reconciler.counts), and when a Database worker's SQL on it fails or hangs (`ShardSuspects`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from pydantic import ValidationError

from domain.admin_access import OutsidePod
from domain.config import InstallConfig
from domain.connection_budget import database_limit
from domain.resources import database_shard
from domain.specs import ShardSpec, parse_shard
from informers import Informer, Rest, object_key, split_key
from reconciler.counts import coalesced_counts
from reconciler.placement_index import PlacementIndex
from reconciler.runtime import Controller, ControllerManager, Wakeups
from reconciler.shard.admin import AdminPolicy, AdminSessions
from reconciler.shard.budget import ShardBudgets
from reconciler.shard.client_logins import waits_on_client_login
from reconciler.shard.controller import PING_INTERVAL, ShardController
from reconciler.shard.deletion import ShardDeletion
from reconciler.shard.failover import TimelineRepairs
from reconciler.shard.suspects import ShardSuspects
from reconciler.sql.session import APPLICATION_NAME

SHARD_WORKERS = 4


def replica_application_name(instance: str) -> str:
    """`dbprovider/<replica>`: which replica sent a statement shows in the shard's activity and logs."""
    return f"{APPLICATION_NAME}/{instance}"[:63]  # PostgreSQL keeps at most 63 bytes


@dataclass(frozen=True)
class ShardSetup:
    """The Shard controller and what the Database controller shares with it."""

    controller: ShardController
    sessions: AdminSessions  # the admin sessions of every controller
    suspects: ShardSuspects  # where a Database worker reports a shard in trouble
    repairs: TimelineRepairs  # which Ready Databases to verify after a shard's timeline changed
    policy: AdminPolicy  # where admin credentials may be sent


def setup_shards(
    manager: ControllerManager,
    config: InstallConfig,
    namespace: str,
    rest: Rest,
    shards: Informer,
    databases: Informer,
    clusters: Informer | None,
    *,
    instance: str,
    outside_pod: OutsidePod,
    placement: PlacementIndex,
    ping_interval: float = PING_INTERVAL,
) -> ShardSetup:
    """The Shard controller on `manager`, with the admin sessions every controller uses."""
    wakeups = Wakeups()
    suspects = ShardSuspects(wakeups, placement)
    repairs = TimelineRepairs()
    # SQL hanging on a shard: check it now.
    sessions = AdminSessions(
        fence=manager.fence, application_name=replica_application_name(instance), on_slow=suspects.suspect
    )
    policy = AdminPolicy.from_config(config, outside_pod.ca_file)
    # A lost Lease (or shutdown) cuts every shard session at once, then closes them once the workers are done.
    manager.when_controllers_stopping(sessions.sever_all)
    manager.after_controllers_stop(sessions.close_all)

    logic = ShardController(
        rest,
        shards,
        databases,
        clusters,
        sessions,
        outside_pod.admin_host,
        ping_interval=ping_interval,
        policy=policy,
        budgets=ShardBudgets(config, databases, config.workers_per_shard),
        deletion=ShardDeletion(rest, databases, namespace, config.deletion_protection.enabled),
        suspects=suspects,
        wakeups=wakeups,
        repairs=repairs,
        remember_drops=config.soft_delete.remember_drops,
    )
    # Several workers: each checks a different shard, so a dead shard's timeout delays no other.
    controller = Controller("shard", logic.reconcile, workers=SHARD_WORKERS, wakeups=wakeups)
    controller.watch(shards, echo=logic.echoes.echo)  # not the echo of its own status write

    # A Shard counts its databases, what their connection limits commit (reconciler.shard.budget) and
    # which of them wait on a failed login at the client endpoint (reconciler.shard.client_logins).
    def counted(database: dict[str, Any]) -> object:
        return database_limit(database, config=config), waits_on_client_login(database)

    databases.add_handler(coalesced_counts(controller, database_shard, counted), replay=False)
    if clusters is not None:
        controller.watch(clusters, partial(_shards_of_cluster, shards))
    manager.add_controller(controller)
    return ShardSetup(logic, sessions, suspects, repairs, policy)


def _shards_of_cluster(shards: Informer, cluster: dict[str, Any]) -> list[str]:
    """The Shards whose spec names this Keldon DatabaseCluster."""
    ref = split_key(object_key(cluster))  # (namespace, name) of the Keldon DatabaseCluster
    return [
        object_key(s)
        for s in shards.list()
        if (spec := _typed_spec(s)) is not None
        and spec.keldon_cluster is not None
        and (spec.keldon_cluster.namespace, spec.keldon_cluster.name) == ref
    ]


def _typed_spec(shard: dict[str, Any]) -> ShardSpec | None:
    try:
        return parse_shard(shard)
    except ValidationError:
        return None
