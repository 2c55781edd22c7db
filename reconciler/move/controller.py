"""The DatabaseMove controller: moves one Database to another shard, online (reconciler.sql.move) or
offline (reconciler.sql.move_offline).

A reconcile is a column of guard clauses:

  fetch -> deleted: undo what the move made (before the cutover), then release the finalizer ->
  finished (Completed, Aborted, Failed): nothing -> finalizer -> abort requested: undo, Aborted ->
  Pending: the request checked (the Database Ready, placed on another shard than the target, the
  target a valid postgres Shard; target `any`: chosen and reserved in the PlacementIndex, or a
  NoCapacity condition and a requeue) -> Preflight: both shards and the database (move_preflight),
  the mode chosen (Auto: Online when nothing stands in its way), an offline copy above the size
  limit refused unless forced -> Copying: online, target prepared, schema copied, publication,
  subscription; offline, target prepared, the source closed, dump and restore -> CatchingUp (online
  only): new tables carried, waiting until every table is copied and the stream's lag is small ->
  CuttingOver: online, the fenced cutover; offline, the target opened -> the Database's status.shard
  switched (the Database controller moves the credentials Secret's host with it) -> Completed.

Each phase is written to status before its SQL runs, and every step is idempotent: a pass after a
restart or a lost Lease re-runs the phase it finds. Conditions carry sanitized error classes only;
the tenant's password goes from the credentials Secret to the SQL and nowhere else.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from domain.config import MovesConfig
from domain.constants import (
    API_VERSION,
    FINALIZER_MOVE,
    KIND_DATABASE_MOVE,
    MOVE_TARGET_ANY,
    Engine,
    MoveConditionType,
    MoveMode,
    MovePhase,
    MoveReason,
    Phase,
)
from domain.credentials import secret_values
from domain.naming import credentials_secret_name
from domain.objects import DatabaseMoveObject, Obj, lenient_status
from domain.resources import DATABASE_MOVES, DATABASES
from domain.specs import ShardSpec, parse_shard
from domain.status import DatabaseStatus
from informers import SECRETS, Informer, Rest
from reconciler.events import EventRecorder
from reconciler.placement_index import PlacementIndex
from reconciler.runtime import ReconcileError, Result, TerminalError, ensure_active, patch_status, write_status
from reconciler.shard.admin import AdminEndpointCache, AdminRefused, AdminSecretInvalid
from reconciler.sql import move, move_offline
from reconciler.sql.errors import SqlFailure, classify
from reconciler.sql.move_preflight import (
    EXTENSION_MISSING,
    available_extensions,
    database_obstacles,
    read_shard,
    shard_obstacles,
    tenant_database,
)
from reconciler.sql.session import AdminSession, Fence, SessionOptions
from reconciler.sql.tenant import TenantSpec, read_state

APPLICATION_NAME = "dbprovider-move"
CATCH_UP_POLL = 2.0  # seconds between looks at the copy and the stream
CUTOVER_LAG = 16 << 20  # bytes of WAL the target may still lack when the fence goes up
CUTOVER_BUDGET = 30.0  # seconds of write pause before a cutover gives the source back
NO_CAPACITY_RETRY = 60.0  # seconds between looks for a target when spec.target is any and none has room
# How a failed step is named in the Ready condition ("copying failed: timeout").
STEP_NAMES = {
    MovePhase.PREFLIGHT: "preflight",
    MovePhase.COPYING: "copying",
    MovePhase.CATCHING_UP: "catching up",
    MovePhase.CUTTING_OVER: "cutover",
}
RUNNING = (MovePhase.COPYING, MovePhase.CATCHING_UP, MovePhase.CUTTING_OVER)
# A move copies the tenant role with the credentials Secret's password: it would cut off the alternate.
ALTERNATE_IN_USE = (
    "hands out its alternate login role, or a rotation's overlap is running: a move carries only the tenant "
    "role; move it after a rotation with an overlap handed out the tenant role again and that overlap ended"
)
ALTERNATE_DURING_MOVE = (
    "a rotation with an overlap handed out the database's alternate login role during the move, which carries "
    "only the tenant role: aborted before the cutover; the source serves as before"
)
FINISHED = (MovePhase.COMPLETED, MovePhase.ABORTED, MovePhase.ROLLED_BACK, MovePhase.FAILED)


class MoveController:
    def __init__(
        self,
        rest: Rest,
        namespace: str,
        moves: Informer,
        databases: Informer,
        shards: Informer,
        admin_endpoints: AdminEndpointCache,
        *,
        pg_dump: Path | None,
        pg_restore: Path | None = None,
        events: EventRecorder | None = None,
        fence: Fence | None = None,
        placement: PlacementIndex | None = None,
        connection_limit: Callable[[Obj], int | None] = lambda _: None,
        offline_max_bytes: int = MovesConfig().offline_max_bytes,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """`pg_dump`, `pg_restore`: the binaries that copy a database (of the target's major); None: not
        installed. `placement`: chooses the target of `target: any` (None: such a move waits);
        `connection_limit`: what a Database commits to a shard's connection budget; `offline_max_bytes`:
        the largest database an offline move copies without spec.force."""
        self.rest = rest
        self.namespace = namespace
        self.moves = moves
        self.databases = databases
        self.shards = shards
        self.admin_endpoints = admin_endpoints
        self.pg_dump = pg_dump
        self.pg_restore = pg_restore
        self.placement = placement
        self.connection_limit = connection_limit
        self.offline_max_bytes = offline_max_bytes
        self.events = events
        self.fence = fence
        self.clock = clock
        self._lock = threading.Lock()
        self._open: set[AdminSession] = set()  # the sessions of the move in progress (to cut them)
        self._severs = 0  # how often sever() ran: an offline copy started before the last one ends

    def sever(self) -> None:
        """Cut the sessions of the move in progress, from any thread: a statement blocked on a shard
        returns now (when the controllers stop or the Lease is lost); the phase is taken up again later."""
        with self._lock:
            sessions = list(self._open)
            self._severs += 1
        for session in sessions:
            session.sever()

    def reconcile(self, key: str) -> Result | None:
        cached = self.moves.get(key)
        if cached is None:
            return None
        try:
            obj = DatabaseMoveObject.parse(cached)
        except ValidationError:  # the CRD schema is generated from the same model
            raise TerminalError("InvalidObject", "the DatabaseMove does not match its schema") from None
        phase = obj.status.phase
        if obj.metadata.deletion_timestamp is not None:
            if FINALIZER_MOVE in obj.metadata.finalizers:
                if phase in RUNNING and not self._undo(obj):
                    self._switch_database(obj)  # the target serves already: the Database must name it
                self._release(obj)
                self._finalizer(obj, add=False)
            return None
        if phase in FINISHED:
            return None
        if FINALIZER_MOVE not in obj.metadata.finalizers:
            self._finalizer(obj, add=True)
            return None  # its event brings the move back
        if phase in (MovePhase.PREFLIGHT, *RUNNING):
            self._hold(obj)
        if obj.spec.abort and (phase not in RUNNING or self._undo(obj)):
            self._finish(obj, MovePhase.ABORTED, MoveReason.ABORTED, "aborted; the source serves as before")
            return None
        if phase in (None, MovePhase.PENDING):
            obj = self._accept(obj)
            if obj.status.phase == MovePhase.PENDING:
                return Result(requeue_after=NO_CAPACITY_RETRY)
        if obj.status.phase == MovePhase.PREFLIGHT:
            obj = self._preflight(obj)
        if obj.status.phase == MovePhase.COPYING and not self._rotated_away(obj):
            obj = self._copy(obj)
        if obj.status.phase == MovePhase.CATCHING_UP and not self._rotated_away(obj):
            obj, wait = self._catch_up(obj)
            if wait is not None:
                return Result(requeue_after=wait)
        if obj.status.phase == MovePhase.CUTTING_OVER and not self._rotated_away(obj):
            return self._cut_over(obj)
        return None

    def _rotated_away(self, obj: DatabaseMoveObject) -> bool:
        """Before each running step: a rotation with an overlap since the preflight ends the move (undone,
        the source serving as before), since the move would hand the target only the tenant role."""
        if not self._alternate_in_use(obj) or not self._undo(obj):
            return False
        self._finish(obj, MovePhase.FAILED, MoveReason.FAILED, ALTERNATE_DURING_MOVE)
        return True

    # -- status ----------------------------------------------------------------------------------

    def _write(self, obj: DatabaseMoveObject) -> DatabaseMoveObject:
        written = write_status(self.rest, DATABASE_MOVES, obj)
        return DatabaseMoveObject.parse(written) if written is not None else obj

    def _phase(self, obj: DatabaseMoveObject, phase: MovePhase, message: str, **fields: Any) -> DatabaseMoveObject:
        """Persist `phase` (before its SQL runs) with Ready=False, InProgress."""
        obj = obj.with_status(phase=phase, observed_generation=obj.metadata.generation, **fields)
        return self._write(obj.with_condition(MoveConditionType.READY, False, MoveReason.IN_PROGRESS, message))

    def _finish(self, obj: DatabaseMoveObject, phase: MovePhase, reason: MoveReason, message: str) -> None:
        done = obj.with_status(phase=phase, completed_at=self.clock(), observed_generation=obj.metadata.generation)
        self._write(done.with_condition(MoveConditionType.READY, phase == MovePhase.COMPLETED, reason, message))
        self._event(obj, f"Move{phase.value}", message, warning=phase == MovePhase.FAILED)
        self._release(obj)

    def _reservation(self, obj: DatabaseMoveObject) -> str:
        """The key of a `target: any` move's reservation in the PlacementIndex (not a Database's key:
        the Database's own events must not end it)."""
        return f"move:{obj.metadata.namespace}/{obj.name}"

    def _release(self, obj: DatabaseMoveObject) -> None:
        """The reservation of a finished (or deleted) move given back: the target counts the Database
        itself once it is switched there."""
        if self.placement is not None and obj.spec.target == MOVE_TARGET_ANY:
            self.placement.release(self._reservation(obj))

    def _event(self, obj: DatabaseMoveObject, reason: str, message: str, *, warning: bool = False) -> None:
        if self.events is None:
            return
        meta = obj.metadata
        involved = {
            "apiVersion": API_VERSION,
            "kind": KIND_DATABASE_MOVE,
            "metadata": {
                "name": meta.name,
                "namespace": meta.namespace,
                "uid": meta.uid,
                "resourceVersion": meta.resource_version,
            },
        }
        self.events.record(involved, reason, message, warning=warning)

    def _fail(self, obj: DatabaseMoveObject, reason: MoveReason, message: str) -> None:
        self._finish(obj, MovePhase.FAILED, reason, message)

    def _finalizer(self, obj: DatabaseMoveObject, *, add: bool) -> None:
        finalizers = [f for f in obj.metadata.finalizers if f != FINALIZER_MOVE] + ([FINALIZER_MOVE] if add else [])
        ensure_active()
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": obj.metadata.resource_version}}
        self.rest.patch(DATABASE_MOVES, obj.name, body, obj.metadata.namespace)

    # -- the request -----------------------------------------------------------------------------

    def _alternate_in_use(self, obj: DatabaseMoveObject) -> bool:
        """A rotation with an overlap handed out the tenant's alternate login role, or its overlap runs: the
        move carries only the tenant role (with the credentials Secret's password)."""
        _, status = self._database(obj)
        return status.login_role is not None or status.retire_login_at is not None

    def _database(self, obj: DatabaseMoveObject) -> tuple[dict[str, Any] | None, DatabaseStatus]:
        db = self.databases.get(f"{obj.metadata.namespace}/{obj.spec.database}")
        return db, lenient_status(DatabaseStatus, db) if db is not None else DatabaseStatus()

    def _shard(self, name: str | None) -> ShardSpec | None:
        shard = self.shards.get(name) if name else None
        if shard is None:
            return None
        try:
            return parse_shard(shard)
        except ValidationError:
            return None

    def _accept(self, obj: DatabaseMoveObject) -> DatabaseMoveObject:
        """Pending: what the request names must exist and fit; the two shards are recorded."""
        db, status = self._database(obj)
        problem = None
        if db is None:
            problem = f"no Database {obj.spec.database} in this namespace"
        elif status.phase != Phase.READY or not status.shard or not status.tenant_name:
            problem = f"Database {obj.spec.database} is not Ready"
        elif (first := self._earlier_move(obj)) is not None:
            problem = f"DatabaseMove {first} of the same Database came first and has not finished"
        elif status.shard == obj.spec.target:
            problem = f"Database {obj.spec.database} is on shard {obj.spec.target} already"
        elif self._alternate_in_use(obj):
            problem = f"Database {obj.spec.database} {ALTERNATE_IN_USE}"
        name = obj.spec.target
        if problem is None and name == MOVE_TARGET_ANY:
            assert db is not None
            chosen = self._choose_target(obj, db, status.shard)
            if chosen is None:
                return self._no_capacity(obj)
            name = chosen
        target = self._shard(name)
        if problem is None and (target is None or target.engine != Engine.POSTGRES):
            problem = f"no valid postgres Shard {name}"
        elif problem is None and target is not None and target.client.pooler is not None:
            problem = f"shard {name} gives new databases to a pooler by template: not a move target"
        if problem is not None:
            self._fail(obj, MoveReason.FAILED, problem)
            return obj.with_status(phase=MovePhase.FAILED)
        try:
            return self._phase(
                obj,
                MovePhase.PREFLIGHT,
                "checking both shards and the database",
                source_shard=status.shard,
                target_shard=name,
            )
        except ApiException:
            self._release(obj)  # the choice was not recorded: the next pass chooses again
            raise

    def _choose_target(self, obj: DatabaseMoveObject, db: Obj, source: str | None) -> str | None:
        """`target: any`: the shard placement would give the Database now, never its own, reserved there
        (its slot and its connection limit) until the move finishes."""
        if self.placement is None:
            return None
        limit = self.connection_limit(db)
        return self.placement.reserve(Engine.POSTGRES, self._reservation(obj), limit, exclude=source)

    def _hold(self, obj: DatabaseMoveObject) -> None:
        """The reservation of a `target: any` move under way counts again after a restart."""
        if self.placement is None or obj.spec.target != MOVE_TARGET_ANY or obj.status.target_shard is None:
            return
        db, _ = self._database(obj)
        limit = self.connection_limit(db) if db is not None else None
        self.placement.hold(self._reservation(obj), obj.status.target_shard, limit)

    def _no_capacity(self, obj: DatabaseMoveObject) -> DatabaseMoveObject:
        message = (
            "no other accepting, ready postgres shard below maxDatabases with room for the database's "
            f"connections; looking again every {NO_CAPACITY_RETRY:.0f} s"
        )
        pending = obj.with_status(phase=MovePhase.PENDING, observed_generation=obj.metadata.generation)
        return self._write(pending.with_condition(MoveConditionType.READY, False, MoveReason.NO_CAPACITY, message))

    def _earlier_move(self, obj: DatabaseMoveObject) -> str | None:
        """An unfinished move of the same Database created before this one (one move at a time: they
        would share the tenant's publication, slot and subscription)."""
        mine = (obj.metadata.creation_timestamp or "", obj.name)
        for other in self.moves.list():
            meta, spec = other.get("metadata") or {}, other.get("spec") or {}
            phase = (other.get("status") or {}).get("phase")
            theirs = (meta.get("creationTimestamp") or "", meta.get("name", ""))
            if (
                meta.get("namespace") == obj.metadata.namespace
                and spec.get("database") == obj.spec.database
                and phase not in FINISHED
                and meta.get("deletionTimestamp") is None
                and theirs < mine
            ):
                return str(meta.get("name"))
        return None

    # -- SQL -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _sessions(self, obj: DatabaseMoveObject) -> Iterator[tuple[psycopg.Connection, psycopg.Connection]]:
        """Admin sessions to the source and the target shard; failures as ReconcileError (retried)."""
        names = (obj.status.source_shard, obj.status.target_shard)
        endpoints = []
        for name in names:
            spec = self._shard(name)
            if spec is None or name is None:
                raise ReconcileError("ShardNotFound", f"no valid Shard {name}")
            try:
                endpoints.append(self.admin_endpoints.get(name, spec))
            except (AdminRefused, AdminSecretInvalid, ApiException):
                raise ReconcileError("AdminUnavailable", f"the admin Secret of shard {name} cannot be used") from None
        # The admin sessions' statement_timeout bounds every statement (a slot waiting for a long tenant
        # transaction, too): a step cut by it is tried again later, and a stopping manager waits no longer.
        options: SessionOptions = {"application_name": APPLICATION_NAME}
        if self.fence is not None:
            options["fence"] = self.fence  # every statement asks first: a replica without the Lease sends none
        try:
            with (
                AdminSession.for_endpoint(endpoints[0], **options) as source,
                AdminSession.for_endpoint(endpoints[1], **options) as target,
            ):
                with self._lock:
                    self._open.update((source, target))
                try:
                    yield source.connection(), target.connection()
                finally:
                    with self._lock:
                        self._open.difference_update((source, target))
        except SqlFailure as failure:
            self._note(obj, failure)
            raise ReconcileError("MoveStepFailed", str(failure)) from None
        except psycopg.Error as exc:
            classified = classify(exc, STEP_NAMES.get(obj.status.phase or MovePhase.PENDING, "move"))
            self._note(obj, classified)
            raise ReconcileError("MoveStepFailed", str(classified)) from None

    def _note(self, obj: DatabaseMoveObject, failure: SqlFailure) -> None:
        """A failed step, in the Ready condition (the phase stays: the step is tried again)."""
        with contextlib.suppress(ApiException):
            self._write(obj.with_condition(MoveConditionType.READY, False, MoveReason.IN_PROGRESS, str(failure)))

    def _plan(self, obj: DatabaseMoveObject, source: psycopg.Connection) -> move.MovePlan:
        """The tenant as it is on the source (name, connection limit, ownership record), its password
        from the credentials Secret, and the source as the target's server reaches it (its client endpoint)."""
        _, status = self._database(obj)
        source_spec = self._shard(obj.status.source_shard)
        if status.tenant_name is None or source_spec is None:
            raise ReconcileError("DatabaseNotReady", f"Database {obj.spec.database} has no tenant on its shard")
        secret = self.rest.get(SECRETS, credentials_secret_name(obj.spec.database), obj.metadata.namespace)
        state = read_state(source, status.tenant_name)
        tenant = TenantSpec(
            status.tenant_name,
            secret_values(secret)["password"],
            state.connection_limit if state.connection_limit is not None else -1,
            owner=state.owner,
        )
        client = source_spec.client
        return move.MovePlan(tenant, client.host, client.port, sslmode=client.sslmode.value)

    def _preflight(self, obj: DatabaseMoveObject) -> DatabaseMoveObject:
        _, status = self._database(obj)
        assert status.tenant_name is not None
        with self._sessions(obj) as (source, target):
            facts = read_shard(source), read_shard(target)
            online = [f"shard {obj.status.source_shard}: {o.message}" for o in shard_obstacles(facts[0])]
            online += [f"shard {obj.status.target_shard}: {o.message}" for o in shard_obstacles(facts[1])]
            extensions = available_extensions(target)
            with tenant_database(source, status.tenant_name) as inside:
                inside_found = database_obstacles(inside, extensions)
            size = move_offline.database_size(source, status.tenant_name)
        online += [f"database: {o.message}" for o in inside_found]
        mode = obj.spec.mode
        if mode == MoveMode.AUTO:
            mode = MoveMode.OFFLINE if online else MoveMode.ONLINE
        if mode == MoveMode.ONLINE:
            found = online
        else:
            found = [f"database: {o.message}" for o in inside_found if o.code == EXTENSION_MISSING]
            found += self._offline_size(obj, size)
            if self.pg_dump is not None and self.pg_restore is not None:
                binaries = (self.pg_dump, self.pg_restore)
                unfit = move_offline.binaries_obstacle(binaries, facts[0].major, facts[1].major)
                found += [unfit] if unfit is not None else []
            if found and online and obj.spec.mode == MoveMode.AUTO:
                found.insert(0, f"online not possible ({'; '.join(online)}), so offline")
        if found:
            self._fail(obj, MoveReason.PREFLIGHT_FAILED, "; ".join(found))
            return obj.with_status(phase=MovePhase.FAILED)
        missing = [
            binary
            for binary, path in (("pg_dump", self.pg_dump), ("pg_restore", self.pg_restore))
            if path is None and (binary == "pg_dump" or mode == MoveMode.OFFLINE)
        ]
        if missing:
            self._fail(obj, MoveReason.FAILED, f"{' and '.join(missing)} not installed where the manager runs")
            return obj.with_status(phase=MovePhase.FAILED)
        how = "online" if mode == MoveMode.ONLINE else "offline: writes pause until the copy is opened on the target"
        self._event(
            obj,
            "MoveStarted",
            f"moving from shard {obj.status.source_shard} to shard {obj.status.target_shard} {how}",
        )
        message = "copying the schema and the data" if mode == MoveMode.ONLINE else "copying the closed database"
        return self._phase(obj, MovePhase.COPYING, message, started_at=self.clock(), mode=mode)

    def _offline_size(self, obj: DatabaseMoveObject, size: int) -> list[str]:
        """The refusal of an offline copy above the limit (writes would pause for the whole copy)."""
        if obj.spec.force or size <= self.offline_max_bytes:
            return []
        return [
            f"the database is {size / 2**20:.0f} MiB, above the offline move limit of "
            f"{self.offline_max_bytes / 2**20:.0f} MiB (moves.offlineMaxSize): its writes would pause for the "
            "whole copy; set spec.force: true to move it offline anyway"
        ]

    def _copy(self, obj: DatabaseMoveObject) -> DatabaseMoveObject:
        assert self.pg_dump is not None
        if obj.status.mode == MoveMode.OFFLINE:
            return self._copy_offline(obj)
        with self._sessions(obj) as (source, target):
            plan = self._plan(obj, source)
            move.prepare_target(target, plan.tenant)
            move.copy_schema(source, target, plan, self.pg_dump)
            move.publish(source, plan.name)
            move.subscribe(source, target, plan)
        return self._phase(obj, MovePhase.CATCHING_UP, "copying the data")

    def _copy_offline(self, obj: DatabaseMoveObject) -> DatabaseMoveObject:
        """The source closed (writes pause from here), then copied to the target once."""
        assert self.pg_dump is not None and self.pg_restore is not None
        with self._lock:
            severs = self._severs
        with self._sessions(obj) as (source, target):
            plan = self._plan(obj, source)
            move.prepare_target(target, plan.tenant)
            move_offline.close_source(source, plan.name)
            move_offline.copy_database(
                source, target, plan, self.pg_dump, self.pg_restore, cancelled=lambda: self._severs != severs
            )
        return self._phase(obj, MovePhase.CUTTING_OVER, "opening the copy on the target")

    def _catch_up(self, obj: DatabaseMoveObject) -> tuple[DatabaseMoveObject, float | None]:
        assert self.pg_dump is not None
        with self._sessions(obj) as (source, target):
            plan = self._plan(obj, source)
            move.copy_new_tables(source, target, plan, self.pg_dump)
            now = move.progress(source, target, plan)
        if now.copied and now.lag_bytes is not None and now.lag_bytes < CUTOVER_LAG:
            return self._phase(obj, MovePhase.CUTTING_OVER, "cutting over: writes pause"), None
        message = f"copying the data: {now.ready} of {now.tables} tables copied, {now.lag_bytes or 0} bytes behind"
        if now.errors:
            message += f"; the stream met {now.errors} error(s) (a table changed on the source?)"
        obj = self._write(obj.with_condition(MoveConditionType.READY, False, MoveReason.IN_PROGRESS, message))
        return obj, CATCH_UP_POLL

    def _cut_over(self, obj: DatabaseMoveObject) -> Result | None:
        with self._sessions(obj) as (source, target):
            plan = self._plan(obj, source)
            if obj.status.mode == MoveMode.OFFLINE:
                move_offline.open_offline(source, target, plan)
                started = obj.status.started_at
                pause = max((self.clock() - started).total_seconds(), 0.0) if started is not None else 0.0
            else:
                try:
                    pause = move.cutover(source, target, plan, budget=CUTOVER_BUDGET)
                except move.CutoverTimedOut:
                    message = "the cutover did not finish in time; the source serves again"
                    self._phase(obj, MovePhase.CATCHING_UP, message)
                    return Result(requeue_after=CATCH_UP_POLL)
        if obj.status.write_pause_seconds is None or pause > 0:
            obj = self._write(obj.with_status(write_pause_seconds=round(pause, 3)))
        self._switch_database(obj)
        self._finish(
            obj,
            MovePhase.COMPLETED,
            MoveReason.COMPLETED,
            f"moved from shard {obj.status.source_shard} to shard {obj.status.target_shard}; writes paused "
            f"{obj.status.write_pause_seconds or 0:.1f} s",
        )
        return None

    def _switch_database(self, obj: DatabaseMoveObject) -> None:
        """The Database's status.shard names the target (conditional on the version read)."""
        db = self.rest.get(DATABASES, obj.spec.database, obj.metadata.namespace)
        if (db.get("status") or {}).get("shard") == obj.status.target_shard:
            return
        patch_status(
            self.rest,
            DATABASES,
            obj.spec.database,
            {"shard": obj.status.target_shard},
            namespace=obj.metadata.namespace,
            resource_version=db["metadata"]["resourceVersion"],
        )

    def _undo(self, obj: DatabaseMoveObject) -> bool:
        """Abort before the cutover: True when undone; False when the target serves already (the
        move is then finished instead)."""
        with self._sessions(obj) as (source, target):
            plan = self._plan(obj, source)
            if read_state(target, plan.name).tenant_can_connect:
                return False
            move.abort(source, target, plan)
        return True
