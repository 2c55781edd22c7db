"""Drains a Shard whose spec.drain is true: its databases are moved off with DatabaseMove objects.

A reconcile of one Shard (leader only) is level-triggered from the caches:

  the DatabaseMoves this drain made (label db.bnerd.com/drain=<shard>): each unfinished one holds its
  target in the PlacementIndex (taken up again after a restart), each finished one gives it back ->
  drain false: no new move (the running ones finish), the Draining condition says Stopped -> the
  shard's databases without a move, by name, while fewer than drainMoves of the drain's moves run: a
  target reserved in the PlacementIndex like a new placement (never the draining shard: placement
  leaves it out; never a shard with a pooler, which a move refuses), then a DatabaseMove to it -> the
  Draining condition with the counts.

A move is named after its database, the drained shard and the database's uid (`move_name`): a pass
after a restart, or on a cache that does not show the last create yet, finds it (or is refused by
the apiserver) and never starts a second one. A database whose move failed keeps that DatabaseMove
and is not moved again until it is deleted; databases being deleted are not moved.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from domain.conditions import find_condition, get_condition
from domain.constants import (
    ANNOTATION_DELETE_REQUESTED_AT,
    API_VERSION,
    KIND_DATABASE_MOVE,
    LABEL_DRAIN,
    DrainReason,
    Engine,
    MovePhase,
    Phase,
    ShardConditionType,
)
from domain.objects import Obj, ShardState
from domain.resources import BY_SHARD, DATABASE_MOVES, SHARDS
from domain.specs import parse_shard
from informers import Informer, Rest
from reconciler.placement_index import PlacementIndex
from reconciler.runtime import Result, ensure_active, write_status

NO_CAPACITY_RECHECK = 30.0  # seconds: look for a target again (another shard's room frees no event here)
FINISHED = {MovePhase.COMPLETED, MovePhase.ABORTED, MovePhase.ROLLED_BACK, MovePhase.FAILED}
NAMES_SHOWN = 3  # failed databases named in the condition's message


def move_name(database: str, shard: str, uid: str) -> str:
    """The DatabaseMove that drains `database` (of that uid) off `shard`: the same on every pass."""
    digest = hashlib.sha256(f"{shard}/{uid}".encode()).hexdigest()[:8]
    return f"{database[: 253 - 15]}-drain-{digest}"


def reservation_key(namespace: str, move: str) -> str:
    """A move's key in the PlacementIndex (never a Database's key, which the index releases by itself)."""
    return f"move:{namespace}/{move}"


def being_deleted(database: Mapping[str, Any]) -> bool:
    meta, status = database.get("metadata") or {}, database.get("status") or {}
    return (
        meta.get("deletionTimestamp") is not None
        or ANNOTATION_DELETE_REQUESTED_AT in (meta.get("annotations") or {})
        or status.get("phase") in (Phase.DELETING, Phase.DELETED)
    )


def move_phase(move: Mapping[str, Any]) -> str | None:
    phase = (move.get("status") or {}).get("phase")
    return phase if isinstance(phase, str) else None


@dataclass
class Tally:
    """Where a drain stands: what the Draining condition reports."""

    moved: int = 0  # the drain's moves that completed
    moving: int = 0  # the drain's moves not finished
    waiting: int = 0  # databases still to move (no target yet, or not Ready)
    deleting: int = 0  # databases being deleted: never moved, gone once dropped
    failed: list[str] = field(default_factory=list)  # databases whose move failed (not moved again)
    no_capacity: bool = False

    @property
    def left(self) -> int:
        return self.moving + self.waiting + self.deleting + len(self.failed)

    def message(self) -> str:
        parts = [f"{self.moving} moving", f"{self.waiting} waiting"]
        if self.failed:
            shown = ", ".join(sorted(self.failed)[:NAMES_SHOWN]) + (", ..." if len(self.failed) > NAMES_SHOWN else "")
            parts.append(f"{len(self.failed)} failed ({shown}; delete its DatabaseMove to try again)")
        if self.deleting:
            parts.append(f"{self.deleting} being deleted")
        text = f"{self.left} database(s) left: " + ", ".join(parts) + f"; {self.moved} moved"
        if self.no_capacity:
            text += "; no other shard has room for the next one (maxDatabases or connection budget)"
        return text


class DrainController:
    def __init__(
        self,
        rest: Rest,
        namespace: str,
        shards: Informer,
        databases: Informer,
        moves: Informer,
        placement: PlacementIndex,
        database_limit: Callable[[Obj], int | None],
    ) -> None:
        """`database_limit`: the CONNECTION LIMIT a Database commits (what its target must fit)."""
        self.rest = rest
        self.namespace = namespace
        self.shards = shards
        self.databases = databases
        self.moves = moves
        self.placement = placement
        self.database_limit = database_limit

    # -- keys ------------------------------------------------------------------------------------

    def shards_of_move(self, move: Obj) -> list[str]:
        """The drained shard a DatabaseMove belongs to (by its label)."""
        shard = ((move.get("metadata") or {}).get("labels") or {}).get(LABEL_DRAIN)
        return [shard] if isinstance(shard, str) else []

    def shards_to_look_at(self, shard: Obj) -> list[str]:
        """A Shard itself, and the drains waiting for room: any Shard's change may have made some."""
        name = (shard.get("metadata") or {}).get("name")
        waiting = [
            str(other["metadata"]["name"])
            for other in self.shards.list()
            if (condition := get_condition((other.get("status") or {}).get("conditions"), ShardConditionType.DRAINING))
            and condition.get("reason") == DrainReason.NO_CAPACITY
        ]
        return ([name] if isinstance(name, str) else []) + [w for w in waiting if w != name]

    def draining_shards_of(self, database: Obj) -> list[str]:
        """The shard a Database is placed on, when that shard drains (other shards have nothing to do)."""
        shard = (database.get("status") or {}).get("shard")
        if not isinstance(shard, str):
            return []
        cached = self.shards.get(shard)
        return [shard] if cached is not None and (cached.get("spec") or {}).get("drain") is True else []

    # -- reconcile -------------------------------------------------------------------------------

    def reconcile(self, name: str) -> Result | None:
        mine = self._moves_of(name)
        tally = self._hold_targets(mine)
        cached = self.shards.get(name)
        if cached is None:
            return None
        try:
            spec = parse_shard(cached)
        except ValidationError:
            return None  # the Shard controller reports it
        shard, _ = ShardState.parse_lenient_status(cached)
        if not spec.drain:
            if find_condition(shard.status.conditions, ShardConditionType.DRAINING) is not None:
                message = f"drain stopped: no new move; {tally.moving} still running (they finish); {tally.moved} moved"
                self._report(shard, False, DrainReason.STOPPED, message)
            return None
        by_database = {(m.get("spec") or {}).get("database"): m for m in mine}
        others = self._moving_elsewhere()
        candidates = []
        for db in sorted(self.databases.by_index(BY_SHARD, name), key=lambda d: d["metadata"]["name"]):
            db_name = db["metadata"]["name"]
            move = by_database.get(db_name)
            phase = move_phase(move) if move is not None else None
            if being_deleted(db):
                tally.deleting += 1
            elif move is not None and phase == MovePhase.COMPLETED:
                pass  # the cache does not show the database on its target yet: counted as moved
            elif move is not None and phase in FINISHED:
                tally.failed.append(db_name)
            elif move is not None:
                pass  # counted as moving
            elif db_name in others or (db.get("status") or {}).get("phase") != Phase.READY:
                tally.waiting += 1  # a move of someone else's runs, or the database is not Ready (yet)
            else:
                candidates.append(db)
        if spec.engine != Engine.POSTGRES:
            tally.waiting += len(candidates)
            self._report(
                shard, True, DrainReason.MOVES_FAILED, f"{spec.engine} databases are not moved; " + tally.message()
            )
            return None
        for db in candidates:
            if tally.moving >= spec.drain_moves or tally.no_capacity:
                tally.waiting += 1
            elif self._start(name, spec.engine, db):
                tally.moving += 1
            else:
                tally.no_capacity = True
                tally.waiting += 1
        if tally.left == 0:
            self._report(shard, False, DrainReason.DRAINED, f"no database left on the shard; {tally.moved} moved")
        elif tally.no_capacity:
            self._report(shard, True, DrainReason.NO_CAPACITY, tally.message())
            return Result(requeue_after=NO_CAPACITY_RECHECK)
        elif tally.moving == 0 and tally.failed and tally.waiting == 0:
            self._report(shard, True, DrainReason.MOVES_FAILED, tally.message())
        else:
            self._report(shard, True, DrainReason.MOVING, tally.message())
        return None

    # -- the moves -------------------------------------------------------------------------------

    def _moves_of(self, shard: str) -> list[Obj]:
        return [
            m
            for m in self.moves.list()
            if (m.get("metadata") or {}).get("namespace") == self.namespace and self.shards_of_move(m) == [shard]
        ]

    def _moving_elsewhere(self) -> set[str]:
        """Databases with an unfinished DatabaseMove not made by a drain (one move at a time per database)."""
        return {
            (m.get("spec") or {}).get("database", "")
            for m in self.moves.list()
            if (m.get("metadata") or {}).get("namespace") == self.namespace
            and not self.shards_of_move(m)
            and move_phase(m) not in FINISHED
        }

    def _hold_targets(self, moves: Sequence[Obj]) -> Tally:
        """Each unfinished move keeps its target reserved; a finished one gives it back. The counts.

        A completed move gives it back only once the cache shows the database on the target (or gone):
        the DatabaseMove and the Database are watched apart, and until then nothing else counts it there.
        """
        tally = Tally()
        for move in moves:
            meta, spec = move.get("metadata") or {}, move.get("spec") or {}
            key = reservation_key(self.namespace, meta.get("name", ""))
            phase = move_phase(move)
            db = self.databases.get(f"{self.namespace}/{spec.get('database')}")
            target = (move.get("status") or {}).get("targetShard") or spec.get("target")
            arrived = db is None or (db.get("status") or {}).get("shard") == target
            if phase == MovePhase.COMPLETED:
                tally.moved += 1
            elif phase not in FINISHED:
                tally.moving += 1
            if (phase in FINISHED and (phase != MovePhase.COMPLETED or arrived)) or meta.get("deletionTimestamp"):
                self.placement.release(key)
            elif isinstance(target, str):
                self.placement.hold(key, target, self.database_limit(db) if db is not None else None)
        return tally

    def _start(self, shard: str, engine: str, db: Obj) -> bool:
        """Reserve a target for `db` and create its DatabaseMove; False when no shard has room."""
        meta = db["metadata"]
        name = move_name(meta["name"], shard, meta.get("uid", ""))
        key = reservation_key(self.namespace, name)
        target = self.placement.reserve(engine, key, self.database_limit(db), for_move=True)
        if target is None:
            return False
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND_DATABASE_MOVE,
            "metadata": {"name": name, "namespace": self.namespace, "labels": {LABEL_DRAIN: shard}},
            "spec": {"database": meta["name"], "target": target},
        }
        try:
            ensure_active()
            self.rest.create(DATABASE_MOVES, body, self.namespace)
        except ApiException as exc:
            # Refused: nothing counts on the target. Already there (a create the cache does not show
            # yet): its own target is held when the cache shows it.
            self.placement.release(key)
            if exc.status != 409:
                raise
        return True

    def _report(self, shard: ShardState, status: bool, reason: DrainReason, message: str) -> None:
        write_status(self.rest, SHARDS, shard.with_condition(ShardConditionType.DRAINING, status, reason, message))
