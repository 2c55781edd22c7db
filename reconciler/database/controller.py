"""The Database controller: a reconcile is a column of guard clauses (CloudNativePG's order).

  fetch -> finalizer (finalizers.py) -> held: a Kubernetes delete without the delete annotation,
  no SQL at all (deletion.py) -> soft delete or recovery (deletion.py) -> placement, persisted
  before any SQL, then the credentials Secret outside any lane slot, ends the pass (placement.py) -> shard
  -> credentials Secret (unless that pass wrote it), written before the role: the source of the password
  (secret.py) -> Ready path: no SQL unless the database's own inputs
  changed (ready.py), once per database the ownership check (ownership.py), and once per timeline change
  of its shard the verification of its tenant (failover.py) -> provisioning,
  then a login with the database's own credentials (provisioning.py, login.py).

The work queue has a lane per shard (`lane`): a pass runs with the workers of the shard its
Database is placed on, and placement, which runs no SQL, has a lane of its own. So a pass that
places ends there; the placement's event brings the key back in its shard's lane for the SQL.

Each step reads and changes the typed `Database` (state.py). SQL runs through `ShardSql` (shard_sql.py):
a failure goes into status with its sanitized class and is retried with backoff
(`ReconcileError`), or, when retrying cannot help, raised as `TerminalError`; driver errors never
escape. While the placed shard is not Ready the pass ends in `Waiting` (reason ShardNotReady, the
phase kept): no SQL, no retry spent, looked at again when the Shard turns Ready.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from domain.config import InstallConfig
from domain.constants import (
    ANNOTATION_DELETE_REQUESTED_AT,
    ANNOTATION_RESTORE_TENANT,
    FINALIZER_TENANT,
    UNPLACED,
    DatabaseConditionType,
    DatabaseReason,
    Phase,
)
from domain.credentials import Endpoint
from domain.metadata import object_annotation
from domain.objects import database_placement
from domain.validation import format_validation_error
from informers import Informer, Rest, object_key
from reconciler.database.deletion import Deletion
from reconciler.database.early import EarlyVerdicts
from reconciler.database.failover import FailoverVerification
from reconciler.database.finalizers import Finalizers
from reconciler.database.login import LoginCheck
from reconciler.database.ownership import OwnershipConfirmation
from reconciler.database.placement import Placer
from reconciler.database.provisioning import Provisioner
from reconciler.database.ready import ReadyPath
from reconciler.database.report import Reporter, Waiting
from reconciler.database.secret import CredentialsSecrets
from reconciler.database.settled import settled
from reconciler.database.shard_sql import ShardSpecs, ShardSql, client_endpoint
from reconciler.database.state import Database
from reconciler.database.writes import CacheLags, DatabaseWrites
from reconciler.events import EventRecorder
from reconciler.placement_index import PlacementIndex, placement_index
from reconciler.runtime import Result, TerminalError, Wakeups, release_slot
from reconciler.shard.admin import AdminEndpointCache, AdminPolicy, AdminSessions
from reconciler.shard.dropped import DropRecords
from reconciler.shard.failover import TimelineRepairs

INVALID_OBJECT = "InvalidObject"


class DatabaseController:
    def __init__(
        self,
        rest: Rest,
        config: InstallConfig,
        namespace: str,
        databases: Informer,
        shards: Informer,
        secrets: Informer,
        events: EventRecorder,
        sessions: AdminSessions | None = None,
        admin_host_override: str | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        policy: AdminPolicy | None = None,
        wakeups: Wakeups | None = None,
        on_shard_trouble: Callable[[str, str], None] | None = None,
        placement: PlacementIndex | None = None,
        repairs: TimelineRepairs | None = None,
    ) -> None:
        """`wakeups`: this controller's (a held-back event that was not ours gets its pass);
        `on_shard_trouble(shard, error_class)`: a statement failed as if its shard were in trouble;
        `placement`: the index the Shard controller's suspects share (made here when not given);
        `repairs`: the Shard controller's verifications after a timeline change (reconciler.shard.failover)."""
        self.namespace = namespace
        self.config = config
        self.databases = databases
        self.shards = shards
        self.sessions = sessions or AdminSessions()
        admin_endpoints = AdminEndpointCache(rest, policy or AdminPolicy.from_config(config), admin_host_override)
        # Before any handler that enqueues Databases: a woken worker places with the event applied.
        self.placement = placement or placement_index(config, shards, databases)

        enqueue = wakeups.enqueue if wakeups is not None else None
        self.shard_specs = ShardSpecs()
        self.writes = DatabaseWrites(rest, enqueue)
        self.report = Reporter(self.writes, events)
        self.sql = ShardSql(self.sessions, admin_endpoints, self.report, on_shard_trouble)
        self.secrets = CredentialsSecrets(rest, secrets, self.report, enqueue)
        self.finalizers = Finalizers(rest, self.writes, self.secrets)
        self.placer = Placer(config, self.placement, rest, shards, self.writes, self.report, self.sql)
        self.repairs = repairs or TimelineRepairs()
        drops = DropRecords(rest, config.soft_delete.remember_drops, clock)
        self.deletion = Deletion(
            config,
            shards,
            self.sql,
            self.writes,
            self.report,
            self.finalizers,
            clock,
            self.placement,
            self.repairs,
            drops,
        )
        self.ready = ReadyPath(config, rest, self.secrets, self.sql, self.writes, self.report, clock)
        login = LoginCheck(config, admin_endpoints.policy, self.sql, self.report, admin_host_override)
        self.provisioner = Provisioner(config, self.sql, self.writes, self.report, login)
        self.ownership = OwnershipConfirmation(self.sql, self.writes, self.report)
        self.failover = FailoverVerification(self.repairs, self.sql, self.secrets, self.report, self.provisioner)
        # Before the informers start: a start's Databases are looked at while their pages arrive.
        self.early = EarlyVerdicts(
            databases, secrets, shards, self.secrets.key_of, _shard_name, self.shard_specs.endpoint, self._settled_on
        )

    def lane(self, key: str) -> str:
        """The work queue lane of a Database: the shard it is placed on (as our own last write says,
        or the cache), the shard a restore-tenant annotation names (adoption runs SQL there), else
        UNPLACED (placement: apiserver work only). Read from memory only: the queue calls it under its lock."""
        shard = self.writes.placed_on(key)
        if shard:
            return shard
        db = self.databases.get(key)
        if db is None:
            return UNPLACED
        shard, _ = database_placement(db)
        if shard:
            return shard
        restore = object_annotation(db, ANNOTATION_RESTORE_TENANT) or ""
        return restore.partition("/")[0] or UNPLACED

    def settled(self, key: str) -> bool:
        """For a resync: the cached Database is Ready and its pass would change nothing (settled.py), as found
        while the lists paged in (early.py) or now; False while a write of ours may not show in the cache (the
        pass reads the live object then)."""
        if self.writes.awaiting(key):
            return False
        db = self.databases.get(key)
        if db is None:
            return False
        if self.repairs.needed(_shard_name(db), key) is not None:
            return False  # to be verified after its shard's timeline changed (failover.py)
        secret, endpoint = self.secrets.cached(db), self._endpoint_of(db)
        return self.early.take(key, db, secret, endpoint) or self._settled_on(db, endpoint, secret)

    def _settled(self, db: dict[str, Any]) -> bool:
        """The fast path's question (settled.py), read from the caches only."""
        return self._settled_on(db, self._endpoint_of(db), self.secrets.cached(db))

    def _endpoint_of(self, db: dict[str, Any]) -> Endpoint | None:
        """The client endpoint of the cached Shard the Database is placed on (None: none, or no valid spec)."""
        shard_name = _shard_name(db)
        shard = self.shards.get(shard_name) if shard_name else None
        return self.shard_specs.endpoint(shard) if shard is not None else None

    def _settled_on(self, db: dict[str, Any], endpoint: Endpoint | None, secret: dict[str, Any] | None) -> bool:
        if self.repairs.needed(_shard_name(db), object_key(db)) is not None:
            return False  # to be verified after its shard's timeline changed (failover.py)
        return settled(db, endpoint, secret, self.config)

    def _credentials_after_placement(self, database: Database, shard_name: str) -> None:
        """The credentials Secret of a database just placed, written outside any lane slot: in the shard's
        pass it held one of the shard's slots, a tenth of their busy time in a provisioning burst. Still
        before the role: the shard's pass needs it (and writes it itself if this did not).
        A shard gone or invalid meanwhile is the shard pass's to report."""
        release_slot()  # placed: the placement lane's next database may go now
        shard = self.shards.get(shard_name)
        spec = self.shard_specs.of(shard) if shard is not None else None
        if spec is not None:
            self.secrets.ensure(database, client_endpoint(spec))

    def reconcile(self, key: str) -> Result | None:
        try:
            return self._reconcile(key)
        except (Waiting, CacheLags) as waiting:  # the status says what it waits for, or the cache lags; no failure
            return Result(requeue_after=waiting.requeue_after)

    def _reconcile(self, key: str) -> Result | None:
        cached = self.databases.get(key)
        if cached is None:
            self.writes.gone(key)
            return None
        db = self.writes.caught_up(key, cached)
        if db is None:
            return None
        if self._settled(db):
            return None  # Ready, and the full pass would change nothing (settled.py): a start's common case
        try:
            database = Database.read(db)
        except ValidationError as exc:  # the CRD schema is generated from the same models: a bug
            raise TerminalError(INVALID_OBJECT, format_validation_error(exc)) from None
        k8s_deleting = database.deleting
        delete_requested = ANNOTATION_DELETE_REQUESTED_AT in database.annotations

        if FINALIZER_TENANT not in database.finalizers:
            if k8s_deleting:
                return None  # nothing of ours is left on it
            if not self.finalizers.add(database):
                return None
        if k8s_deleting and not delete_requested:
            return self.deletion.hold(database)
        database.remove_condition(DatabaseConditionType.DELETION_HELD)  # the hold is over
        if delete_requested or database.is_true(DatabaseConditionType.TENANT_DROPPED):
            return self.deletion.soft_delete(database)  # once dropped, never recovered or provisioned anew
        if database.status.phase in (Phase.DELETING, Phase.DELETED) or database.status.drop_after is not None:
            self.deletion.recover(database)

        if not database.status.shard:
            result = self.placer.place(database)  # the SQL runs in the shard's lane, on the next pass
            placed_on, _ = database_placement(database.db)  # as written (a pass that waits places nothing)
            if placed_on:
                self._credentials_after_placement(database, placed_on)
            return result
        shard = self.shards.get(database.shard)
        if shard is None:
            raise self.report.failure(
                database, Phase.FAILED, DatabaseReason.SHARD_NOT_FOUND, f"shard {database.shard} not found"
            )
        spec = self.shard_specs.of(shard)
        if spec is None:
            raise self.report.failure(
                database,
                database.status.phase or Phase.PROVISIONING,
                DatabaseReason.ADMIN_UNAVAILABLE,
                f"shard {database.shard} has an invalid spec; retrying",
            )
        ready = database.status.phase == Phase.READY
        secret = self.secrets.ensure(database, client_endpoint(spec), values=not ready)  # provisioning: the password

        if ready:
            overlap_left = self.ready.converge(database, shard, secret)
            result = self.ownership.confirm(database, shard)  # SQL once per database, then never again
            self.failover.verify(database, shard, spec)  # SQL once per timeline change of the shard
            if overlap_left is None:
                return result
            # The pass at the overlap's end retires the previous login role (a requeue, never a sleep).
            waits = [overlap_left] + ([result.requeue_after] if result and result.requeue_after else [])
            return Result(requeue_after=min(waits))
        else:
            self.provisioner.provision(database, shard, secret)
        return None


def _shard_name(db: dict[str, Any]) -> str | None:
    """The Shard a Database object's status places it on (None: not placed)."""
    return database_placement(db)[0]
