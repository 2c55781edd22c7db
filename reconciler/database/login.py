"""Ready means usable: a new database turns Ready only after its own credentials logged in.

Right after the tenant's role and database exist, `LoginCheck.verify` opens a fresh session as the
tenant with the password from its credentials Secret (what the API hands the consumer), at the
Shard's client endpoint (the Secret's host, port and sslmode: pgBouncer, a load balancer...; verified
with the CA the consumers are handed, when the Shard declares one) or,
with `readiness.loginThrough: admin`, at the admin endpoint's server (for installs whose client
endpoint the provider's pods cannot reach). Until a login succeeds the database stays Provisioning
with reason `LoginFailed` (the failure's class and the endpoint in the message), retried with the
shard-trouble backoff cap, so credentials are never served for a database nobody can log in to.

A login that was not bound to TLS (reconciler.sql.tenant_login: an sslmode that may go without TLS, or an
endpoint without channel binding such as pgBouncer) may have been relayed. The tenant is then taken
back on the admin session (its password set again, every session of it ended) and its role and
database are checked for anything the provider did not make (reconciler.sql.first_login); if
something is found the database does not turn Ready (`LoginTampered`, terminal: an operator looks at
what is in front of the client endpoint and deletes the Database). Not for a Database restored onto
an existing tenant: that login is not the first, and the data found there is its consumer's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from domain.config import InstallConfig
from domain.constants import ANNOTATION_RESTORE_TENANT, DatabaseReason, Phase, SslMode
from domain.credentials import CA_CERT_KEY, secret_values
from domain.specs import ShardSpec
from informers import object_key
from reconciler.database.report import Reporter
from reconciler.database.shard_sql import SHARD_TROUBLE_RETRY_CAP, ShardSql, shard_spec
from reconciler.database.state import Database
from reconciler.runtime import ensure_active
from reconciler.shard.admin import AdminPolicy
from reconciler.sql.ca_file import ca_file
from reconciler.sql.errors import SqlFailure
from reconciler.sql.first_login import seal_first_login
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant_login import TenantLogin, log_in


@dataclass
class LoginCheck:
    config: InstallConfig
    policy: AdminPolicy
    sql: ShardSql
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
        sessions = self.sql.sessions
        if sessions.fence is not None:
            sessions.fence()  # a replica without the Lease sends nothing, not even a login
        try:
            bound = log_in(login, sessions.links.timeouts(name).total, sessions.application_name)
        except SqlFailure as failure:
            raise self.report.failure(
                database,
                Phase.PROVISIONING,
                DatabaseReason.LOGIN_FAILED,
                f"{failure}: a new session as the tenant at {login.host}:{login.port} "
                f"({self.config.readiness.login_through} endpoint) did not log in",
                retry_cap=SHARD_TROUBLE_RETRY_CAP,
            ) from None
        if not bound and ANNOTATION_RESTORE_TENANT not in database.annotations:
            # A restored tenant is not new: its consumer had its credentials, and its data is there.
            self._take_back(database, shard, spec, login)

    def _take_back(self, database: Database, shard: dict[str, Any], spec: ShardSpec, login: TenantLogin) -> None:
        """After an unbound login: the tenant's password set again, its sessions ended, and its role and
        database checked; anything found keeps the database from turning Ready."""
        found: list[str] = []

        def seal(session: AdminSession) -> None:
            found.extend(
                seal_first_login(session, database.tenant, login.password, login=login.user, pooler=spec.client.pooler)
            )

        self.sql.run(database, shard, Phase.PROVISIONING, DatabaseReason.LOGIN_FAILED, seal)
        if found:
            raise self.report.failure(
                database,
                Phase.PROVISIONING,
                DatabaseReason.LOGIN_TAMPERED,
                f"the first login as the tenant at {login.host}:{login.port} was not bound to TLS (sslmode "
                f"{login.sslmode}, or the endpoint offers no channel binding), and afterwards the database held "
                f"what the provider did not make: {'; '.join(found)}. Its sessions were ended and its password "
                "set again; it does not turn Ready: check what is in front of the client endpoint, then delete "
                "this Database",
                terminal=True,
            )

    def _client_root(self, client_ca: str | None, sslmode: str) -> str | None:
        """The CAs that verify the client endpoint under verify-ca/-full: the ones its consumers are handed
        (the Shard's client.caCert, in the Secret), else those of the admin connection."""
        if client_ca and sslmode in (SslMode.VERIFY_CA, SslMode.VERIFY_FULL):
            return ca_file(client_ca)
        return self.policy.sslrootcert(sslmode)

    def _login(self, spec: ShardSpec, secret: dict[str, Any]) -> TenantLogin:
        values = secret_values(secret)
        if self.config.readiness.login_through == "admin":
            host, port, sslmode = self.admin_host_override or spec.admin_host, spec.admin.port, str(spec.admin.sslmode)
            sslrootcert = self.policy.sslrootcert(sslmode)
        else:
            host, port, sslmode = values["host"], int(values["port"]), values["sslmode"]
            sslrootcert = self._client_root(values.get(CA_CERT_KEY), sslmode)
        return TenantLogin(
            host=host,
            port=port,
            user=values["user"],
            password=values["password"],
            dbname=values["database"],
            sslmode=sslmode,
            sslrootcert=sslrootcert,
            # The tenant's own password, sent as its consumers send it (the client block's sslmode,
            # or the admin endpoint's, whose cleartext the Shard controller already refuses unless allowed).
            cleartext_allowed=True,
        )
