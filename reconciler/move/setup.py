"""Wires the DatabaseMove controller: a pass when a DatabaseMove changes, and while one runs, its own
requeues (the copy and the stream are looked at every few seconds).

Two workers: at most two moves run at the same time, each holding two admin sessions of its own (not
the Database workers'). The schema is copied by `pg_dump`: the binary named by DBPROVIDER_PG_DUMP, else the one
on PATH; without one, a move fails its preflight with a message saying so.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from domain.admin_access import OutsidePod
from domain.resources import DATABASE_MOVES
from informers import Informer, Rest
from reconciler.events import EventRecorder
from reconciler.move.controller import MoveController
from reconciler.runtime import Controller, ControllerManager
from reconciler.shard.admin import AdminEndpointCache, AdminPolicy

PG_DUMP_VARIABLE = "DBPROVIDER_PG_DUMP"
MOVE_WORKERS = 2  # moves of different Databases at the same time (one waiting on a shard holds up only itself)


def find_pg_dump() -> Path | None:
    named = os.environ.get(PG_DUMP_VARIABLE) or shutil.which("pg_dump")
    return Path(named) if named else None


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
        pg_dump=find_pg_dump(),
        events=events,
        fence=manager.fence,
    )
    # A lost Lease (or shutdown) cuts the move's sessions: a statement blocked on a shard returns now.
    manager.when_controllers_stopping(logic.sever)
    controller = Controller("move", logic.reconcile, workers=MOVE_WORKERS)
    controller.watch(moves)
    manager.add_controller(controller)
    return logic
