"""The DatabaseMove controller: moves one Database to another shard, online (reconciler.sql.move) or
offline (reconciler.sql.move_offline).

A reconcile is a column of guard clauses:

  fetch -> deleted: undo what the move made (before the cutover), then release the finalizer ->
  finished (Completed, Aborted, Failed): nothing -> finalizer -> abort requested: undo, Aborted ->
  Pending: the request checked (the Database Ready, placed on another shard than the target, no
  rotation's overlap running (else a requeue at its end), the target a valid postgres Shard; target
  `any`: chosen and reserved in the PlacementIndex, or a NoCapacity condition and a requeue) ->
  Preflight: both shards and the database (move_preflight), the mode chosen (Auto: Online when
  nothing stands in its way), an offline copy above the size limit refused unless forced ->
  Copying: online, target prepared, schema copied, publication,
  subscription; offline, target prepared, the source closed, dump and restore -> CatchingUp (online
  only): new tables carried, waiting until every table is copied and the stream's lag is small ->
  CuttingOver: online, the fenced cutover (which leaves a stream back to the source); offline, the
  target opened -> the Database's status.shard switched (the Database controller moves the credentials
  Secret's host with it) -> Completed, the source's copy kept until status.rollbackUntil (the install's
  moves.rollbackWindow) -> spec.rollback: RollingBack: online, the cutover in reverse once the stream
  back has caught up; offline, the target closed and copied back into the emptied source; the
  Database switched back and the target's copy dropped -> RolledBack. Without a rollback, at
  rollbackUntil: the stream back ended and the source's copy dropped (a deleted Completed move waits
  for that, by its finalizer). A source Shard deleted within the window ends it at once: the stream
  back ended on the target alone, a rollback refused, the finalizer released.

While a stream runs (the move's, or the stream back within the window), a pass points it at the
credentials handed out once the Database has applied them (a rotation changes them; the Database's
events bring its moves back), so that its next login to the publishing shard is not refused.

Each phase is written to status before its SQL runs, and every step is idempotent: a pass after a
restart or a lost Lease re-runs the phase it finds. Conditions carry sanitized error classes only;
the tenant's password goes from the credentials Secret to the SQL and nowhere else.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from domain.conditions import find_condition
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
from domain.credentials import password_id, secret_values
from domain.naming import credentials_secret_name
from domain.objects import DatabaseMoveObject, Obj, lenient_status
from domain.resources import DATABASE_MOVES, DATABASES
from domain.specs import ShardSpec, parse_shard
from domain.status import DatabaseStatus
from informers import SECRETS, Informer, Rest
from reconciler.events import EventRecorder
from reconciler.move.metrics import MoveMetrics
from reconciler.move.tools import ClientTools, MoveTools
from reconciler.placement_index import PlacementIndex
from reconciler.runtime import ReconcileError, Result, TerminalError, ensure_active, patch_status, write_status
from reconciler.shard.admin import AdminEndpointCache, AdminRefused, AdminSecretInvalid
from reconciler.sql import move, move_offline, move_rollback
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
TOOLS_MISSING = "ClientToolsMissing"  # reason of a copy step retried until the manager has the tools
NO_CAPACITY_RETRY = 60.0  # seconds between looks for a target when spec.target is any and none has room
# How a failed step is named in the Ready condition ("copying failed: timeout").
STEP_NAMES = {
    MovePhase.PREFLIGHT: "preflight",
    MovePhase.COPYING: "copying",
    MovePhase.CATCHING_UP: "catching up",
    MovePhase.CUTTING_OVER: "cutover",
    MovePhase.COMPLETED: "rollback window",
    MovePhase.ROLLING_BACK: "rollback",
}
ROLLBACK_WINDOW = MovesConfig().rollback_window  # the install's default
RUNNING = (MovePhase.COPYING, MovePhase.CATCHING_UP, MovePhase.CUTTING_OVER)
# A move carries the login role handed out with the credentials Secret's password: during an overlap the
# other one still works on the source and would stop working on the target, so a move waits for its end.
OVERLAP_RUNNING = (
    "is in a rotation's overlap (the previous credentials work until {until}): a move carries only the login "
    "role handed out, so it starts once the overlap has ended"
)
OVERLAP_DURING_MOVE = (
    "a rotation with an overlap started during the move, which carries only the login role handed out: "
    "aborted before the cutover; the source serves as before"
)
FINISHED = (MovePhase.COMPLETED, MovePhase.ABORTED, MovePhase.ROLLED_BACK, MovePhase.FAILED)


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"


def _progress(obj: DatabaseMoveObject, **fields: Any) -> DatabaseMoveObject:
    """`obj` with the copy's progress `fields` set, and status.progress summing them up for people
    ("3/5 tables, 40 MiB of 120 MiB"; offline, the sizes only)."""
    status = obj.status.model_copy(update=fields)
    parts = []
    if status.tables_total is not None and status.tables_copied is not None:
        parts.append(f"{status.tables_copied}/{status.tables_total} tables")
    if status.source_bytes is not None:
        parts.append(f"{_mib(status.target_bytes or 0)} of {_mib(status.source_bytes)}")
    return obj.with_status(**fields, progress=", ".join(parts) or None)


def _streaming(status: dict[str, Any]) -> bool:
    """Whether a move (its status as stored) may have a stream running: copying, catching up, cutting
    over, rolling back, or completed with the source's copy kept."""
    phase = status.get("phase")
    kept = phase == MovePhase.COMPLETED and status.get("rollbackUntil") and not status.get("sourceDroppedAt")
    return phase in (*RUNNING, MovePhase.ROLLING_BACK) or bool(kept)


