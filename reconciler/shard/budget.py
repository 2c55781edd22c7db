"""A Shard's connection budget in its status: the budget from its last check (times the install's
overcommit ratio for the shard), what the databases placed on it commit (from the Database cache; a
disabled tenant commits nothing), how many more databases of the default connection limit fit, the
condition ConnectionBudgetExceeded, and one log line each time a shard becomes overcommitted or stops
being so.

Kept apart from the Shard controller's health checks: the check only reads the server's slots
(reconciler.sql.shard_probe, in its one statement); everything else is computed here. Nothing is ever
changed on the tenants: an overcommitted shard (a lower max_connections, a larger
connectionBudget.reserved, an operator's resize) is reported and gets no more placements, and its
databases keep their limits.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from domain.conditions import condition_is_true
from domain.config import InstallConfig
from domain.connection_budget import (
    Commitments,
    ServerSlots,
    budget,
    database_limit,
    databases_available,
    provider_sessions,
)
from domain.constants import ShardConditionType, ShardReason
from domain.objects import Obj, ShardState
from domain.resources import database_shard
from domain.status import ShardStatus
from informers import Informer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardBudget:
    """The budget (None: never read), what is committed against it and how many more databases of the
    default connection limit fit (both None while the budget is unknown; `available` also when the
    Shard's spec is invalid)."""

    budget: int | None
    committed: int | None
    available: int | None = None

    @property
    def exceeded(self) -> bool:
        return self.budget is not None and self.committed is not None and self.committed > self.budget

    def message(self) -> str:
        if self.budget is None:
            return "connection budget not read yet"
        if not self.exceeded:
            return f"the databases placed here commit {self.committed} of {self.budget} connections"
        return (
            f"the databases placed here commit {self.committed} connections, more than the budget of {self.budget}: "
            "no new databases are placed here, existing ones keep their limits"
        )


class ShardBudgets:
    """Computes and records each shard's budget; `workers_per_shard` sizes the provider's own sessions.

    What each shard's databases commit is kept up to date from the Database informer's events, not summed
    over the shard's databases at each check: at 100,000 on 200 shards that sum walked 500 databases in
    every Ready check.
    """

    def __init__(self, config: InstallConfig, databases: Informer, workers_per_shard: int) -> None:
        self.config = config
        self.provider = provider_sessions(workers_per_shard)
        self._commitments: dict[str, Commitments] = {}  # shard -> what the databases the cache places there commit
        self._lock = threading.Lock()
        databases.add_handler(self._database_event)  # replays what the cache holds already

    def _database_event(self, event_type: str, old: Obj | None, new: Obj | None) -> None:
        before = [(shard, database_limit(old, self.config)) for shard in database_shard(old)] if old else []
        after = [(shard, database_limit(new, self.config)) for shard in database_shard(new)] if new else []
        if before == after:
            return  # the common update: neither its shard nor what it commits changed
        with self._lock:
            for shard, limit in before:
                self._commit(shard, limit, -1)
            for shard, limit in after:
                self._commit(shard, limit, 1)

    def _commit(self, shard: str, limit: int | None, count: int) -> None:
        committed = self._commitments.get(shard, Commitments()).plus(limit, count)
        if committed == Commitments():
            self._commitments.pop(shard, None)  # a shard emptied (or deleted) leaves nothing behind
        else:
            self._commitments[shard] = committed

    def committed(self, shard: str) -> Commitments:
        """What the databases the cache places on `shard` commit."""
        with self._lock:
            return self._commitments.get(shard, Commitments())

    def of(
        self,
        shard: str,
        slots: ServerSlots | None,
        status: ShardStatus,
        *,
        max_databases: int | None = None,
        takes_databases: bool = False,
    ) -> ShardBudget:
        """From the slots just read, else the budget last recorded (a check that did not get that far).
        `max_databases`: the Shard's (None: its spec is invalid); `takes_databases`: it is open to new ones
        (Ready, accepting, not being deleted), else none fits."""
        settings = self.config.connection_budget
        if slots is not None:
            shard_budget: int | None = budget(slots, self.provider, settings.reserved, settings.overcommit_of(shard))
        else:
            shard_budget = status.connection_budget
        if shard_budget is None:
            return ShardBudget(None, None)
        committed = self.committed(shard)
        available = None
        if max_databases is not None:
            limit = self.config.connection_limit.default
            count = status.database_count or 0
            fit = databases_available(max_databases, count, limit, committed, shard_budget)
            available = fit if takes_databases else 0
        return ShardBudget(shard_budget, committed.total(shard_budget), available)

    def record(self, shard: ShardState, view: ShardBudget) -> ShardState:
        """`shard` with the budget's status fields and condition; a log line when it turns overcommitted or back."""
        if view.budget is None:
            return shard
        was_exceeded = condition_is_true(shard.status.conditions, ShardConditionType.CONNECTION_BUDGET_EXCEEDED)
        shard = shard.with_status(connection_budget=view.budget, connections_committed=view.committed)
        if view.available is not None:
            shard = shard.with_status(databases_available=view.available)
        shard = shard.with_condition(
            ShardConditionType.CONNECTION_BUDGET_EXCEEDED,
            view.exceeded,
            ShardReason.OVERCOMMITTED if view.exceeded else ShardReason.OK,
            view.message(),
        )
        if view.exceeded != was_exceeded:
            extra = {"shard": shard.name, "budget": view.budget, "committed": view.committed}
            if view.exceeded:
                log.warning("shard connection budget exceeded", extra=extra)
            else:
                log.info("shard connection budget no longer exceeded", extra=extra)
        return shard
