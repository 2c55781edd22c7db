"""Wires the drain controller: a pass for a Shard when it changes, when one of its drain's DatabaseMoves
changes, and when a Database on it changes while it drains."""

from __future__ import annotations

from collections.abc import Callable

from domain.objects import Obj
from informers import Informer, Rest
from reconciler.drain.controller import DrainController
from reconciler.placement_index import PlacementIndex
from reconciler.runtime import Controller, ControllerManager


def setup_drains(
    manager: ControllerManager,
    namespace: str,
    rest: Rest,
    shards: Informer,
    databases: Informer,
    moves: Informer,
    placement: PlacementIndex,
    database_limit: Callable[[Obj], int | None],
) -> DrainController:
    """The drain controller on `manager` (leader only, like every controller there)."""
    logic = DrainController(rest, namespace, shards, databases, moves, placement, database_limit)
    controller = Controller("drain", logic.reconcile)
    controller.watch(shards, logic.shards_to_look_at)
    controller.watch(moves, logic.shards_of_move)
    controller.watch(databases, logic.draining_shards_of)
    manager.add_controller(controller)
    return logic
