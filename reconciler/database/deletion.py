"""Deletion: the hold (a Kubernetes delete without the delete annotation: no SQL at all), the soft
delete (disable now, drop after the retention), and recovery (the annotation removed before the drop).

After a failover of its shard (reconciler.shard.failover) a disabled tenant is verified once: a disable
the failover lost would leave it open to logins during the retention, so it is disabled again (a Warning
Event `TenantDisabledAgain`). Before the drop the tenant is remembered on its Shard, so that a drop a
failover loses is repeated (reconciler.shard.dropped).

A disabled tenant commits no connections (domain.connection_budget), so its shard may have given them
to others meanwhile. A recovery whose connection limit no longer fits the shard's budget is not done
silently over it: the Database stays disabled, Ready False with reason RecoveryOverBudget (a Warning
Event says so once) and the numbers, and is recovered as soon as the limit fits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from domain.config import InstallConfig
from domain.connection_budget import connection_limit, fits
from domain.constants import (
    ANNOTATION_DELETE_REQUESTED_AT,
    DatabaseConditionType,
    DatabaseReason,
    EventReason,
    Phase,
)
from domain.timefmt import parse_time
from informers import Informer
from reconciler.database.failover import log_repair
from reconciler.database.finalizers import Finalizers
from reconciler.database.report import Reporter
from reconciler.database.shard_sql import ShardSql
from reconciler.database.state import Database
from reconciler.database.writes import DatabaseWrites
from reconciler.placement_index import PlacementIndex
from reconciler.runtime import Result
from reconciler.shard.dropped import DropRecords
from reconciler.shard.failover import TimelineRepairs
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import disable_tenant, drop_tenant, enable_tenant, tenant_state

DISABLED_AGAIN_MESSAGE = (
    "disabled again after a failover of its shard: the new primary let it log in (its disable was committed "
    "just before the failover, not yet replicated)"
)

# Seconds between looks at a recovery waiting for its connections (a database deleted or a budget
# raised on the shard frees them without an event of this Database).
RECOVERY_RECHECK = 10.0


@dataclass
class Deletion:
    """Hold, soft delete and recovery: the paths of a Database that is or was being deleted."""

    config: InstallConfig
    shards: Informer
    sql: ShardSql
    writes: DatabaseWrites
    report: Reporter
    finalizers: Finalizers
    clock: Callable[[], datetime]
    placement: PlacementIndex  # what each shard's databases commit, as placement counts it
    repairs: TimelineRepairs  # the verifications after a timeline change of a shard
    drops: DropRecords  # the Shard's record of drops, written before each drop

    def hold(self, database: Database) -> Result | None:
        """Deleted in Kubernetes without a delete request: keep everything, run no SQL, say so."""
        changed = database.set_condition(
            DatabaseConditionType.DELETION_HELD,
            True,
            "DeletionHeld",
            f"deleted without the {ANNOTATION_DELETE_REQUESTED_AT} annotation: held by the finalizer, "
            "nothing is dropped; set the annotation to soft-delete or see the docs to restore",
        )
        if changed:
            self.writes.status(database)
            self.report.event(database, EventReason.DELETION_HELD, "deletion held, no delete annotation", warning=True)
        return None

    def _placed_shard(self, database: Database, phase: Phase, message: str) -> dict[str, Any]:
        shard = self.shards.get(database.shard)
        if shard is None:
            raise self.report.failure(database, phase, DatabaseReason.SHARD_NOT_FOUND, message)
        return shard

    def soft_delete(self, database: Database) -> Result | None:
        """Disable the tenant now, drop it once dropAfter has passed, then finish the delete."""
        if (
            not database.status.shard
            or database.status.phase == Phase.DELETED
            or database.is_true(DatabaseConditionType.TENANT_DROPPED)
        ):
            self.finalizers.finish_delete(database)
            return None
        if database.status.phase != Phase.DELETING or database.status.drop_after is None:
            requested = parse_time(database.annotations.get(ANNOTATION_DELETE_REQUESTED_AT))
            database.update(
                phase=Phase.DELETING, drop_after=(requested or self.clock()) + self.config.soft_delete.retention
            )
            self.report.ready(database, False, DatabaseReason.DELETING, "soft delete in progress")
            self.writes.status(database)
            self.report.event(database, EventReason.DELETE_REQUESTED, "delete requested")
        shard = self._placed_shard(
            database,
            Phase.DELETING,
            f"shard {database.shard} not found: the tenant can be neither disabled nor dropped",
        )
        tenant = database.tenant
        if not database.is_true(DatabaseConditionType.TENANT_DISABLED):
            self._step(
                database,
                shard,
                DatabaseReason.DISABLE_FAILED,
                lambda session: disable_tenant(session, tenant),
                DatabaseConditionType.TENANT_DISABLED,
                "Disabled",
                "login and connections disabled, sessions ended; remove the delete annotation to recover",
                "soft delete in progress",
            )
            self.report.event(database, EventReason.DISABLED, "tenant disabled")
        self.verify_disabled(database, shard)
        assert database.status.drop_after is not None
        wait = (database.status.drop_after - self.clock()).total_seconds()
        if wait > 0:
            return Result(requeue_after=wait)
        self.drops.remember(database.shard, tenant)  # before the drop: a restart after it finds the record
        self._step(
            database,
            shard,
            DatabaseReason.DROP_FAILED,
            lambda session: drop_tenant(session, tenant),
            DatabaseConditionType.TENANT_DROPPED,
            "Dropped",
            "database and role dropped",
            "tenant dropped",
            phase=Phase.DELETED,
        )
        self.report.event(database, EventReason.DROPPED, "tenant dropped")
        self.finalizers.finish_delete(database)
        return None

    def _step(
        self,
        database: Database,
        shard: dict[str, Any],
        reason: str,
        operation: Callable[[AdminSession], object],
        condition: str,
        condition_reason: str,
        condition_message: str,
        ready_message: str,
        *,
        phase: Phase = Phase.DELETING,
    ) -> None:
        """One SQL step of the soft delete, then its condition (and Ready: Deleting) in one status write."""
        self.sql.run(database, shard, Phase.DELETING, reason, operation)
        database.set_condition(condition, True, condition_reason, condition_message)
        database.update(phase=phase)
        self.report.ready(database, False, DatabaseReason.DELETING, ready_message)
        self.writes.status(database)

    def recover(self, database: Database) -> None:
        """The delete annotation was removed before the drop: re-enable the same tenant."""
        if database.status.phase == Phase.DELETED:
            return
        if database.is_true(DatabaseConditionType.TENANT_DISABLED):
            shard = self._placed_shard(database, Phase.DELETING, f"shard {database.shard} not found")
            over = self._over_budget(database)
            if over is not None:
                self.verify_disabled(database, shard)  # it stays disabled meanwhile
                raise self.report.waiting(
                    database, Phase.DELETING, DatabaseReason.RECOVERY_OVER_BUDGET, over, RECOVERY_RECHECK
                )
            tenant, login = database.tenant, database.status.login_role
            self.sql.run(
                database,
                shard,
                Phase.DELETING,
                DatabaseReason.ADMIN_UNAVAILABLE,
                lambda session: enable_tenant(session, tenant, login=login),  # only the login handed out
            )
        database.remove_condition(DatabaseConditionType.TENANT_DISABLED)
        database.update(
            drop_after=None,
            phase=Phase.READY if database.status.applied_connection_limit is not None else Phase.PROVISIONING,
        )
        self.writes.status(database)
        self.report.event(database, EventReason.READY, "recovered from soft delete")

    def verify_disabled(self, database: Database, shard: dict[str, Any]) -> None:
        """Once per timeline change of its shard: disable the tenant again if the failover lost that."""
        timeline = self.repairs.needed(database.shard, database.key)
        if timeline is None:
            return
        tenant, lost = database.tenant, []

        def check(session: AdminSession) -> None:
            state = tenant_state(session, tenant)
            if not state.absent and not state.disabled:
                lost.append(True)
                disable_tenant(session, tenant)

        self.sql.run(database, shard, Phase.DELETING, DatabaseReason.DISABLE_FAILED, check)
        if lost:
            self.report.event(database, EventReason.TENANT_DISABLED_AGAIN, DISABLED_AGAIN_MESSAGE, warning=True)
            log_repair("tenant disabled again after a failover", database, timeline)
        self.repairs.verified(database.shard, timeline, database.key)

    def _over_budget(self, database: Database) -> str | None:
        """Why re-enabling the tenant would commit more connections than its shard's budget, or None."""
        limit = connection_limit(database.db, self.config)
        committed, shard_budget = self.placement.commitments(database.shard)
        if limit is None or shard_budget is None or fits(limit, committed, shard_budget):
            return None
        return (
            f"the delete annotation was removed, but recovering would overcommit shard {database.shard}: its "
            f"databases commit {committed.total(shard_budget)} of its {shard_budget} connections and this one's "
            f"limit is {limit}. The tenant stays disabled and is recovered once the limit fits (delete another "
            "database there, raise the shard's max_connections, or its connectionBudget.overcommit)"
        )
