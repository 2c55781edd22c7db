"""What the admin role of a shard may do, and which SQL dialect the shard needs.

The provisioner must be LOGIN CREATEDB CREATEROLE and not a superuser. From PostgreSQL 16 on it
grants itself SET (not INHERIT) on each tenant role it creates. Before 16 there are no per-grant
SET/INHERIT options: membership always allows SET ROLE and inherits the tenant's privileges unless
the member is NOINHERIT, so the provisioner itself must be NOINHERIT. Before 16 CREATEROLE is also
weaker: it may alter and grant any non-superuser role, not only the ones it created
(`weak_createrole`); the provider never uses that power, but cannot prevent it.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from domain.connection_budget import ServerSlots
from reconciler.sql.session import OPERATION_TIMEOUT, Admin, run_operation

SET_OPTION_MAJOR = 16  # GRANT ... WITH SET/INHERIT, and CREATEROLE limited to own roles
MIN_MAJOR = 13  # oldest server the pre-16 dialect is written for (Cloudberry 2.x reports 14)


@dataclass(frozen=True)
class ProvisionerInfo:
    """The shard's server version and the admin role's attributes, as read from the catalog."""

    server_version_num: int
    role: str
    superuser: bool
    createdb: bool
    createrole: bool
    inherit: bool
    can_login: bool

    @property
    def major(self) -> int:
        return self.server_version_num // 10000

    @property
    def set_option_dialect(self) -> bool:
        """True from 16 on: memberships carry their own SET and INHERIT options."""
        return self.major >= SET_OPTION_MAJOR

    @property
    def weak_createrole(self) -> bool:
        """Before 16, CREATEROLE may alter and grant ANY non-superuser role, not only its own."""
        return self.major < SET_OPTION_MAJOR


_INSPECT = """
SELECT current_setting('server_version_num')::int, rolname, rolsuper, rolcreatedb, rolcreaterole,
       rolinherit, rolcanlogin
  FROM pg_catalog.pg_roles
 WHERE rolname = current_user
"""


def read_provisioner(conn: psycopg.Connection) -> ProvisionerInfo:
    """The catalog read itself, on a plain connection and without a bound (used inside operations)."""
    row = conn.execute(_INSPECT).fetchone()
    if row is None:  # the session's own role always exists
        raise RuntimeError("the provisioner query returned no row")
    return ProvisionerInfo(*row)


def inspect_provisioner(admin: Admin, *, timeout: float = OPERATION_TIMEOUT) -> ProvisionerInfo:
    """Read the admin role and server version (operation "check"; a SqlFailure on failure)."""
    return run_operation(admin, "check", read_provisioner, timeout=timeout)


def dialect_problem(info: ProvisionerInfo) -> str | None:
    """Why the provider must not run tenant SQL with this admin role, or None if it may."""
    problems: list[str] = []
    if info.major < MIN_MAJOR:
        problems.append(f"PostgreSQL {info.major} is not supported ({MIN_MAJOR} or later is required)")
    if info.superuser:
        problems.append(
            "the provisioner role is a superuser; it needs only LOGIN CREATEDB CREATEROLE and must not be a superuser"
        )
    missing = [name for name, present in (("CREATEDB", info.createdb), ("CREATEROLE", info.createrole)) if not present]
    if missing:
        problems.append(f"the provisioner role lacks {' and '.join(missing)}")
    if not info.can_login:
        problems.append("the provisioner role lacks LOGIN")
    if info.weak_createrole and info.inherit:
        problems.append(
            f"before PostgreSQL 16 the provisioner role must be NOINHERIT (ALTER ROLE {info.role} "
            "NOINHERIT): with INHERIT it would gain the privileges of every tenant role, e.g. read "
            "tenant data"
        )
    return "; ".join(problems) or None


WEAK_CREATEROLE_MESSAGE = (
    "before PostgreSQL 16, CREATEROLE lets the provisioner alter and grant any non-superuser role, "
    "not only the tenant roles it created; the provider never does so, but the shard does not "
    "enforce it"
)


# The server's connection slots; reserved_connections exists from 16 on (missing_ok gives NULL before).
# `dbprovider upgrade check` reads them so; the Shard controller's probe in its one statement.
_SLOTS = """
SELECT current_setting('max_connections')::int,
       current_setting('superuser_reserved_connections')::int,
       coalesce(current_setting('reserved_connections', true)::int, 0)
"""


def server_slots(conn: psycopg.Connection) -> ServerSlots:
    """The connection slots the server allows, on an open session."""
    row = conn.execute(_SLOTS).fetchone()
    if row is None:
        raise RuntimeError("the settings query returned no row")
    return ServerSlots(*row)
