"""Provisioning: the tenant's role and database on the placed shard (ensure_tenant), then Ready."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from domain.config import InstallConfig
from domain.constants import ANNOTATION_ROTATE_REQUESTED_AT, DatabaseReason, EventReason, Phase
from reconciler.database import secret as credentials
from reconciler.database.placement import check_size_class, owner
from reconciler.database.ready import set_drift
from reconciler.database.report import Reporter
from reconciler.database.shard_sql import ShardSql
from reconciler.database.state import Pass
from reconciler.database.writes import DatabaseWrites
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import TenantSpec, ensure_tenant, set_password

log = logging.getLogger(__name__)


@dataclass
class Provisioner:
    """A placed database that is not Ready yet: ensure_tenant, then phase Ready."""

    config: InstallConfig
    sql: ShardSql
    writes: DatabaseWrites
    report: Reporter

    def provision(self, p: Pass, shard: dict[str, Any], secret: dict[str, Any]) -> None:
        limit = check_size_class(self.config, p, self.report)
        tenant = TenantSpec(p.tenant, credentials.password(secret), limit, owner(p))
        pending = credentials.password_pending(p, secret)

        def ensure(session: AdminSession) -> None:
            # A finished tenant keeps its old password through ensure_tenant: set the pending one.
            if ensure_tenant(session, tenant) and pending:
                set_password(session, tenant.name, tenant.password)

        self.sql.run(
            p,
            shard,
            Phase.PROVISIONING,
            DatabaseReason.ENSURE_FAILED,
            ensure,
            session_reason=DatabaseReason.ADMIN_UNAVAILABLE,
        )
        credentials.password_applied(p, secret)
        p.update(
            phase=Phase.READY,
            applied_size_class=p.spec.size_class,
            applied_connection_limit=limit,
            observed_generation=p.generation,
        )
        rotation = p.annotations.get(ANNOTATION_ROTATE_REQUESTED_AT)
        if rotation is not None:
            p.update(rotation_applied=rotation)
        self.report.ready(p, True, DatabaseReason.PROVISIONED, "tenant exists on the shard")
        set_drift(self.config, p, self.report)
        self.writes.status(p)
        self.report.event(p, EventReason.READY, "ready")
        log.info("database ready", extra={"database": p.name, "shard": shard["metadata"]["name"]})
