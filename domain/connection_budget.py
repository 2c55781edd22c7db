"""A shard's connection budget: how many connections its tenants' CONNECTION LIMITs may add up to.

Placement counts connections as well as databases: one consumer's few large databases must not be
able to take every connection slot of a shared server. The budget is what the server allows
ordinary roles (`max_connections` minus `superuser_reserved_connections` and, from 16 on,
`reserved_connections`), minus the provider's own sessions on the shard (`provider_sessions`) and
the install's `connectionBudget.reserved` (other roles: monitoring, the operator's users), times the
shard's `connectionBudget.overcommit` ratio (1 unless the install names the shard: one behind a
transaction-mode pooler, whose tenants rarely hold all their server connections at once).

A database commits its role's CONNECTION LIMIT: the one applied on the shard, or, before it is
provisioned, the one its size class resolves to. A soft-deleted database whose tenant is disabled
(its role NOLOGIN, its database closed to connections) commits nothing: it cannot connect until it
is recovered, and its recovery waits until its limit fits again. The rule for an unlimited database (-1): its role
can take every slot, so it commits the shard's whole budget. It is placed only on a shard where
nothing is committed yet, and nothing else fits beside it (a database of limit 0 aside).

Pure functions: the Shard controller reports with them, placement decides with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from domain.config import InstallConfig, UnknownSizeClass
from domain.constants import DatabaseConditionType, Phase
from domain.objects import DatabaseGlance

UNLIMITED = -1
# Sessions the provider may hold on one shard per Database worker: its admin session, and a second
# one while a drop cleans another tenant's database (reconciler.sql.foreign_grants).
SESSIONS_PER_WORKER = 2
CHECK_SESSIONS = 1  # the Shard controller's health check opens one session of its own


@dataclass(frozen=True)
class ServerSlots:
    """What a server allows, as its settings say."""

    max_connections: int
    superuser_reserved: int
    reserved: int = 0  # reserved_connections (PostgreSQL 16+; 0 before)

    @property
    def for_ordinary_roles(self) -> int:
        """Slots a role without superuser or pg_use_reserved_connections may take."""
        return max(0, self.max_connections - self.superuser_reserved - self.reserved)


def provider_sessions(workers_per_shard: int) -> int:
    """The most sessions the provider itself holds on one shard at once."""
    return SESSIONS_PER_WORKER * workers_per_shard + CHECK_SESSIONS


def budget(slots: ServerSlots, provider: int, reserved: int, overcommit: float = 1.0) -> int:
    """Connections the shard's tenants may commit: never below 0. `overcommit` multiplies what is left for
    the tenants only (the provider's sessions and the reserved ones are real connections)."""
    return max(0, int((slots.for_ordinary_roles - provider - reserved) * overcommit))


@dataclass(frozen=True)
class Commitments:
    """What the databases of one shard commit: the sum of their finite limits, and how many have none."""

    connections: int = 0
    unlimited: int = 0

    @classmethod
    def of(cls, limits: Iterable[int | None]) -> Commitments:
        total = cls()
        for limit in limits:
            total = total.plus(limit)
        return total

    def plus(self, limit: int | None, count: int = 1) -> Commitments:
        """With (count=-1: without) one more database of CONNECTION LIMIT `limit` (None commits nothing)."""
        if limit is None:
            return self
        if limit == UNLIMITED:
            return Commitments(self.connections, self.unlimited + count)
        return Commitments(self.connections + count * limit, self.unlimited)

    def total(self, shard_budget: int) -> int:
        """Connections committed on a shard of this budget (an unlimited database commits all of it)."""
        return self.connections + self.unlimited * shard_budget


def fits(limit: int, commitments: Commitments, shard_budget: int | None) -> bool:
    """Whether a database of CONNECTION LIMIT `limit` fits beside what is committed; an unknown
    budget (the shard was never checked) fits nothing."""
    if shard_budget is None:
        return False
    return commitments.plus(limit).total(shard_budget) <= shard_budget


def databases_available(
    max_databases: int, database_count: int, limit: int, commitments: Commitments, shard_budget: int
) -> int:
    """How many more databases of CONNECTION LIMIT `limit` fit on a shard: below maxDatabases and, all
    together, within its connection budget."""
    room = max(0, max_databases - database_count)
    if limit == UNLIMITED:
        return min(room, 1) if fits(limit, commitments, shard_budget) else 0
    if limit <= 0:
        return room
    return min(room, max(0, shard_budget - commitments.total(shard_budget)) // limit)


def tenant_disabled(database: Mapping[str, Any]) -> bool:
    """A soft-deleted Database whose tenant is disabled (condition TenantDisabled): its role cannot log in."""
    glance = DatabaseGlance.of(database)
    return glance.phase == Phase.DELETING and glance.is_true(DatabaseConditionType.TENANT_DISABLED)


def database_limit(database: Mapping[str, Any], config: InstallConfig) -> int | None:
    """The CONNECTION LIMIT a Database object commits: the applied one, else its size class's; None
    when it commits nothing (Deleted, its tenant disabled, or a class the config no longer knows and
    never applied)."""
    status = database.get("status") or {}
    if status.get("phase") == Phase.DELETED or tenant_disabled(database):
        return None
    return connection_limit(database, config)


def connection_limit(database: Mapping[str, Any], config: InstallConfig) -> int | None:
    """The CONNECTION LIMIT of a Database's role whatever its phase: the applied one, else its size
    class's (None: a class the config no longer knows, never applied)."""
    status = database.get("status") or {}
    applied = status.get("appliedConnectionLimit")
    if isinstance(applied, int) and not isinstance(applied, bool):
        return applied
    size_class = (database.get("spec") or {}).get("sizeClass") or ""
    try:
        return config.resolve_connection_limit(size_class if isinstance(size_class, str) else "")
    except UnknownSizeClass:
        return None
