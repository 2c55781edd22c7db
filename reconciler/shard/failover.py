"""Tenants verified after the primary's timeline changed: a failover may have lost the last commits.

With asynchronous replication a promoted replica may lack what the old primary committed last: a tenant
made, or a password set, just before the failover. The Shard check reads the primary's timeline
(`ShardProbe.timeline`); when it differs from the one in the Shard's `status.timeline`, every Ready
Database placed on the shard is verified once by the Database workers, in the shard's lane (so bounded
like its other work): a tenant whose role or database is missing is provisioned again, one that exists
gets its password set again from its credentials Secret (reconciler.database.failover). A soft-deleted
Database whose tenant is disabled is verified too: disabled again if the failover lost that
(reconciler.database.deletion). The drops the Shard remembers are repeated by the Shard controller
itself (reconciler.shard.dropped).

`status.timeline` is written only once every one of them was verified for the new
timeline (or on the first check that reads one): a manager that restarts before that verifies them
again (each step is idempotent), one that restarts after it does not. This module keeps the progress
of the current verification in memory; the Shard controller starts and completes it, the Database
controller asks it which databases still need it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass
class _Verification:
    timeline: int
    done: set[str] = field(default_factory=set)
    dropped_again: set[str] = field(default_factory=set)  # tenants of recorded drops handled (shard.dropped)


class TimelineRepairs:
    """The shards whose Databases are being verified after a timeline change, and which are done.

    `wake(shard)` (set by the Database controller's wiring) enqueues the shard's Databases when a
    verification starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, _Verification] = {}
        self.wake: Callable[[str], None] | None = None

    def start(self, shard: str, timeline: int) -> None:
        """The shard's primary is on `timeline`, which its status does not record yet: verify its
        Ready and disabled Databases (a verification already under way for that timeline goes on)."""
        with self._lock:
            current = self._pending.get(shard)
            if current is not None and current.timeline == timeline:
                return
            self._pending[shard] = _Verification(timeline)
        if self.wake is not None:
            self.wake(shard)

    def needed(self, shard: str | None, key: str) -> int | None:
        """The timeline the Database `key` on `shard` must still be verified for, or None."""
        if shard is None:
            return None
        with self._lock:
            current = self._pending.get(shard)
            if current is None or key in current.done:
                return None
            return current.timeline

    def verified(self, shard: str, timeline: int, key: str) -> None:
        """The Database `key` was verified on `shard` for `timeline`."""
        with self._lock:
            current = self._pending.get(shard)
            if current is not None and current.timeline == timeline:
                current.done.add(key)

    def drops_pending(self, shard: str, timeline: int, tenants: Iterable[str]) -> list[str]:
        """Those of the recorded drops `tenants` not yet repeated on `shard` for `timeline`."""
        with self._lock:
            current = self._pending.get(shard)
            handled = current.dropped_again if current is not None and current.timeline == timeline else set()
            return [tenant for tenant in tenants if tenant not in handled]

    def drop_repeated(self, shard: str, timeline: int, tenant: str) -> None:
        """The recorded drop of `tenant` needs nothing more on `shard` for `timeline`."""
        with self._lock:
            current = self._pending.get(shard)
            if current is not None and current.timeline == timeline:
                current.dropped_again.add(tenant)

    def complete(self, shard: str, timeline: int, ready: Iterable[str]) -> bool:
        """True (and the verification ends) when every key in `ready` was verified for `timeline`."""
        with self._lock:
            current = self._pending.get(shard)
            if current is None or current.timeline != timeline:
                return False
            if not set(ready) <= current.done:
                return False
            del self._pending[shard]
            return True

    def forget(self, shard: str) -> None:
        with self._lock:
            self._pending.pop(shard, None)