class RollbackRefused(Exception):
    """A rollback that cannot be done; its message says why (for the Rollback condition)."""


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
        tools: ClientTools,
        events: EventRecorder | None = None,
        fence: Fence | None = None,
        placement: PlacementIndex | None = None,
        connection_limit: Callable[[Obj], int | None] = lambda _: None,
        offline_max_bytes: int = MovesConfig().offline_max_bytes,
        rollback_window: timedelta = ROLLBACK_WINDOW,
        metrics: MoveMetrics | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """`tools`: where the client tools that copy a database are found (those of the target's major);
        `placement`: chooses the target of `target: any` (None: such a move waits);
        `connection_limit`: what a Database commits to a shard's connection budget; `offline_max_bytes`:
        the largest database an offline move copies without spec.force; `rollback_window`: how long
        the source keeps its copy after a move."""
        self.rest = rest
        self.namespace = namespace
        self.moves = moves
        self.databases = databases
        self.shards = shards
        self.admin_endpoints = admin_endpoints
        self.tools = tools
        self.placement = placement
        self.connection_limit = connection_limit
        self.offline_max_bytes = offline_max_bytes
        self.rollback_window = rollback_window
        self.metrics = metrics
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
                if phase == MovePhase.ROLLING_BACK and (later := self._roll_back(obj)) is not None:
                    return later  # a rollback under way finishes first
                if phase == MovePhase.COMPLETED and (later := self._window(obj)) is not None:
                    return later  # the source's copy is dropped at the window's end, not before
                if phase in RUNNING and not self._undo(obj):
                    self._switch_database(obj, obj.status.target_shard)  # the target serves: the Database names it
                self._release(obj)
                self._finalizer(obj, add=False)
            return None
        if phase == MovePhase.COMPLETED and obj.status.source_dropped_at is not None and obj.spec.rollback:
            if not self._refused(obj):  # the window is over: the Rollback condition says why
                found = find_condition(obj.status.conditions, MoveConditionType.ROLLBACK)
                self._refuse_rollback(obj, found.message if found is not None else "the rollback window ended")
            return None
        if phase == MovePhase.COMPLETED and self._keeps_source(obj):
            if not obj.spec.rollback or self._refused(obj) or self._source_gone(obj):
                return self._window(obj)
            if (until := self._database(obj)[1].retire_login_at) is not None:
                return self._rollback_wait(obj, until)
            how = "copying the database back" if obj.status.mode == MoveMode.OFFLINE else "the source catching up"
            obj = self._phase(obj, MovePhase.ROLLING_BACK, f"rolling back: {how}")
            self._event(obj, "MoveRollbackStarted", f"rolling back to shard {obj.status.source_shard}")
        if obj.status.phase == MovePhase.ROLLING_BACK:
            return self._roll_back(obj)
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
                return Result(requeue_after=self._pending_retry(obj))
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
        the source serving as before), since the move would hand the target only the login role handed out."""
        if not self._overlap_running(obj) or not self._undo(obj):
            return False
        self._finish(obj, MovePhase.FAILED, MoveReason.FAILED, OVERLAP_DURING_MOVE)
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
        if self.metrics is not None:
            self.metrics.ended(phase)
            if phase == MovePhase.COMPLETED and done.status.write_pause_seconds is not None:
                self.metrics.paused(done.status.mode or MoveMode.ONLINE, done.status.write_pause_seconds)
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

    def _overlap_running(self, obj: DatabaseMoveObject) -> bool:
        """A rotation's overlap runs (both login roles work): the move carries only the one handed out."""
        _, status = self._database(obj)
        return status.retire_login_at is not None

    def _pending_retry(self, obj: DatabaseMoveObject) -> float:
        """Seconds until a Pending move looks again: just after the overlap it waits for, else the
        retry of a move without a target."""
        until = self._database(obj)[1].retire_login_at
        if until is None:
            return NO_CAPACITY_RETRY
        return min(max((until - self.clock()).total_seconds() + 1.0, 1.0), NO_CAPACITY_RETRY)

    def _rollback_wait(self, obj: DatabaseMoveObject, until: datetime) -> Result:
        """spec.rollback during a rotation's overlap: started once it ends (a rollback, too, carries only
        the login role handed out); the Rollback condition says so."""
        message = (
            f"spec.rollback waits for the rotation's overlap to end at {until:%Y-%m-%dT%H:%M:%SZ}; shard "
            f"{obj.status.source_shard} keeps the database until {obj.status.rollback_until:%Y-%m-%dT%H:%M:%SZ}"
        )
        self._write(obj.with_condition(MoveConditionType.ROLLBACK, True, MoveReason.WINDOW_OPEN, message))
        name = obj.status.tenant_name or self._database(obj)[1].tenant_name
        if name is not None:
            self._follow_back(obj, name)
        return Result(requeue_after=self._pending_retry(obj))

    def _overlap_wait(self, obj: DatabaseMoveObject, until: datetime) -> DatabaseMoveObject:
        """Pending until the rotation's overlap ends (the Database controller retires the other login then)."""
        message = f"Database {obj.spec.database} " + OVERLAP_RUNNING.format(until=f"{until:%Y-%m-%dT%H:%M:%SZ}")
        pending = obj.with_status(phase=MovePhase.PENDING, observed_generation=obj.metadata.generation)
        return self._write(pending.with_condition(MoveConditionType.READY, False, MoveReason.PENDING, message))

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
        elif status.retire_login_at is not None:
            return self._overlap_wait(obj, status.retire_login_at)
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
                tenant_name=status.tenant_name,
            )
        except ApiException:
            self._release(obj)  # the choice was not recorded: the next pass chooses again
            raise

    def _choose_target(self, obj: DatabaseMoveObject, db: Obj, source: str | None) -> str | None:
        """`target: any`: the shard placement would give the Database now, never its own nor one with a
        pooler (refused as a target below), reserved there (its slot and its connection limit) until the
        move finishes."""
        if self.placement is None:
            return None
        limit = self.connection_limit(db)
        return self.placement.reserve(Engine.POSTGRES, self._reservation(obj), limit, exclude=source, for_move=True)

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
        """An unfinished move of the same Database created before this one, or one whose source still
        keeps its copy for a rollback (one move at a time: they would share the tenant's publication,
        slot and subscription)."""
        mine = (obj.metadata.creation_timestamp or "", obj.name)
        for other in self.moves.list():
            meta, spec = other.get("metadata") or {}, other.get("spec") or {}
            status = other.get("status") or {}
            phase = status.get("phase")
            kept = phase == MovePhase.COMPLETED and status.get("rollbackUntil") and not status.get("sourceDroppedAt")
            theirs = (meta.get("creationTimestamp") or "", meta.get("name", ""))
            if (
                meta.get("namespace") == obj.metadata.namespace
                and spec.get("database") == obj.spec.database
                and (phase not in FINISHED or kept)
                and meta.get("deletionTimestamp") is None
                and theirs < mine
            ):
                return str(meta.get("name"))
        return None

    # -- SQL -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _sessions(self, obj: DatabaseMoveObject) -> Iterator[tuple[psycopg.Connection, psycopg.Connection]]:
        """Admin sessions to the source and the target shard; failures as ReconcileError (retried)."""
        with self._sessions_on(obj, obj.status.source_shard, obj.status.target_shard) as (source, target):
            yield source, target

    @contextlib.contextmanager
    def _sessions_on(self, obj: DatabaseMoveObject, *names: str | None) -> Iterator[list[psycopg.Connection]]:
        """Admin sessions to the shards `names`, in that order; failures as ReconcileError (retried)."""
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
            with contextlib.ExitStack() as stack:
                sessions = [stack.enter_context(AdminSession.for_endpoint(e, **options)) for e in endpoints]
                with self._lock:
                    self._open.update(sessions)
                try:
                    yield [session.connection() for session in sessions]
                finally:
                    with self._lock:
                        self._open.difference_update(sessions)
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

    def _plan(
        self, obj: DatabaseMoveObject, serving: psycopg.Connection, publisher: str | None = None
    ) -> move.MovePlan:
        """The tenant as it is on the shard that serves it (name, connection limit, ownership record),
        its login role and password from the credentials Secret, and the shard that publishes the stream (the source,
        unless `publisher` names the target for the stream back) as the other server reaches it (its
        client endpoint)."""
        _, status = self._database(obj)
        source_spec = self._shard(publisher or obj.status.source_shard)
        if status.tenant_name is None or source_spec is None:
            raise ReconcileError("DatabaseNotReady", f"Database {obj.spec.database} has no tenant on its shard")
        secret = self.rest.get(SECRETS, credentials_secret_name(obj.spec.database), obj.metadata.namespace)
        values = secret_values(secret)
        state = read_state(serving, status.tenant_name)
        try:
            tenant = TenantSpec(
                status.tenant_name,
                values["password"],
                state.connection_limit if state.connection_limit is not None else -1,
                owner=state.owner,
                login=values.get("user") or None,
            )
        except ValueError:
            message = "the credentials Secret holds no usable login of the tenant"
            raise ReconcileError("CredentialsInvalid", message) from None
        client = source_spec.client
        return move.MovePlan(
            tenant, client.host, client.port, sslmode=client.sslmode.value, password_id=password_id(secret)
        )

    def _follow(
        self,
        obj: DatabaseMoveObject,
        publisher: psycopg.Connection,
        subscriber: psycopg.Connection,
        plan: move.MovePlan,
    ) -> None:
        """The running stream logs in with the credentials handed out (a rotation during the move or the
        window changed them), once the Database has set them on its role (a password still pending would
        not log in yet); an Event says so when its connection was changed."""
        if plan.password_id is None or plan.password_id != self._database(obj)[1].password_applied:
            return
        if move.follow_credentials(publisher, subscriber, plan):
            self._event(
                obj,
                "MoveStreamCredentials",
                f"the stream now logs in as {plan.tenant.login_role} with the password handed out by the rotation",
            )

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
            if found and online and obj.spec.mode == MoveMode.AUTO:
                found.insert(0, f"online not possible ({'; '.join(online)}), so offline")
        tools = self.tools.for_move(facts[0].major, facts[1].major)
        if isinstance(tools, str):
            found.append(tools)
        elif tools.pg_restore is None and mode == MoveMode.OFFLINE:
            found.append(f"no pg_restore of PostgreSQL {tools.major} where the manager runs")
        if found:
            self._fail(obj, MoveReason.PREFLIGHT_FAILED, "; ".join(found))
            return obj.with_status(phase=MovePhase.FAILED)
        assert not isinstance(tools, str)
        how = "online" if mode == MoveMode.ONLINE else "offline: writes pause until the copy is opened on the target"
        self._event(
            obj,
            "MoveStarted",
            f"moving from shard {obj.status.source_shard} to shard {obj.status.target_shard} {how}, "
            f"with the client tools of PostgreSQL {tools.major}",
        )
        message = "copying the schema and the data" if mode == MoveMode.ONLINE else "copying the closed database"
        copying = _progress(obj, source_bytes=size, target_bytes=None, tables_copied=None, tables_total=None)
        return self._phase(copying, MovePhase.COPYING, message, started_at=self.clock(), mode=mode)

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
        if obj.status.mode == MoveMode.OFFLINE:
            return self._copy_offline(obj)
        with self._sessions(obj) as (source, target):
            plan = self._plan(obj, source)
            move.prepare_target(target, plan.tenant)
            move.copy_schema(source, target, plan, self._tools(source, target).pg_dump)
            move.publish(source, plan.name, plan.tenant.login)
            self._follow(obj, source, target, plan)  # made by an earlier pass, before a rotation
            move.subscribe(source, target, plan)
        return self._phase(obj, MovePhase.CATCHING_UP, "copying the data")

    def _copy_offline(self, obj: DatabaseMoveObject) -> DatabaseMoveObject:
        """The source closed (writes pause from here), then copied to the target once; the target's size
        written to status every few seconds of the copy (move_offline.PROGRESS_EVERY)."""
        with self._lock:
            severs = self._severs
        with self._sessions(obj) as (source, target):
            plan = self._plan(obj, source)
            move.prepare_target(target, plan.tenant)
            tools = self._tools(source, target, offline=True)
            assert tools.pg_restore is not None
            move_offline.close_source(source, plan.name)
            current = [obj]

            def report() -> None:
                current[0] = self._progress_write(current[0], target_bytes=move.copied_bytes(target, plan.name))

            move_offline.copy_database(
                source,
                target,
                plan,
                tools.pg_dump,
                tools.pg_restore,
                cancelled=lambda: self._severs != severs,
                progress=report,
            )
            copied = _progress(current[0], target_bytes=move.copied_bytes(target, plan.name))
        return self._phase(copied, MovePhase.CUTTING_OVER, "opening the copy on the target")

    def _progress_write(self, obj: DatabaseMoveObject, **fields: Any) -> DatabaseMoveObject:
        """The copy's progress written to status; a write that fails (a conflict) waits for the next look."""
        try:
            return self._write(_progress(obj, **fields))
        except ApiException:
            return obj

    def _tools(self, source: psycopg.Connection, target: psycopg.Connection, *, offline: bool = False) -> MoveTools:
        """The client tools for the majors of the two shards (the preflight found them; a manager started
        since then may lack them: retried until it has them or the move is aborted)."""
        tools = self.tools.for_move(source.info.server_version // 10000, target.info.server_version // 10000)
        if isinstance(tools, str):
            raise ReconcileError(TOOLS_MISSING, tools)
        if offline and tools.pg_restore is None:
            raise ReconcileError(TOOLS_MISSING, f"no pg_restore of PostgreSQL {tools.major} where the manager runs")
        return tools

    def _catch_up(self, obj: DatabaseMoveObject) -> tuple[DatabaseMoveObject, float | None]:
        with self._sessions(obj) as (source, target):
            plan = self._plan(obj, source)
            self._follow(obj, source, target, plan)
            move.copy_new_tables(source, target, plan, self._tools(source, target).pg_dump)
            now = move.progress(source, target, plan)
            copied = move.copied_bytes(target, plan.name)
        obj = _progress(obj, tables_copied=now.ready, tables_total=now.tables, target_bytes=copied)
        if now.copied and now.streaming and now.lag_bytes is not None and now.lag_bytes < CUTOVER_LAG:
            return self._phase(obj, MovePhase.CUTTING_OVER, "cutting over: writes pause"), None
        message = f"copying the data: {now.ready} of {now.tables} tables copied, {now.lag_bytes or 0} bytes behind"
        if not now.streaming:
            message += "; the stream is not logged in to the source"
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
                self._follow(obj, source, target, plan)
                reverse = None
                if self.rollback_window > timedelta(0):
                    back = self._plan(obj, source, obj.status.target_shard)
                    reverse = move_rollback.Reverse(source, target, back)
                try:
                    pause = move.cutover(source, target, plan, budget=CUTOVER_BUDGET, reverse=reverse)
                except move.CutoverTimedOut:
                    message = "the cutover did not finish in time; the source serves again"
                    self._phase(obj, MovePhase.CATCHING_UP, message)
                    return Result(requeue_after=CATCH_UP_POLL)
        if obj.status.write_pause_seconds is None or pause > 0:
            obj = self._write(obj.with_status(write_pause_seconds=round(pause, 3)))
        self._switch_database(obj, obj.status.target_shard)
        until = self.clock() + self.rollback_window
        obj = obj.with_status(rollback_until=until).with_condition(
            MoveConditionType.ROLLBACK,
            True,
            MoveReason.WINDOW_OPEN,
            f"shard {obj.status.source_shard} keeps the database until {until:%Y-%m-%dT%H:%M:%SZ}; "
            "spec.rollback: true moves it back",
        )
        self._finish(
            obj,
            MovePhase.COMPLETED,
            MoveReason.COMPLETED,
            f"moved from shard {obj.status.source_shard} to shard {obj.status.target_shard}; writes paused "
            f"{obj.status.write_pause_seconds or 0:.1f} s",
        )
        return Result(requeue_after=max(self.rollback_window.total_seconds(), 0.0))

    def _switch_database(self, obj: DatabaseMoveObject, shard: str | None) -> None:
        """The Database's status.shard names `shard` (conditional on the version read)."""
        db = self.rest.get(DATABASES, obj.spec.database, obj.metadata.namespace)
        if (db.get("status") or {}).get("shard") == shard:
            return
        patch_status(
            self.rest,
            DATABASES,
            obj.spec.database,
            {"shard": shard},
            namespace=obj.metadata.namespace,
            resource_version=db["metadata"]["resourceVersion"],
        )

    # -- after the move: the rollback and its window -------------------------------------------------

    @staticmethod
    def _keeps_source(obj: DatabaseMoveObject) -> bool:
        """Whether the source still keeps its copy (a move completed before windows existed: not known)."""
        return obj.status.rollback_until is not None and obj.status.source_dropped_at is None

    def _database_deleted(self, obj: DatabaseMoveObject) -> bool:
        """Whether the moved Database is gone or being deleted (its tenant on the target will be dropped)."""
        db, status = self._database(obj)
        if db is None:
            return True
        deleting = (db.get("metadata") or {}).get("deletionTimestamp") is not None
        return deleting or status.phase in (Phase.DELETING, Phase.DELETED)

    @staticmethod
    def _stream_ended(obj: DatabaseMoveObject) -> bool:
        found = find_condition(obj.status.conditions, MoveConditionType.ROLLBACK)
        return found is not None and found.reason == MoveReason.DATABASE_DELETED

    def moves_of(self, database: Obj) -> list[str]:
        """The keys of a Database's moves with a stream running (it follows the Database's credentials,
        which a rotation changes), or all of them when it is being deleted (their stream back ends then)."""
        meta = database.get("metadata") or {}
        phase = (database.get("status") or {}).get("phase")
        deleting = meta.get("deletionTimestamp") is not None or phase in (Phase.DELETING, Phase.DELETED)
        return [
            f"{meta.get('namespace')}/{(other.get('metadata') or {}).get('name')}"
            for other in self.moves.list()
            if (other.get("metadata") or {}).get("namespace") == meta.get("namespace")
            and (other.get("spec") or {}).get("database") == meta.get("name")
            and (deleting or _streaming(other.get("status") or {}))
        ]

    def moves_from(self, shard: Obj) -> list[str]:
        """The keys of the moves whose source Shard was deleted (their stream back ends then)."""
        name = (shard.get("metadata") or {}).get("name")
        if not name or self.shards.get(str(name)) is not None:
            return []
        return [
            f"{(other.get('metadata') or {}).get('namespace')}/{(other.get('metadata') or {}).get('name')}"
            for other in self.moves.list()
            if (other.get("status") or {}).get("sourceShard") == name
        ]

    @staticmethod
    def _refused(obj: DatabaseMoveObject) -> bool:
        """Whether this generation's spec.rollback was refused already (a changed spec asks again)."""
        found = find_condition(obj.status.conditions, MoveConditionType.ROLLBACK)
        return (
            found is not None
            and found.reason == MoveReason.ROLLBACK_REFUSED
            and found.observed_generation == obj.metadata.generation
        )

    def _window(self, obj: DatabaseMoveObject) -> Result | None:
        """A pass at the window's end (requeued until then): the stream back ended and the source's
        copy dropped, recorded in status.sourceDroppedAt; None once done."""
        until = obj.status.rollback_until
        if until is None or obj.status.source_dropped_at is not None:
            return None
        if self._source_gone(obj):
            self._without_source(obj)
            return None
        left = (until - self.clock()).total_seconds()
        name = obj.status.tenant_name or self._database(obj)[1].tenant_name
        if name is None:
            raise ReconcileError("DatabaseNotReady", f"the tenant of Database {obj.spec.database} is not known")
        if left > 0:
            if self._database_deleted(obj) and not self._stream_ended(obj):
                with self._sessions(obj) as (source, target):
                    move_rollback.end_stream_back(source, target, name)
                message = (
                    f"the Database is being deleted: the stream back was ended; shard {obj.status.source_shard}'s "
                    f"copy is dropped at {until:%Y-%m-%dT%H:%M:%SZ}"
                )
                self._write(obj.with_condition(MoveConditionType.ROLLBACK, False, MoveReason.DATABASE_DELETED, message))
            else:
                self._follow_back(obj, name)
            return Result(requeue_after=left)
        with self._sessions(obj) as (source, target):
            move_rollback.end_window(source, target, name)
        message = f"the rollback window ended: shard {obj.status.source_shard}'s copy was dropped"
        done = obj.with_status(source_dropped_at=self.clock())
        self._write(done.with_condition(MoveConditionType.ROLLBACK, False, MoveReason.WINDOW_ENDED, message))
        self._event(obj, "MoveSourceDropped", message)
        return None

    def _follow_back(self, obj: DatabaseMoveObject, name: str) -> None:
        """Within the window: the stream back (if there is one) follows the credentials handed out."""
        if obj.status.mode == MoveMode.OFFLINE or self._stream_ended(obj):
            return
        with self._sessions(obj) as (source, target):
            if move_rollback.reverse_streaming(source, name):
                self._follow(obj, target, source, self._plan(obj, target, obj.status.target_shard))

    def _roll_back(self, obj: DatabaseMoveObject) -> Result | None:
        """RollingBack: the database brought back to the source (online: once the stream back has
        caught up, the fenced cutover in reverse; offline: copied back), the Database switched back,
        the target's copy dropped. A refusal (the stream back is gone, an offline copy too large)
        returns the move to Completed with the reason in its Rollback condition."""
        try:
            if self._source_gone(obj):
                raise RollbackRefused(self._source_gone_message(obj))
            if self._database_deleted(obj):
                raise RollbackRefused(f"Database {obj.spec.database} is being deleted")
            with self._sessions(obj) as (source, target):
                back = self._plan(obj, target, obj.status.target_shard)
                if obj.status.mode == MoveMode.OFFLINE:
                    pause = self._copy_back(obj, source, target, back)
                else:
                    wait = self._stream_back(obj, source, target, back)
                    if isinstance(wait, Result):
                        return wait
                    pause = wait
                self._switch_database(obj, obj.status.source_shard)
                move_rollback.drop_copy(source, target, back.name, back.tenant.owner)
        except RollbackRefused as refusal:
            return self._window(self._refuse_rollback(obj, str(refusal)))
        done = obj.with_condition(
            MoveConditionType.ROLLBACK, False, MoveReason.ROLLED_BACK, "rolled back; the target's copy was dropped"
        )
        self._finish(
            done,
            MovePhase.ROLLED_BACK,
            MoveReason.ROLLED_BACK,
            f"rolled back to shard {obj.status.source_shard}; writes paused {pause:.1f} s; the copy on shard "
            f"{obj.status.target_shard} was dropped",
        )
        return None

    def _refuse_rollback(self, obj: DatabaseMoveObject, refused: str) -> DatabaseMoveObject:
        """The move back in Completed, the Rollback condition saying why spec.rollback is not done."""
        back_to = obj.with_status(phase=MovePhase.COMPLETED)
        moved = f"moved from shard {obj.status.source_shard} to shard {obj.status.target_shard}"
        back_to = back_to.with_condition(MoveConditionType.READY, True, MoveReason.COMPLETED, moved)
        written = self._write(
            back_to.with_condition(MoveConditionType.ROLLBACK, False, MoveReason.ROLLBACK_REFUSED, refused)
        )
        self._event(obj, "MoveRollbackRefused", refused, warning=True)
        return written

    def _source_gone(self, obj: DatabaseMoveObject) -> bool:
        """Whether the source Shard object was deleted (its copy is out of the provider's reach)."""
        return obj.status.source_shard is not None and self.shards.get(obj.status.source_shard) is None

    @staticmethod
    def _source_gone_message(obj: DatabaseMoveObject) -> str:
        return (
            f"shard {obj.status.source_shard} was deleted: the database cannot be rolled back there, and its copy "
            "there, if the server still holds it, is not dropped by the provider; the stream back was ended"
        )

    def _without_source(self, obj: DatabaseMoveObject) -> None:
        """The source Shard was deleted within the window: the stream back ended on the target (its slot
        would hold the target's WAL), the window closed (status.sourceDroppedAt), the Rollback condition
        and an Event saying so. A rollback refused meanwhile keeps its reason."""
        name = obj.status.tenant_name or self._database(obj)[1].tenant_name
        if name is not None and self._shard(obj.status.target_shard) is not None:
            with self._sessions_on(obj, obj.status.target_shard) as (target,):
                move_rollback.end_stream_on_target(target, name)
        message = self._source_gone_message(obj)
        reason = MoveReason.ROLLBACK_REFUSED if self._refused(obj) else MoveReason.SOURCE_SHARD_GONE
        done = obj.with_status(source_dropped_at=self.clock())
        self._write(done.with_condition(MoveConditionType.ROLLBACK, False, reason, message))
        self._event(obj, "MoveSourceShardGone", message, warning=True)

    def _stream_back(
        self, obj: DatabaseMoveObject, source: psycopg.Connection, target: psycopg.Connection, back: move.MovePlan
    ) -> Result | float:
        """The online rollback: waits (a Result) until the stream back has every table and is close
        to the target; then the fenced cutover in reverse; its write pause."""
        name = back.name
        if not read_state(source, name).tenant_can_connect and read_state(target, name).tenant_can_connect:
            if not move_rollback.reverse_streaming(source, name):
                raise RollbackRefused("the stream back to the source has ended")
            self._follow(obj, target, source, back)
            move.copy_new_tables(target, source, back, self._tools(target, source).pg_dump)
            now = move_rollback.reverse_progress(source, target, back)
            if not (now.copied and now.streaming and now.lag_bytes is not None and now.lag_bytes < CUTOVER_LAG):
                message = (
                    f"rolling back: the source is {now.lag_bytes or 0} bytes behind, "
                    f"{now.ready} of {now.tables} tables streamed"
                )
                if not now.streaming:
                    message += "; the stream back is not logged in to the target"
                self._write(obj.with_condition(MoveConditionType.READY, False, MoveReason.IN_PROGRESS, message))
                return Result(requeue_after=CATCH_UP_POLL)
        try:
            return move_rollback.rollback(source, target, back, budget=CUTOVER_BUDGET)
        except move.CutoverTimedOut:
            message = "rolling back: the cutover did not finish in time; the target serves again"
            self._write(obj.with_condition(MoveConditionType.READY, False, MoveReason.IN_PROGRESS, message))
            return Result(requeue_after=CATCH_UP_POLL)

    def _copy_back(
        self, obj: DatabaseMoveObject, source: psycopg.Connection, target: psycopg.Connection, back: move.MovePlan
    ) -> float:
        """The offline rollback: refused above the size limit unless forced (spec.force), or without
        fitting binaries, before anything changes; then the target closed and copied back into the
        emptied source, which is opened; the write pause (since the rollback started)."""
        tools = self.tools.for_move(read_shard(target).major, read_shard(source).major)
        if isinstance(tools, str) or tools.pg_restore is None:
            raise RollbackRefused(tools if isinstance(tools, str) else f"no pg_restore of PostgreSQL {tools.major}")
        name = back.name
        if read_state(target, name).tenant_can_connect and not read_state(source, name).tenant_can_connect:
            found = self._offline_size(obj, move_offline.database_size(target, name))
            if found:
                raise RollbackRefused("; ".join(found))
        with self._lock:
            severs = self._severs
        move_rollback.copy_back(
            source, target, back, tools.pg_dump, tools.pg_restore, cancelled=lambda: self._severs != severs
        )
        ready = find_condition(obj.status.conditions, MoveConditionType.READY)
        since = ready.last_transition_time if ready is not None else self.clock()
        return max((self.clock() - since).total_seconds(), 0.0)

    def _undo(self, obj: DatabaseMoveObject) -> bool:
        """Abort before the cutover: True when undone; False when the target serves already (the
        move is then finished instead)."""
        with self._sessions(obj) as (source, target):
            plan = self._plan(obj, source)
            if read_state(target, plan.name).tenant_can_connect:
                return False
            move.abort(source, target, plan)
        return True
