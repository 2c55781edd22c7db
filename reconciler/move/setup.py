"""Wires the DatabaseMove controller: a pass when a DatabaseMove changes, and while one runs, its own
requeues (the copy and the stream are looked at every few seconds).

Two workers: at most two moves run at the same time, each holding two admin sessions of its own (not
the Database workers'). A move copies with the client tools of the target shard's major, found as
reconciler.move.tools says (DBPROVIDER_PG_TOOLS, DBPROVIDER_PG_DUMP, DBPROVIDER_PG_RESTORE, PATH);
without them it fails its preflight with a message saying so.
"""

from __future__ import annotations

from functools import partial

from domain.admin_access import OutsidePod
from domain.config import InstallConfig
from domain.connection_budget import database_limit
from domain.resources import DATABASE_MOVES
from informers import Informer, Rest
from reconciler.events import EventRecorder
from reconciler.move.controller import MoveController
from reconciler.move.metrics import MoveCollector, MoveMetrics
from reconciler.move.tools import ClientTools
from reconciler.placement_index import PlacementIndex
from reconciler.runtime import Controller, ControllerManager
from reconciler.shard.admin import AdminEndpointCache, AdminPolicy

MOVE_WORKERS = 2  # moves of different Databases at the same time (one waiting on a shard holds up only itself)


def setup_moves(
    manager: ControllerManager,
    namespace: str,
    rest: Rest,
    databases: Informer,
    shards: Informer,
    *,
    policy: AdminPolicy,
    outside_pod: OutsidePod,
    events: EventRecorder,
    config: InstallConfig,
    placement: PlacementIndex,
) -> MoveController:
    """The DatabaseMove controller on `manager` (leader only, like every controller there)."""
    moves = manager.informers.informer(DATABASE_MOVES, namespace)
    # A DatabaseMove CRD not installed yet (the CRDs of an upgrade applied late) must not keep the replica
    # from starting: moves wait for it, everything else runs.
    manager.informers.mark_optional(moves)
    logic = MoveController(
        rest,
        namespace,
        moves,
        databases,
        shards,
        AdminEndpointCache(rest, policy, outside_pod.admin_host),
        tools=ClientTools.from_environment(),
        events=events,
        fence=manager.fence,
        placement=placement,
        connection_limit=partial(database_limit, config=config),
        offline_max_bytes=config.moves.offline_max_bytes,
        rollback_window=config.moves.rollback_window,
        metrics=MoveMetrics(manager.metrics.registry),
    )

    def shard_names() -> list[str]:
        return [str(shard["metadata"]["name"]) for shard in shards.list()]

    manager.metrics.registry.register(MoveCollector(moves.list, shard_names))
    # A lost Lease (or shutdown) cuts the move's sessions: a statement blocked on a shard returns now.
    manager.when_controllers_stopping(logic.sever)
    controller = Controller("move", logic.reconcile, workers=MOVE_WORKERS)
    controller.watch(moves)
    controller.watch(databases, logic.moves_of)  # streams follow a rotation; a deletion ends the streams back
    controller.watch(shards, logic.moves_from)  # a deleted source Shard ends its moves' windows
    manager.add_controller(controller)
    return logic
