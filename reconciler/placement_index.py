"""Capacity-aware placement: pick the shard a new Database goes to, from the informer caches alone.

The rule: the usable shard (of the engine, accepting, not draining, Ready, not being deleted, below
`maxDatabases`) with the fewest databases where the new database's connection limit fits the
shard's connection budget (domain.connection_budget.fits); ties go to the smallest name. The count
per shard is the number of Database objects placed there (Deleting ones included: they still hold
a slot until they are dropped), the committed connections their limits. A Shard whose spec does
not validate, whose budget was never read, or whose admin Secret this install may not read (not in
shardSecrets: no SQL could ever run there, whatever its status says) is never a candidate.

`PlacementIndex` keeps the usable shards of each engine ordered by (count, name), updated by the
Shard and Database informers' events, so placing one database costs the same with 20 or 200
shards: no API call, no SQL, no scan of the fleet.

Placement is exact under a burst: `reserve` chooses a shard and counts the database on it at once,
under the index's lock, before the placement is written. The reservation counts until the
Database informer shows the database placed (or gone), or until `release` (the write failed).
A reservation counts the database's connection limit against the shard's budget the same way. So
concurrent workers, and the cache's lag behind their writes, never put a shard over `maxDatabases`
or over its connection budget.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from pydantic import ValidationError
from sortedcontainers import SortedList

from domain.conditions import READY, condition_is_true
from domain.config import InstallConfig
from domain.connection_budget import Commitments, database_limit, fits
from domain.objects import Obj, ShardObject
from domain.resources import database_shard
from informers import Informer, object_key


@dataclass(frozen=True)
class ShardCandidate:
    """What placement needs to know about one Shard."""

    name: str
    engine: str
    accepting: bool
    ready: bool
    max_databases: int
    being_deleted: bool = False
    draining: bool = False  # spec.drain: its databases are moved off, none placed on it
    connection_budget: int | None = None  # status.connectionBudget; None: not read yet
    admin_secret: tuple[str, str] = ("", "")  # (namespace, name) of spec.admin.secretRef
    pooler: bool = False  # spec.client.pooler: new databases reach clients through a pooler; no move target

    @classmethod
    def from_object(cls, shard: Mapping[str, Any]) -> ShardCandidate:
        """The candidate of a Shard object; pydantic.ValidationError if its spec (or metadata) does not validate.

        Ready only with a known budget: a shard whose check has not read it yet waits like one not Ready.
        """
        parsed, _ = ShardObject.parse_lenient_status(shard)  # a status that does not validate: not Ready
        spec, status = parsed.spec, parsed.status
        return cls(
            name=parsed.name,
            engine=spec.engine,
            accepting=spec.accepting,
            ready=condition_is_true(status.conditions, READY) and status.connection_budget is not None,
            max_databases=spec.max_databases,
            being_deleted=parsed.metadata.deleting,
            draining=spec.drain,
            connection_budget=status.connection_budget,
            admin_secret=(spec.admin.secret_ref.namespace, spec.admin.secret_ref.name),
            pooler=spec.client.pooler is not None,
        )

    def open(self) -> bool:
        """Takes new databases at all: accepting, not draining, Ready, not being deleted."""
        return self.accepting and not self.draining and self.ready and not self.being_deleted

    def fits(self, databases: int) -> bool:
        """Does one more database fit next to `databases` (placed and reserved) under maxDatabases?

        The connection budget depends on the database's limit: PlacementIndex._first_fit checks it.
        """
        return databases < self.max_databases

    def usable(self, count: int) -> bool:
        """Open, and one more database fits."""
        return self.open() and self.fits(count)


class PlacementIndex:
    """The usable shards of each engine, ordered by (databases placed, name), kept current by events.

    Register it before any handler that enqueues Databases for placement (the informers call
    handlers in registration order), so a worker woken by a Shard or Database event already
    places with that event applied. A shard's count is its placed databases (as the cache shows
    them) plus its reservations: placements written or being written that the cache does not show
    yet. One reservation per database (by key): a second `reserve` of the same database replaces
    its first.
    """

    def __init__(
        self,
        database_shard: Callable[[Obj], Iterable[str]],
        database_limit: Callable[[Obj], int | None] = lambda _: None,
        may_read_admin_secret: Callable[[str, str], bool] = lambda _namespace, _name: True,
    ) -> None:
        """`database_limit`: the CONNECTION LIMIT a Database commits (domain.connection_budget.database_limit);
        `may_read_admin_secret(namespace, name)`: InstallConfig.may_read_admin_secret."""
        self._database_shard = database_shard
        self._database_limit = database_limit
        self._may_read_admin_secret = may_read_admin_secret
        self._lock = threading.Lock()
        self._candidates: dict[str, ShardCandidate] = {}
        self._counts: Counter[str] = Counter()  # placed (cache) + reserved, per shard
        self._commitments: dict[str, Commitments] = {}  # shard -> what its placed and reserved databases commit
        self._reserved: dict[str, tuple[str, int | None]] = {}  # database key -> (shard reserved, its limit)
        self._usable: dict[str, SortedList[tuple[int, str]]] = {}  # engine -> SortedList of (count, name)
        self._entries: dict[str, tuple[str, tuple[int, str]]] = {}  # shard -> (engine, its entry)
        self._suspects: set[str] = set()  # shards whose SQL just failed for a reason not the tenant's

    def watch(self, shards: Informer, databases: Informer) -> PlacementIndex:
        """Follow the two informers (replaying what they already hold)."""
        databases.add_handler(self.database_event)
        shards.add_handler(self.shard_event)
        return self

    def choose(self, engine: str, connection_limit: int | None = None) -> str | None:
        """The shard a new database of `engine` (and of that connection limit) would go to now; None = no
        capacity. Reserves nothing: a placement uses `reserve`."""
        with self._lock:
            return self._first_fit(engine, connection_limit)

    def reserve(
        self,
        engine: str,
        database: str,
        connection_limit: int | None = None,
        exclude: str | None = None,
        *,
        for_move: bool = False,
    ) -> str | None:
        """Choose the shard for `database` (its key) and count it there at once, one database and its
        connection limit; None = no capacity.

        The reservation holds until the Database informer shows the database placed or deleted, or
        until `release(database)`: call that when the placement write was refused. When its outcome is
        unknown (a timeout), keep it: the informer shows the write if it happened, and the database's
        next pass replaces the reservation if it did not. `exclude`: a shard never chosen (a move's source);
        `for_move`: the target of a DatabaseMove, never a shard whose client endpoint declares a pooler
        (a move refuses those).
        """
        with self._lock:
            self._release_locked(database)
            chosen = self._first_fit(engine, connection_limit, exclude, for_move=for_move)
            if chosen is not None:
                self._reserved[database] = (chosen, connection_limit)
                self._commit(chosen, connection_limit)
                self._counts[chosen] += 1
                self._refresh(chosen)
            return chosen

    def hold(self, key: str, shard: str, connection_limit: int | None = None) -> None:
        """Count `key` (a move's, e.g.) on `shard`, chosen before, until `release`: a reservation taken up
        again after a restart (the choice was recorded; the count lived in memory only)."""
        with self._lock:
            if self._reserved.get(key, (None, None))[0] == shard:
                return
            self._release_locked(key)
            self._reserved[key] = (shard, connection_limit)
            self._commit(shard, connection_limit)
            self._counts[shard] += 1
            self._refresh(shard)

    def release(self, database: str) -> None:
        """Give back the reservation of `database` (its placement write failed)."""
        with self._lock:
            self._release_locked(database)

    def commitments(self, shard: str) -> tuple[Commitments, int | None]:
        """(what the databases placed and reserved on `shard` commit, its connection budget; None: unknown)."""
        with self._lock:
            candidate = self._candidates.get(shard)
            budget = candidate.connection_budget if candidate is not None else None
            return self._commitments.get(shard, Commitments()), budget

    def suspend(self, shard: str) -> None:
        """Stop placing on `shard` at once: a Database worker's SQL there failed for a reason that is not
        its tenant's (the shard is unreachable, read-only, hangs...). Its Ready condition only says so after
        the next check; until `clear(shard)` (a check passed) it counts as not Ready."""
        with self._lock:
            self._suspects.add(shard)
            self._refresh(shard)

    def clear(self, shard: str) -> None:
        """A check of `shard` passed: place on it again (if its status allows)."""
        with self._lock:
            if shard in self._suspects:
                self._suspects.discard(shard)
                self._refresh(shard)

    def reserved(self) -> dict[str, str]:
        """Database key -> shard of every reservation the cache does not show yet (tests, debugging)."""
        with self._lock:
            return {key: shard for key, (shard, _) in self._reserved.items()}

    def _first_fit(
        self, engine: str, connection_limit: int | None, exclude: str | None = None, *, for_move: bool = False
    ) -> str | None:
        """The first shard (fewest databases, then name) of `engine` that the next database fits on.

        Every filed shard fits one more database (`_refresh` files only `usable` ones); the first of
        them whose connection budget also fits the limit (None: connections not counted) is chosen.
        """
        for _, name in self._usable.get(engine, ()):
            if name == exclude or (for_move and self._candidates[name].pooler):
                continue
            committed, budget = self._commitments.get(name, Commitments()), self._candidates[name].connection_budget
            if connection_limit is None or fits(connection_limit, committed, budget):
                return name
        return None

    def _release_locked(self, database: str) -> None:
        reservation = self._reserved.pop(database, None)
        if reservation is not None:
            shard, limit = reservation
            self._commit(shard, limit, -1)
            self._uncount(shard)

    def _commit(self, shard: str, limit: int | None, count: int = 1) -> None:
        """Count (count=-1: no longer count) one database of CONNECTION LIMIT `limit` on `shard` (lock held)."""
        self._commitments[shard] = self._commitments.get(shard, Commitments()).plus(limit, count)

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
                and not c.draining
                and not c.being_deleted
                and (not c.ready or c.name in self._suspects)
                and c.fits(self._counts[c.name])
            )

    def shard_event(self, event_type: str, old: Obj | None, new: Obj | None) -> None:
        obj = new if new is not None else old
        if obj is None:
            return
        name = object_key(obj)  # a Shard's key is its name (cluster-scoped)
        with self._lock:
            if new is None:
                self._candidates.pop(name, None)
                self._suspects.discard(name)
            else:
                try:
                    candidate: ShardCandidate | None = ShardCandidate.from_object(new)
                except ValidationError:
                    # Never placed on, and no transient lack either: the Shard controller reports it
                    # (Ready False, "the Shard's spec is invalid") until the spec is fixed.
                    candidate = None
                if candidate is not None and not self._may_read_admin_secret(*candidate.admin_secret):
                    # Never placed on either: this install would never connect (AdminSecretInvalid), even
                    # while another install sharing the cluster-scoped Shard reports it Ready.
                    candidate = None
                if candidate is None:
                    self._candidates.pop(name, None)
                else:
                    self._candidates[name] = candidate
            self._refresh(name)

    def database_event(self, event_type: str, old: Obj | None, new: Obj | None) -> None:
        before = set(self._database_shard(old)) if old is not None else set()
        after = set(self._database_shard(new)) if new is not None else set()
        obj = new if new is not None else old
        if obj is None:
            return
        key = object_key(obj)
        if not (before or after) and key not in self._reserved:
            return
        limit_before = self._database_limit(old) if old is not None and before else None
        limit_after = self._database_limit(new) if new is not None and after else None
        with self._lock:
            if new is None or after:
                self._release_locked(key)  # the cache shows where it went (or that it is gone): counted below
            for name in before:
                self._commit(name, limit_before, -1)
            for name in after:
                self._commit(name, limit_after)
            for name in before - after:
                self._uncount(name)
            for name in after - before:
                self._counts[name] += 1
                self._refresh(name)

    def _uncount(self, name: str) -> None:
        self._counts[name] -= 1
        if self._counts[name] <= 0:
            del self._counts[name]
        self._refresh(name)

    def _refresh(self, name: str) -> None:
        """Re-file one shard after its candidate or its count changed (lock held)."""
        previous = self._entries.pop(name, None)
        if previous is not None:
            engine, entry = previous
            self._usable[engine].remove(entry)
        candidate = self._candidates.get(name)
        count = self._counts.get(name, 0)
        if candidate is not None and candidate.usable(count) and name not in self._suspects:
            entry = (count, name)
            self._usable.setdefault(candidate.engine, SortedList()).add(entry)
            self._entries[name] = (candidate.engine, entry)


def placement_index(config: InstallConfig, shards: Informer, databases: Informer) -> PlacementIndex:
    """The index on the informers, before any handler that enqueues Databases (a woken worker places with
    the event applied)."""
    return PlacementIndex(database_shard, partial(database_limit, config=config), config.may_read_admin_secret).watch(
        shards, databases
    )
