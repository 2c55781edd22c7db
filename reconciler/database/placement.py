"""Placement: choose the shard and the tenant name and persist both before any SQL; or, with the
restore-tenant annotation, adopt an existing tenant whose Database is gone.

A placement pass runs no SQL: it reserves the shard's slot in the `PlacementIndex`, writes the
placement and ends. The write's event brings the key back in its shard's lane of the work queue
(reconciler/database/setup.py), where its SQL runs with that shard's workers.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from domain.config import InstallConfig, UnknownSizeClass
from domain.constants import ANNOTATION_RESTORE_TENANT, DatabaseReason, EventReason, Phase
from domain.metadata import ListPage, ObjectMeta
from domain.naming import PG_IDENTIFIER_RE, tenant_name
from domain.objects import database_placement
from domain.resources import DATABASES
from domain.settings import SETTINGS
from informers import Informer, Rest
from reconciler.database.report import Reporter
from reconciler.database.shard_sql import ShardSql
from reconciler.database.state import Database
from reconciler.database.writes import DatabaseWrites
from reconciler.placement_index import PlacementIndex
from reconciler.runtime import ControllerStopping, ReconcileError, Result
from reconciler.sql import errors as sqlerrors
from reconciler.sql.errors import SqlFailure
from reconciler.sql.tenant import OwnerRecord, claim_tenant

# Databases read live for a restore claim: each one's metadata and (status.shard, status.tenantName).
_Live = list[tuple[ObjectMeta, tuple[str | None, str | None]]]

log = logging.getLogger(__name__)

NO_CAPACITY_RETRY = SETTINGS.retry.no_capacity
# No usable shard, but some are only not Ready (down, being checked): a transient wait, not a
# capacity failure. A Shard turning Ready enqueues unplaced databases at once; this is the fallback.
SHARDS_UNAVAILABLE_RETRY = SETTINGS.retry.shards_unavailable


def owner(database: Database) -> OwnerRecord:
    """The ownership record this Database writes into its tenant role's comment."""
    return OwnerRecord(database.spec.consumer, database.uid)


def check_size_class(config: InstallConfig, database: Database, report: Reporter) -> int:
    """The connection limit of the spec's size class, or a terminal InvalidSizeClass failure."""
    try:
        return config.resolve_connection_limit(database.spec.size_class)
    except UnknownSizeClass:
        raise report.terminal(
            database,
            DatabaseReason.INVALID_SIZE_CLASS,
            f"size class {database.spec.size_class!r} is not in sizeClasses",
        ) from None


