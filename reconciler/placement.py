"""Capacity-aware placement: pick the shard a new Database goes to, from the informer caches alone.

The rule: the usable shard (of the engine, accepting, Ready, not being deleted, below
`maxDatabases`) with the fewest databases where the new database's connection limit fits the
shard's connection budget (domain.connection_budget.fits); ties go to the smallest name. The count
per shard is the number of Database objects placed there (Deleting ones included: they still hold
a slot until they are dropped), the committed connections their limits. A Shard whose spec does
not validate, or whose budget was never read, is never a candidate.

`PlacementIndex` keeps the usable shards of each engine ordered by (count, name), updated by the
Shard and Database informers' events, so placing one database costs the same with 20 or 200
shards: no API call, no SQL, no scan of the fleet.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sortedcontainers import SortedList

from domain.conditions import READY, is_condition_true, object_conditions
from domain.connection_budget import Commitments, fits
from domain.specs import parse_shard
from informers import Informer

Obj = dict[str, Any]


@dataclass(frozen=True)
class ShardCandidate:
    """What placement needs to know about one Shard."""

    name: str
    engine: str
    accepting: bool
    ready: bool
    max_databases: int
    being_deleted: bool = False
    connection_budget: int | None = None  # status.connectionBudget; None: not read yet

    @classmethod
    def from_object(cls, shard: Mapping[str, Any]) -> ShardCandidate:
        """The candidate of a Shard object; pydantic.ValidationError if its spec does not validate.

        Ready only with a known budget: a shard whose check has not read it yet waits like one not Ready.
        """
        spec = parse_shard(shard)
        budget = (shard.get("status") or {}).get("connectionBudget")
        budget = budget if isinstance(budget, int) and not isinstance(budget, bool) else None
        return cls(
            name=shard["metadata"]["name"],
            engine=spec.engine,
            accepting=spec.accepting,
            ready=is_condition_true(object_conditions(shard), READY) and budget is not None,
            max_databases=spec.max_databases,
            being_deleted=bool(shard["metadata"].get("deletionTimestamp")),
            connection_budget=budget,
        )

    def usable(self, count: int) -> bool:
        """Accepting, Ready, not being deleted, and below its (soft) limit."""
        return self.accepting and self.ready and not self.being_deleted and count < self.max_databases


class PlacementIndex:
    """The usable shards of each engine, ordered by (databases placed, name), kept current by events.

    Register it before any handler that enqueues Databases for placement (the informers call
    handlers in registration order), so a worker woken by a Shard or Database event already
    places with that event applied. Like every cache, it can lag the apiserver by the events in
    flight: two workers may place on the same shard before either placement is seen, which makes
    `maxDatabases` a soft limit (as documented).
    """

    def __init__(
        self,
        database_shard: Callable[[Obj], Iterable[str]],
        database_limit: Callable[[Obj], int | None] = lambda _: None,
    ) -> None:
        """`database_limit`: the CONNECTION LIMIT a Database commits (domain.connection_budget.database_limit)."""
        self._database_shard = database_shard
        self._database_limit = database_limit
        self._lock = threading.Lock()
        self._candidates: dict[str, ShardCandidate] = {}
        self._counts: Counter[str] = Counter()
        self._commitments: dict[str, Commitments] = {}  # shard -> what its databases commit
        self._usable: dict[str, SortedList[tuple[int, str]]] = {}  # engine -> SortedList of (count, name)
        self._entries: dict[str, tuple[str, tuple[int, str]]] = {}  # shard -> (engine, its entry)

    def watch(self, shards: Informer, databases: Informer) -> PlacementIndex:
        """Follow the two informers (replaying what they already hold)."""
        databases.add_handler(self.database_event)
        shards.add_handler(self.shard_event)
        return self

    def choose(self, engine: str, connection_limit: int | None = None) -> str | None:
        """The shard a new database of `engine` (and of that connection limit) goes to; None = no capacity.

        The usable shards in order, the first whose budget the limit fits (None: budgets not checked).
        """
        with self._lock:
            for _, name in self._usable.get(engine, ()):
                committed, budget = self._commitments.get(name, Commitments()), self._candidates[name].connection_budget
                if connection_limit is None or fits(connection_limit, committed, budget):
                    return name
            return None

    def not_ready(self, engine: str) -> list[str]:
        """Shards of `engine` that would be considered but are not Ready (sorted names).

        Placement found nothing usable: with one of these the lack is transient (a shard with room
        is down or being checked), not a lack of capacity. A full shard that is down offers nothing.
        """
        with self._lock:
            return sorted(
                c.name
                for c in self._candidates.values()
                if c.engine == engine
                and c.accepting
                and not c.being_deleted
                and not c.ready
                and self._counts[c.name] < c.max_databases
            )

    def shard_event(self, event_type: str, old: Obj | None, new: Obj | None) -> None:
        with self._lock:
            if new is None:
                name = (old or {})["metadata"]["name"]
                self._candidates.pop(name, None)
            else:
                name = new["metadata"]["name"]
                try:
                    self._candidates[name] = ShardCandidate.from_object(new)
                except ValidationError:
                    # Never placed on, and no transient lack either: the Shard controller reports it
                    # (Ready False, "the Shard's spec is invalid") until the spec is fixed.
                    self._candidates.pop(name, None)
            self._refresh(name)

    def database_event(self, event_type: str, old: Obj | None, new: Obj | None) -> None:
        before = set(self._database_shard(old)) if old is not None else set()
        after = set(self._database_shard(new)) if new is not None else set()
        limit_before = self._database_limit(old) if old is not None else None
        limit_after = self._database_limit(new) if new is not None else None
        if before or after:
            with self._lock:
                for name in before:
                    self._commitments[name] = self._commitments.get(name, Commitments()).plus(limit_before, -1)
                for name in after:
                    self._commitments[name] = self._commitments.get(name, Commitments()).plus(limit_after)
        if before == after:
            return
        with self._lock:
            for name in before - after:
                self._counts[name] -= 1
                if self._counts[name] <= 0:
                    del self._counts[name]
                self._refresh(name)
            for name in after - before:
                self._counts[name] += 1
                self._refresh(name)

    def _refresh(self, name: str) -> None:
        """Re-file one shard after its candidate or its count changed (lock held)."""
        previous = self._entries.pop(name, None)
        if previous is not None:
            engine, entry = previous
            self._usable[engine].remove(entry)
        candidate = self._candidates.get(name)
        count = self._counts.get(name, 0)
        if candidate is not None and candidate.usable(count):
            entry = (count, name)
            self._usable.setdefault(candidate.engine, SortedList()).add(entry)
            self._entries[name] = (candidate.engine, entry)
