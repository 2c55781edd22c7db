"""Ready means usable: a new database turns Ready only after its own credentials logged in.

Right after the tenant's role and database exist, `LoginCheck.verify` opens a fresh session as the
tenant with the password from its credentials Secret (what the API hands the consumer), at the
Shard's client endpoint (the Secret's host, port and sslmode: pgBouncer, a load balancer...) or,
with `readiness.loginThrough: admin`, at the admin endpoint's server (for installs whose client
endpoint the provider's pods cannot reach). Until a login succeeds the database stays Provisioning
with reason `LoginFailed` (the failure's class and the endpoint in the message), retried with the
shard-trouble backoff cap, so credentials are never served for a database nobody can log in to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from domain.config import InstallConfig
from domain.constants import DatabaseReason, Phase
from domain.credentials import secret_values
from domain.specs import ShardSpec
from informers import object_key
from reconciler.database.report import Reporter
from reconciler.database.shard_sql import SHARD_TROUBLE_RETRY_CAP, shard_spec
from reconciler.database.state import Database
from reconciler.runtime import ensure_active
from reconciler.shard.admin import AdminPolicy, AdminSessions
from reconciler.sql.errors import SqlFailure
from reconciler.sql.tenant_login import TenantLogin, log_in


@dataclass
class LoginCheck:
    config: InstallConfig
    policy: AdminPolicy
    sessions: AdminSessions
    report: Reporter
    admin_host_override: str | None = None

    def verify(self, database: Database, shard: dict[str, Any], secret: dict[str, Any]) -> None:
        """Log in as the tenant on a new session, or record LoginFailed and raise (retried)."""
        spec = shard_spec(shard)
        name = object_key(shard)  # a Shard is cluster-scoped: its key is its name
        if spec is None:
            raise self.report.failure(
                database, Phase.PROVISIONING, DatabaseReason.LOGIN_FAILED, f"shard {name} has an invalid spec"
            )
        login = self._login(spec, secret)
        ensure_active()
        if self.sessions.fence is not None:
            self.sessions.fence()  # a replica without the Lease sends nothing, not even a login
        try:
            log_in(login, self.sessions.links.timeouts(name).total, self.sessions.application_name)
        except SqlFailure as failure:
            raise self.report.failure(
                database,
                Phase.PROVISIONING,
                DatabaseReason.LOGIN_FAILED,
                f"{failure}: a new session as the tenant at {login.host}:{login.port} "
                f"({self.config.readiness.login_through} endpoint) did not log in",
                retry_cap=SHARD_TROUBLE_RETRY_CAP,
            ) from None

    def _login(self, spec: ShardSpec, secret: dict[str, Any]) -> TenantLogin:
        values = secret_values(secret)
        if self.config.readiness.login_through == "admin":
            host, port, sslmode = self.admin_host_override or spec.admin_host, spec.admin.port, str(spec.admin.sslmode)
        else:
            host, port, sslmode = values["host"], int(values["port"]), values["sslmode"]
        return TenantLogin(
            host=host,
            port=port,
            user=values["user"],
            password=values["password"],
            dbname=values["database"],
            sslmode=sslmode,
            sslrootcert=self.policy.sslrootcert(sslmode),
            # The tenant's own password, sent as its consumers send it (the client block's sslmode,
            # or the admin endpoint's, whose cleartext the Shard controller already refuses unless allowed).
            cleartext_allowed=True,
        )
