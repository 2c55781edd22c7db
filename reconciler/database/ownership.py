"""Ownership of a Ready database's tenant: confirmed once, and adopted if it was made before records.

A tenant made by this release carries its ownership record from CREATE ROLE on, and provisioning
sets the condition OwnershipRecorded=True. A Database that was Ready before this release (0.1.0,
or a build before ownership records existed) has no such condition: its first pass here reads the
tenant's catalog row once (`confirm_ownership`) and
- the record names this Database: OwnershipRecorded=True, reason Recorded, nothing else;
- there is no record, and the role and its database are exactly as the provider makes them (and
  have the connection limit this Database recorded): the record is written, reason Adopted, a
  Normal Event TenantAdopted and a log line (once: the condition is True afterwards);
- anything else (no record and something foreign about the role, another Database's record, no
  tenant at all): OwnershipRecorded=False with reason ForeignRole, OwnedByOther or TenantMissing
  and a Warning Event; nothing is written to the shard, the database keeps its phase, and the
  check runs again on its next pass (after a person fixed the cause).
A shard that cannot be asked now (not Ready, unreachable) leaves the condition as it is and the check
is tried again later; it never changes the database's Ready condition.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from domain.constants import DatabaseConditionType, EventReason, OwnershipReason
from domain.settings import SETTINGS
from reconciler.database.placement import owner
from reconciler.database.report import Reporter
from reconciler.database.shard_sql import ShardSql, shard_ready, shard_spec, shard_state
from reconciler.database.state import Database
from reconciler.database.writes import DatabaseWrites
from reconciler.runtime import Result
from reconciler.shard.admin import AdminSecretInvalid
from reconciler.sql.errors import SqlFailure
from reconciler.sql.tenant import Ownership, OwnershipCheck, confirm_ownership

log = logging.getLogger(__name__)

# When the shard could not be asked: look again after this (no backoff, nothing failed for the user).
RETRY = SETTINGS.retry.shards_unavailable

_OUTCOMES: dict[Ownership, tuple[bool, OwnershipReason, str]] = {
    Ownership.RECORDED: (True, OwnershipReason.RECORDED, "the tenant role's ownership record names this Database"),
    Ownership.ADOPTED: (
        True,
        OwnershipReason.ADOPTED,
        "the tenant was made before ownership records existed; its record now names this Database",
    ),
    Ownership.FOREIGN: (False, OwnershipReason.FOREIGN_ROLE, "the tenant role has no ownership record, and"),
    Ownership.OTHER_OWNER: (
        False,
        OwnershipReason.OWNED_BY_OTHER,
        "the tenant role's ownership record names another Database; nothing was changed",
    ),
    Ownership.MISSING: (False, OwnershipReason.TENANT_MISSING, "the tenant's role or database is not on its shard"),
}


def recorded_at_creation(database: Database) -> None:
    """Provisioning wrote (or found) this Database's record: no check is needed later."""
    database.set_condition(
        DatabaseConditionType.OWNERSHIP_RECORDED, True, OwnershipReason.RECORDED, _OUTCOMES[Ownership.RECORDED][2]
    )


@dataclass
class OwnershipConfirmation:
    """The once-per-database check of a Ready database's ownership record (see the module docstring)."""

    sql: ShardSql
    writes: DatabaseWrites
    report: Reporter

    def confirm(self, database: Database, shard: dict[str, Any]) -> Result | None:
        """Set OwnershipRecorded from the shard (unless already True); Result(requeue) if it could not ask."""
        if database.is_true(DatabaseConditionType.OWNERSHIP_RECORDED):
            return None
        check = self._ask(database, shard)
        if check is None:
            return Result(requeue_after=RETRY)
        recorded, reason, message = _OUTCOMES[check.verdict]
        if check.verdict == Ownership.FOREIGN:
            message = f"{message} {'; '.join(check.problems)}; nothing was changed"
        before = database.reason(DatabaseConditionType.OWNERSHIP_RECORDED)
        database.set_condition(DatabaseConditionType.OWNERSHIP_RECORDED, recorded, reason, message)
        if check.verdict == Ownership.ADOPTED:
            self.report.change_event(
                database,
                EventReason.TENANT_ADOPTED,
                "adopted a tenant made before ownership records existed: its record now names this Database",
            )
            log.info("tenant adopted", extra={"database": database.name, "shard": database.shard})
        elif not recorded and before != reason:
            self.report.change_event(database, reason, message, warning=True)
            log.warning("tenant ownership refused", extra={"database": database.name, "reason": str(reason)})
        self.writes.status(database)
        return None

    def _ask(self, database: Database, shard: dict[str, Any]) -> OwnershipCheck | None:
        """The verdict from the shard, or None when it cannot be asked right now."""
        state = shard_state(shard)
        name, spec = state.name, shard_spec(shard)
        if spec is None or not shard_ready(state):
            return None
        try:
            session = self.sql.sessions.get(name, self.sql.admin_endpoints.get(name, spec))
            return confirm_ownership(
                session, database.tenant, owner(database), database.status.applied_connection_limit
            )
        except (AdminSecretInvalid, ApiException, SqlFailure) as exc:
            self.sql.sessions.drop(name)
            self.sql.admin_endpoints.forget(name)
            log.info("ownership check postponed", extra={"database": database.name, "error": type(exc).__name__})
            return None
