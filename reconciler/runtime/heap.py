"""The cycle collector while the caches fill, and after.

A start lists every Database and credentials Secret: at 100,000 of each, about 20 million container objects
that all survive. CPython runs a full collection each time the survivors grow by a quarter, so the heap is
traversed again and again while it grows: 21 full collections and 7-10 s of CPU (with the GIL held, every
thread stopped) to decode 200,000 objects that take 2.5 s to decode without them (docs/performance.md
section 5). The young collections still run (they are cheap and find short-lived cycles); only the full ones
wait until every cache has synced. Then the survivors, the caches above all, are frozen (`gc.freeze`): no
later full collection walks them again, as Python's documentation suggests for a process' long-lived state.
The trade-off is Python's: a cycle among objects alive at that moment that becomes garbage later is not
collected. The caches are plain JSON dicts (no cycles) and are freed by reference counting when replaced.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# A generation-2 threshold no start reaches (it counts generation-1 collections since the last full one).
DEFERRED = 1 << 30


class _Deferral:
    """Who is filling caches right now, and the thresholds to restore when the last one is done."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.saved = gc.get_threshold()

    def enter(self) -> None:
        with self.lock:
            if self.holders == 0:
                self.saved = gc.get_threshold()
                gc.set_threshold(self.saved[0], self.saved[1], DEFERRED)
            self.holders += 1

    def leave(self) -> None:
        with self.lock:
            self.holders -= 1
            if self.holders == 0:
                gc.set_threshold(*self.saved)


_DEFERRAL = _Deferral()


@contextmanager
def caches_filling() -> Iterator[None]:
    """Defer full collections while the body runs (the informers' first lists); freeze the heap after it if
    it returned. Nests and overlaps across threads: the thresholds come back when the last holder leaves."""
    _DEFERRAL.enter()
    try:
        yield
    finally:
        _DEFERRAL.leave()
    gc.freeze()


def caches_released() -> None:
    """A stopped manager's caches and machinery go back to the collector (`gc.unfreeze`): a process that starts
    managers again and again (the tests) must not keep every stopped one's cycles for good."""
    gc.unfreeze()
