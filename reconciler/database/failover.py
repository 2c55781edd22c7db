"""A Ready database verified once after its shard's primary changed timeline (reconciler.shard.failover).

The one exception to "a Ready database runs no SQL on a resync": a failover onto a replica that had not
received the last commits may have lost the tenant (made just before it) or its last password change.
One catalog read per database, in the shard's lane:
- the tenant is there but closed as a soft delete leaves it (NOLOGIN, its database taking no connections):
  the failover lost its recovery, which is done again (`enable_tenant`, the login role handed out only),
  with a Warning Event `TenantEnabledAgain`, and it goes on as below;
- the tenant is there (role and open database): the login role handed out (the tenant role, or its
  alternate after a rotation with an overlap) gets its password set again from its credentials Secret
  (its sessions are left alone; the other login role is retired unless an overlap runs), which repairs
  a rotation the failover lost, and so is its connection limit if the role has another than
  `status.appliedConnectionLimit` (a lost resize);
- its role or database is missing: it goes through provisioning again (reconciler.database.provisioning:
  the same name, the password from its credentials Secret, the login check, Ready), which never drops
  anything; a Warning Event `TenantRecreated` and a log line say so. Its data is not recovered: what the
  failover lost is gone.
A failed statement is recorded and retried like a rotation's; the database counts as verified only once
this ran through.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from domain.constants import DatabaseReason, EventReason, Phase
from domain.specs import ShardSpec
from reconciler.database import secret as credentials
from reconciler.database.provisioning import Provisioner
from reconciler.database.ready import login_of
from reconciler.database.report import Reporter
from reconciler.database.shard_sql import ShardSql, client_endpoint
from reconciler.database.state import Database
from reconciler.shard.failover import TimelineRepairs
from reconciler.sql.login_roles import hand_out
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import TenantState, enable_tenant, set_connection_limit, set_password, tenant_state

log = logging.getLogger(__name__)
ENABLED_AGAIN_MESSAGE = (
    "enabled again after a failover of its shard: the new primary had it still disabled (its recovery from "
    "the soft delete was committed just before the failover, not yet replicated)"
)
RECREATED_MESSAGE = (
    "re-created after a failover of its shard: the new primary had neither its role nor its database "
    "(committed just before the failover, not yet replicated); its data from before is gone"
)


@dataclass
class FailoverVerification:
    """Verify a Ready database once after its shard's timeline changed (see the module docstring)."""

    repairs: TimelineRepairs
    sql: ShardSql
    secrets: credentials.CredentialsSecrets
    report: Reporter
    provisioner: Provisioner

    def verify(self, database: Database, shard: dict[str, Any], spec: ShardSpec) -> None:
        timeline = self.repairs.needed(database.shard, database.key)
        if timeline is None:
            return
        secret = self.secrets.ensure(database, client_endpoint(spec), values=True)
        tenant, password = database.tenant, credentials.password(secret)
        limit = database.status.applied_connection_limit
        present: list[bool] = []
        enabled_again: list[bool] = []

        login = login_of(database)
        overlap_running = database.status.retire_login_at is not None

        def check(session: AdminSession) -> None:
            state = tenant_state(session, tenant)
            if closed_by_soft_delete(state):
                enable_tenant(session, tenant, login=login)
                enabled_again.append(True)
                state = tenant_state(session, tenant)
            # The tenant role may have no login of its own while its alternate is handed out.
            there = state.role_exists and state.open
            present.append(there)
            if not there:
                return
            if limit is None:
                set_password(session, tenant, password)
                return
            # The login role handed out gets the Secret's password (made again if the failover lost it);
            # the other one keeps working only while an overlap runs.
            hand_out(session, tenant, login, password, limit, retire_other=not overlap_running)
            if state.connection_limit != limit:
                set_connection_limit(session, tenant, limit)

        self.sql.run(database, shard, Phase.READY, DatabaseReason.ADMIN_UNAVAILABLE, check)
        if enabled_again:
            self.report.event(database, EventReason.TENANT_ENABLED_AGAIN, ENABLED_AGAIN_MESSAGE, warning=True)
            log_repair("tenant enabled again after a failover", database, timeline)
        if not present[-1]:
            self.provisioner.provision(database, shard, secret)
            self.report.event(database, EventReason.TENANT_RECREATED, RECREATED_MESSAGE, warning=True)
            log_repair("tenant re-created after a failover", database, timeline)
        self.repairs.verified(database.shard, timeline, database.key)


def log_repair(line: str, database: Database, timeline: int) -> None:
    """The warning log line of a repair after a failover (its Event says the same on the Database)."""
    log.warning(line, extra={"database": database.name, "shard": database.shard, "timeline": timeline})


def closed_by_soft_delete(state: TenantState) -> bool:
    """The tenant's role and database exist, its database was opened once (PUBLIC revoked, CONNECT granted
    to the tenant) and takes no connections now: what a disable leaves, unlike an unfinished provisioning."""
    return (
        state.role_exists
        and state.database_exists
        and state.owned_by_role
        and state.public_revoked
        and state.tenant_can_connect
        and not state.allow_connections
    )
