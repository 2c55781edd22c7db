"""Database events -> the Shard and Consumer keys whose databaseCount they change, paced.

A burst of placements then writes each count once per COUNT_BURST_GAP, not once per database (the
work queue keeps the earliest pending time of a key); a change after a quiet spell shows within a second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from informers.informer import Handler
from reconciler.runtime import Controller

COUNT_COALESCE_SECONDS = 1.0
# During a burst a count is refreshed at most this often: each refresh is a status write, its watch
# event in every replica and one more pass of the Shard (bench.fleet: 0.75 Shard writes per new
# database with 1 s, 20 shards each refreshed about once a second for the whole burst).
COUNT_BURST_GAP = 5.0


def coalesced_counts(
    controller: Controller, keys: Callable[[dict[str, Any]], list[str]], counted: Callable[[dict[str, Any]], object]
) -> Handler:
    """Database events -> the Shard/Consumer keys whose databaseCount they change, a second later, and
    during a burst at most every COUNT_BURST_GAP seconds.

    An update that keeps a database on the same keys with the same `counted(db)` (what it adds to their
    status) changes nothing there and wakes no pass: the Ready write of each new database, say, whose
    Consumer passes were half of them in bench.fleet (0.42 for 0.18 writes per new database).
    """
    scheduled: dict[str, float] = {}  # key -> when its last refresh was due (time.monotonic())
    lock = threading.Lock()

    def changed(old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[str]:
        before, after = keys(old) if old is not None else [], keys(new) if new is not None else []
        if old is None or new is None or counted(old) != counted(new):
            return [*before, *(key for key in after if key not in before)]
        return [key for key in (*before, *after) if (key in before) != (key in after)]

    def handler(event_type: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        now = time.monotonic()
        for key in changed(old, new):
            with lock:
                last = scheduled.get(key)
                if last is not None and last > now:
                    continue  # a refresh is due already; it counts this change too
                due = now + COUNT_COALESCE_SECONDS
                if last is not None:
                    due = max(due, last + COUNT_BURST_GAP)
                scheduled[key] = due
            controller.enqueue_after(key, due - now)

    return handler