@dataclass
class Placer:
    """Placement and restore-tenant adoption of an unplaced Database."""

    config: InstallConfig
    placement: PlacementIndex
    rest: Rest
    shards: Informer
    writes: DatabaseWrites
    report: Reporter
    sql: ShardSql

    def place(self, database: Database) -> Result | None:
        """Choose the shard and the tenant name and persist both before any SQL."""
        limit = check_size_class(self.config, database, self.report)
        restore = database.annotations.get(ANNOTATION_RESTORE_TENANT)
        if restore is not None:
            return self.adopt(database, restore)
        engine = database.spec.engine
        chosen = self.placement.reserve(engine, database.key, limit)
        if chosen is None and (waiting := self.placement.not_ready(engine)):
            database.update(phase=Phase.PROVISIONING)
            self.report.ready(
                database,
                False,
                DatabaseReason.SHARDS_UNAVAILABLE,
                f"no {engine} shard usable right now: {len(waiting)} not Ready ({', '.join(waiting[:3])}); "
                "placed as soon as one is Ready",
            )
            self.writes.status(database)
            return Result(requeue_after=SHARDS_UNAVAILABLE_RETRY)
        if chosen is None:
            database.update(phase=Phase.FAILED)
            self.report.ready(
                database,
                False,
                DatabaseReason.NO_CAPACITY,
                f"no accepting, ready {engine} shard below maxDatabases with room for "
                f"{'an unlimited number of' if limit == -1 else limit} connections; retrying every 5 minutes",
            )
            self.writes.status(database)
            return Result(requeue_after=NO_CAPACITY_RETRY)
        database.update(
            shard=chosen, tenant_name=tenant_name(database.spec.external_id, database.uid), phase=Phase.PROVISIONING
        )
        self.report.ready(database, False, DatabaseReason.PROVISIONING, "placed, SQL pending")
        try:
            self.writes.status(database)
        except ApiException as exc:
            if exc.status is not None and exc.status < 500:  # refused (a conflict, say): nothing was placed
                self.placement.release(database.key)
            raise  # otherwise the outcome is unknown: the reservation stays (see PlacementIndex.reserve)
        except ControllerStopping:
            self.placement.release(database.key)  # the fence stopped the write before it was sent
            raise
        self.report.event(database, EventReason.CREATED, "placed")
        log.info("database placed", extra={"database": database.name, "shard": chosen})
        return None

    def adopt(self, database: Database, restore: str) -> Result | None:
        """An operator re-creates a lost Database on its existing tenant: no placement, same data."""
        shard, _, tenant = restore.partition("/")
        if not shard or len(tenant) > 63 or not re.fullmatch(PG_IDENTIFIER_RE, tenant):
            raise self.report.terminal(
                database,
                DatabaseReason.ENSURE_FAILED,
                f"annotation {ANNOTATION_RESTORE_TENANT} must be <shard>/<tenant name>",
            )
        self._claim(database, shard, tenant)
        database.update(shard=shard, tenant_name=tenant, phase=Phase.PROVISIONING)
        self.report.ready(database, False, DatabaseReason.PROVISIONING, "restoring an existing tenant, SQL pending")
        self.writes.status(database)
        self.report.event(database, EventReason.CREATED, "restored onto its existing tenant")
        return None

    def _claim(self, database: Database, shard_name: str, tenant: str) -> None:
        """Adopt only a tenant of this consumer whose owning Database is gone (RestoreRefused otherwise).

        Checked before anything is written: no other Database may name the tenant in its status,
        and the role's ownership record must name this consumer and a Database that no longer
        exists (read live, under the shard-side lock of `claim_tenant`).
        """

        def live() -> _Live:
            """The namespace's Databases read live: the metadata and (shard, tenant) of each."""
            items = ListPage.of(self.rest.list(DATABASES, database.namespace)).items
            return [(ObjectMeta.of(obj), database_placement(obj)) for obj in items]

        def holder(items: _Live) -> str | None:
            wanted = (shard_name, tenant)
            return next((meta.name for meta, placed in items if meta.uid != database.uid and placed == wanted), None)

        def released(record: OwnerRecord) -> bool:
            items = live()
            return holder(items) is None and all(meta.uid != record.database_uid for meta, _ in items)

        other = holder(live())
        if other is not None:
            raise self._refusal(database, f"Database {other} owns tenant {shard_name}/{tenant}")
        shard = self.shards.get(shard_name)
        if shard is None:
            raise self.report.failure(
                database, Phase.FAILED, DatabaseReason.SHARD_NOT_FOUND, f"shard {shard_name} not found"
            )
        session = self.sql.session(database, shard, Phase.PROVISIONING, DatabaseReason.ADMIN_UNAVAILABLE)
        try:
            claim_tenant(session, tenant, owner(database), released)
        except SqlFailure as failure:
            if failure.error_class in (sqlerrors.RESTORE_REFUSED, sqlerrors.NAME_TAKEN):
                raise self._refusal(database, f"{failure}: {shard_name}/{tenant}") from None
            raise self.sql.failed(
                database, shard_name, Phase.PROVISIONING, DatabaseReason.ADMIN_UNAVAILABLE, failure
            ) from None

    def _refusal(self, database: Database, message: str) -> ReconcileError:
        return self.report.terminal(
            database,
            DatabaseReason.RESTORE_REFUSED,
            f"annotation {ANNOTATION_RESTORE_TENANT} refused, nothing was changed: {message}",
        )
