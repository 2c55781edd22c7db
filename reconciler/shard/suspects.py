"""The shards whose SQL failed or hangs elsewhere: the Shard controller checks them now, not at the next interval.

A Database worker's statement that failed as if its shard were in trouble (`ShardSql.on_shard_trouble`), or
an admin session's operation that waits too long (`AdminSessions.on_slow`), calls `suspect`; the Shard
controller's next pass of that shard pings it at once (`take`; a shard checked less than a second ago
stays `pending` and is pinged when that second is over), and after a `disk_full` every ping also
writes until a write passes (`disk_full`, `disk_passed`). A suspected shard also gets no placement from
that moment (`PlacementIndex.suspend`) until one of its checks passes (`passed`): its Ready condition says
so only after that check, and new databases must not land on a dying shard meanwhile. Made before the
admin sessions, the Shard controller and the Database controller, which all take it in their
constructors.

Thread-safe: called from the Database workers and the sessions' watchdogs, read by the Shard workers (one
shard is checked by one worker at a time).
"""

from __future__ import annotations

import threading

from reconciler.placement_index import PlacementIndex
from reconciler.runtime import Wakeups
from reconciler.sql import errors as sqlerrors


class ShardSuspects:
    def __init__(self, wakeups: Wakeups | None = None, placement: PlacementIndex | None = None) -> None:
        self._wakeups = wakeups  # the Shard controller's: a suspected shard gets its pass now
        self._placement = placement  # a suspected shard gets no placement until a check passes
        self._suspected: set[str] = set()  # ping these at the next reconcile, whatever the last result
        self._disk: set[str] = set()  # a write failed with disk_full: probe a write until one passes
        self._lock = threading.Lock()

    def suspect(self, name: str, error_class: str | None = None) -> None:
        """SQL on this shard failed (with `error_class`) or hangs: ping it now, not at the next interval;
        after a `disk_full`, every ping also writes until a write passes."""
        with self._lock:
            if error_class == sqlerrors.DISK_FULL:
                self._disk.add(name)
            self._suspected.add(name)
        if self._placement is not None:
            self._placement.suspend(name)
        if self._wakeups is not None:
            self._wakeups.enqueue(name)

    def passed(self, name: str) -> None:
        """A check of the shard passed: placement may use it again (if its status allows)."""
        if self._placement is not None:
            self._placement.clear(name)

    def pending(self, name: str) -> bool:
        """Was the shard suspected since the last `take`? (It still is.)"""
        with self._lock:
            return name in self._suspected

    def take(self, name: str) -> bool:
        """Was the shard suspected since the last `take`? (It is not any more.)"""
        with self._lock:
            suspected = name in self._suspected
            self._suspected.discard(name)
        return suspected

    def disk_full(self, name: str) -> bool:
        """Did a write on the shard fail with disk_full, and no test write pass since?"""
        with self._lock:
            return name in self._disk

    def disk_passed(self, name: str) -> None:
        """A test write on the shard passed: its disk is no longer suspected."""
        with self._lock:
            self._disk.discard(name)

    def forget(self, name: str) -> None:
        """The Shard is gone."""
        with self._lock:
            self._suspected.discard(name)
            self._disk.discard(name)
