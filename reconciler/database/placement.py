"""Placement: choose the shard and the tenant name and persist both before any SQL; or, with the
restore-tenant annotation, adopt an existing tenant whose Database is gone."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, NoReturn

from domain.config import InstallConfig, UnknownSizeClass
from domain.constants import ANNOTATION_RESTORE_TENANT, DatabaseReason, EventReason, Phase
from domain.naming import PG_IDENTIFIER_RE, tenant_name
from domain.settings import SETTINGS
from informers import Informer, Rest
from reconciler.database.report import Reporter
from reconciler.database.shard_sql import ShardSql
from reconciler.database.state import Pass
from reconciler.database.writes import DatabaseWrites
from reconciler.placement import PlacementIndex
from reconciler.resources import DATABASES
from reconciler.runtime import Result
from reconciler.sql import errors as sqlerrors
from reconciler.sql.errors import SqlFailure
from reconciler.sql.tenant import OwnerRecord, claim_tenant

log = logging.getLogger(__name__)

NO_CAPACITY_RETRY = SETTINGS.retry.no_capacity
# No usable shard, but some are only not Ready (down, being checked): a transient wait, not a
# capacity failure. A Shard turning Ready enqueues unplaced databases at once; this is the fallback.
SHARDS_UNAVAILABLE_RETRY = SETTINGS.retry.shards_unavailable


def owner(p: Pass) -> OwnerRecord:
    """The ownership record this Database writes into its tenant role's comment."""
    return OwnerRecord(p.spec.consumer, p.uid)


def check_size_class(config: InstallConfig, p: Pass, report: Reporter) -> int:
    """The connection limit of the spec's size class, or a terminal InvalidSizeClass failure."""
    try:
        return config.resolve_connection_limit(p.spec.size_class)
    except UnknownSizeClass:
        report.fail(
            p,
            Phase.FAILED,
            DatabaseReason.INVALID_SIZE_CLASS,
            f"size class {p.spec.size_class!r} is not in sizeClasses",
            terminal=True,
        )


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

    def place(self, p: Pass) -> Result | None:
        """Choose the shard and the tenant name and persist both before any SQL."""
        check_size_class(self.config, p, self.report)
        restore = p.annotations.get(ANNOTATION_RESTORE_TENANT)
        if restore is not None:
            return self.adopt(p, restore)
        engine = p.spec.engine
        chosen = self.placement.choose(engine)
        if chosen is None and (waiting := self.placement.not_ready(engine)):
            p.update(phase=Phase.PROVISIONING)
            self.report.ready(
                p,
                False,
                DatabaseReason.SHARDS_UNAVAILABLE,
                f"no {engine} shard usable right now: {len(waiting)} not Ready ({', '.join(waiting[:3])}); "
                "placed as soon as one is Ready",
            )
            self.writes.status(p)
            return Result(requeue_after=SHARDS_UNAVAILABLE_RETRY)
        if chosen is None:
            p.update(phase=Phase.FAILED)
            self.report.ready(
                p,
                False,
                DatabaseReason.NO_CAPACITY,
                f"no accepting, ready {engine} shard below maxDatabases; retrying every 5 minutes",
            )
            self.writes.status(p)
            return Result(requeue_after=NO_CAPACITY_RETRY)
        p.update(shard=chosen, tenant_name=tenant_name(p.spec.external_id, p.uid), phase=Phase.PROVISIONING)
        self.report.ready(p, False, DatabaseReason.PROVISIONING, "placed, SQL pending")
        self.writes.status(p)
        self.report.event(p, EventReason.CREATED, "placed")
        log.info("database placed", extra={"database": p.name, "shard": chosen})
        return None

    def adopt(self, p: Pass, restore: str) -> Result | None:
        """An operator re-creates a lost Database on its existing tenant: no placement, same data."""
        shard, _, tenant = restore.partition("/")
        if not shard or len(tenant) > 63 or not re.fullmatch(PG_IDENTIFIER_RE, tenant):
            self.report.fail(
                p,
                Phase.FAILED,
                DatabaseReason.ENSURE_FAILED,
                f"annotation {ANNOTATION_RESTORE_TENANT} must be <shard>/<tenant name>",
                terminal=True,
            )
        self._claim(p, shard, tenant)
        p.update(shard=shard, tenant_name=tenant, phase=Phase.PROVISIONING)
        self.report.ready(p, False, DatabaseReason.PROVISIONING, "restoring an existing tenant, SQL pending")
        self.writes.status(p)
        self.report.event(p, EventReason.CREATED, "restored onto its existing tenant")
        return None

    def _claim(self, p: Pass, shard_name: str, tenant: str) -> None:
        """Adopt only a tenant of this consumer whose owning Database is gone (RestoreRefused otherwise).

        Checked before anything is written: no other Database may name the tenant in its status,
        and the role's ownership record must name this consumer and a Database that no longer
        exists (read live, under the shard-side lock of `claim_tenant`).
        """

        def holder(items: list[dict[str, Any]]) -> str | None:
            for other in items:
                status = other.get("status") or {}
                if other["metadata"]["uid"] != p.uid and (status.get("shard"), status.get("tenantName")) == (
                    shard_name,
                    tenant,
                ):
                    return str(other["metadata"]["name"])
            return None

        def live() -> list[dict[str, Any]]:
            return self.rest.list(DATABASES, p.namespace).get("items") or []

        def released(record: OwnerRecord) -> bool:
            items = live()
            return holder(items) is None and all(o["metadata"]["uid"] != record.database_uid for o in items)

        other = holder(live())
        if other is not None:
            self._refuse(p, f"Database {other} owns tenant {shard_name}/{tenant}")
        shard = self.shards.get(shard_name)
        if shard is None:
            self.report.fail(p, Phase.FAILED, DatabaseReason.SHARD_NOT_FOUND, f"shard {shard_name} not found")
        session = self.sql.session(p, shard, Phase.PROVISIONING, DatabaseReason.ADMIN_UNAVAILABLE)
        try:
            claim_tenant(session, tenant, owner(p), released)
        except SqlFailure as failure:
            if failure.error_class in (sqlerrors.RESTORE_REFUSED, sqlerrors.NAME_TAKEN):
                self._refuse(p, f"{failure}: {shard_name}/{tenant}")
            self.sql.failed(p, shard_name, Phase.PROVISIONING, DatabaseReason.ADMIN_UNAVAILABLE, failure)

    def _refuse(self, p: Pass, message: str) -> NoReturn:
        self.report.fail(
            p,
            Phase.FAILED,
            DatabaseReason.RESTORE_REFUSED,
            f"annotation {ANNOTATION_RESTORE_TENANT} refused, nothing was changed: {message}",
            terminal=True,
        )
