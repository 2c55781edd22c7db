"""Drops remembered in the Shard's `status.droppedTenants`, and repeated when a failover lost them.

With asynchronous replication a promoted replica may lack a drop committed just before the failover: the
tenant's role and database are back on the new primary while its Database object is gone. So the soft
delete records the tenant's name (and the time; nothing secret) on its Shard before it drops it
(`DropRecords.remember`), and when the Shard check sees a new timeline it drops again each recorded
tenant that exists there (`repeat_drops`, with the drop's own idempotent SQL), never one a Database placed
on the shard still names (a recovered delete whose drop had failed) and never a tenant not in the record.

A record lasts `softDelete.rememberDrops` (`remembered`): a drop is lost only when the primary fails
before a replica received it, and the new timeline is seen at the next Shard check, or when a stopped
manager starts again; so the record must outlive the replicas' lag and such an outage, not more.
Recording before the drop means a manager that restarts between the two finds the record already there.

Writers: the Database workers append (a live read, then a status write conditional on its
resourceVersion, tried again on a conflict); the Shard controller prunes in its own status write, which
is conditional too. So neither loses the other's update.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from kubernetes.client.exceptions import ApiException

from domain.objects import ShardState
from domain.resources import SHARDS
from domain.status import MAX_DROPPED_TENANTS, DroppedTenant
from informers import Rest
from reconciler.runtime.status import patch_status
from reconciler.sql.errors import SqlFailure
from reconciler.sql.session import Admin
from reconciler.sql.tenant import drop_tenant, tenant_state

log = logging.getLogger(__name__)
# Conditional writes tried before a conflict is left to the controller's retry.
WRITE_ATTEMPTS = 5
REPEATED_MESSAGE = "tenant drop repeated after a failover"  # the log line of each drop repeated
REFUSED_MESSAGE = "tenant drop after a failover refused; left as it is"


def remembered(entries: Iterable[DroppedTenant], now: datetime, keep: timedelta) -> tuple[DroppedTenant, ...]:
    """The entries dropped within `keep` of `now`, at most MAX_DROPPED_TENANTS (the newest)."""
    kept = [entry for entry in entries if now - entry.dropped_at < keep]
    return tuple(kept[-MAX_DROPPED_TENANTS:])


@dataclass
class DropRecords:
    """Appends a tenant about to be dropped to its Shard's status.droppedTenants."""

    rest: Rest
    keep: timedelta  # softDelete.rememberDrops
    clock: Callable[[], datetime]

    def remember(self, shard: str, tenant: str) -> None:
        """Record `tenant` on `shard` (a no-op when it is recorded already or nothing is remembered).
        Raises the API error when the write fails, or a conflict persists: the drop must wait for it."""
        if self.keep <= timedelta(0):
            return
        for attempt in range(WRITE_ATTEMPTS):
            state, _ = ShardState.parse_lenient_status(self.rest.get(SHARDS, shard))
            now = self.clock()
            entries = remembered(state.status.dropped_tenants, now, self.keep)
            if any(entry.name == tenant for entry in entries):
                return
            entries = remembered((*entries, DroppedTenant(name=tenant, dropped_at=now)), now, self.keep)
            body = [entry.model_dump(by_alias=True, mode="json") for entry in entries]
            try:
                patch_status(
                    self.rest,
                    SHARDS,
                    shard,
                    {"droppedTenants": body},
                    resource_version=state.metadata.resource_version,
                )
                return
            except ApiException as exc:
                if exc.status != 409 or attempt + 1 == WRITE_ATTEMPTS:
                    raise


def repeat_drops(admin: Admin, shard: str, tenants: Iterable[str], done: Callable[[str], None]) -> None:
    """Drop again each of `tenants` whose role or database exists on the shard; `done(tenant)` after each
    one that needs nothing more. A failure that may pass raises (SqlFailure) and leaves the rest for the
    next try; one that cannot (e.g. a database of that name the tenant role does not own: `name_taken`)
    is logged and that tenant left as it is, so it does not hold up the shard's verification forever."""
    for tenant in tenants:
        try:
            if not tenant_state(admin, tenant).absent:
                drop_tenant(admin, tenant)
                log.warning(REPEATED_MESSAGE, extra={"shard": shard, "tenant": tenant, "reason": "TenantDropRepeated"})
        except SqlFailure as failure:
            if failure.retryable:
                raise
            log.warning(REFUSED_MESSAGE, extra={"shard": shard, "tenant": tenant, "error": failure.error_class})
        done(tenant)
