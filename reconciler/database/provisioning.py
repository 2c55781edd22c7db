"""Provisioning: the tenant's role and database on the placed shard (ensure_tenant), a fresh login
with its own credentials (login.py: Ready means usable), then Ready.

The pass holds its shard lane's slot (the slot's admin session) for the SQL and the login only: the
Ready status write and its Event run after the slot went back (`release_slot`), so the shard's next
database does not wait for the apiserver. Ready is still written only after the login succeeded."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from domain.config import InstallConfig
from domain.constants import ANNOTATION_ROTATE_REQUESTED_AT, DatabaseReason, EventReason, Phase
from reconciler.database import secret as credentials
from reconciler.database.login import LoginCheck
from reconciler.database.ownership import recorded_at_creation
from reconciler.database.placement import check_size_class, owner
from reconciler.database.ready import READY_MESSAGE, set_drift
from reconciler.database.report import Reporter
from reconciler.database.shard_sql import ShardSql, shard_spec
from reconciler.database.state import Database
from reconciler.database.writes import DatabaseWrites
from reconciler.runtime import release_slot
from reconciler.sql.login_roles import hand_out
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import PoolerAccess, TenantSpec, ensure_tenant, set_password

log = logging.getLogger(__name__)


@dataclass
class Provisioner:
    """A placed database that is not Ready yet: ensure_tenant, a login as the tenant, then phase Ready."""

    config: InstallConfig
    sql: ShardSql
    writes: DatabaseWrites
    report: Reporter
    login: LoginCheck

    def provision(self, database: Database, shard: dict[str, Any], secret: dict[str, Any]) -> None:
        limit = check_size_class(self.config, database, self.report)
        tenant = TenantSpec(database.tenant, credentials.password(secret), limit, owner(database), pooler_access(shard))
        pending = credentials.password_pending(database, secret)

        login = credentials.user(secret)

        def ensure(session: AdminSession) -> None:
            # A finished tenant keeps its old password through ensure_tenant: set the pending one.
            if ensure_tenant(session, tenant) and pending:
                set_password(session, tenant.name, tenant.password)
            if login != tenant.name:
                # Made again after a failover lost it while its Secret names the alternate login role.
                hand_out(session, tenant.name, login, tenant.password, limit, retire_other=True)

        self.sql.run(
            database,
            shard,
            Phase.PROVISIONING,
            DatabaseReason.ENSURE_FAILED,
            ensure,
            session_reason=DatabaseReason.ADMIN_UNAVAILABLE,
        )
        credentials.password_applied(database, secret)
        self.login.verify(database, shard, secret)
        database.update(
            phase=Phase.READY,
            applied_size_class=database.spec.size_class,
            applied_connection_limit=limit,
            observed_generation=database.generation,
        )
        rotation = database.annotations.get(ANNOTATION_ROTATE_REQUESTED_AT)
        if rotation is not None:
            database.update(rotation_applied=rotation)
        self.report.ready(database, True, DatabaseReason.PROVISIONED, READY_MESSAGE)
        recorded_at_creation(database)  # ensure_tenant wrote or found this Database's record
        set_drift(self.config, database, self.report)
        # The shard's work is done: its lane slot goes to the next database now, not after the
        # Ready write (which would hold the slot for a seventh of its busy time in a burst).
        release_slot()
        self.writes.status(database, last=True)  # the pass ends here: its echo wakes none (settled)
        self.report.event(database, EventReason.READY, "ready")
        log.info("database ready", extra={"database": database.name, "shard": database.shard})


def pooler_access(shard: dict[str, Any]) -> PoolerAccess | None:
    """What the Shard's pgBouncer needs of a new tenant database (`spec.client.pooler`), if it says."""
    spec = shard_spec(shard)
    pooler = spec.client.pooler if spec is not None else None
    return PoolerAccess(pooler.auth_user, pooler.template) if pooler is not None else None
