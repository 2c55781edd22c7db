"""The cycle collector while caches fill (a start's lists, and every relist after it), and after.

A start lists every Database and credentials Secret: at 100,000 of each, about 20 million container objects
that all survive. CPython runs a full collection each time the survivors grow by a quarter, so the heap is
traversed again and again while it grows: a few times the CPU of the decoding itself, with the GIL held and
every thread stopped. The young collections still run (they are cheap and find short-lived cycles); only the full ones
wait until every cache has synced. Then the survivors, the caches above all, are frozen (`gc.freeze`): no
later full collection walks them again, as Python's documentation suggests for a process' long-lived state.

A relist (after a 410 Gone, an expired continue token, any failed watch) decodes the whole collection again,
at the moment the apiserver was just degraded: every list of an informer, the first one and each relist, runs
under the same deferral (`listing`), which nests and overlaps across threads with the start's. When the last
list in progress is done in a process whose caches a start froze (a manager's), one full collection runs and
its survivors (the objects the relist stored) are frozen; a process that never froze (tests, tools) is left to
CPython's own schedule once the thresholds are back. A relist so runs one full collection instead of many
(`python -m bench.list_pages --relists`; docs/performance.md, section 5). The collection comes first
because a relist is not once per process: whatever cyclic garbage the deferral let pile up (other threads'
requests, a failed page's traceback) would otherwise be frozen with the survivors, never freed again, once per
relist. It walks only what is not frozen yet, and CPython would run it anyway as soon as the thresholds are
back. The old store's objects need nothing: they were frozen, but a frozen object is still freed by reference
counting, and the caches are plain JSON dicts (no cycles), freed when replaced. The start freezes without that
collection (it would walk the whole new heap once, 20 million objects at 100,000); the price, a cycle alive
then that becomes garbage later is never collected, is paid once.

Here in `informers` (which imports nothing of ours but `domain`) because the informers are what fill the
caches: the manager's start (`reconciler.runtime.manager`) uses the same deferral around all of them.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# A generation-2 threshold no list reaches (it counts generation-1 collections since the last full one).
DEFERRED = 1 << 30


class _Deferral:
    """Who is filling caches right now, and the thresholds to restore when the last one is done."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.saved = gc.get_threshold()
        self.frozen = False  # a start froze the caches (and no stop has released them since)

    def enter(self) -> None:
        with self.lock:
            if self.holders == 0:
                self.saved = gc.get_threshold()
                gc.set_threshold(self.saved[0], self.saved[1], DEFERRED)
            self.holders += 1

    def leave(self) -> bool:
        """True when this was the last holder (the thresholds are back)."""
        with self.lock:
            self.holders -= 1
            if self.holders == 0:
                gc.set_threshold(*self.saved)
                return True
            return False


_DEFERRAL = _Deferral()


@contextmanager
def caches_filling() -> Iterator[None]:
    """Defer full collections while the body runs (a start: every informer's first list); freeze the heap after
    it if it returned. Nests and overlaps across threads: the thresholds come back when the last holder leaves."""
    _DEFERRAL.enter()
    try:
        yield
    finally:
        _DEFERRAL.leave()
    gc.freeze()
    _DEFERRAL.frozen = True


def _collect_and_freeze() -> None:
    gc.collect()
    gc.freeze()


@contextmanager
def listing(after_last: Callable[[], None] = _collect_and_freeze) -> Iterator[None]:
    """Defer full collections while an informer lists (its first list or a relist). If the body returned, no
    other list or start is still filling and a start froze the caches: `after_last`, by default one full
    collection, then its survivors are frozen too (bench.list_pages passes the alternatives it measures). A list
    that fails midway restores the thresholds (when it is the last) and freezes nothing."""
    _DEFERRAL.enter()
    try:
        yield
    except BaseException:
        _DEFERRAL.leave()
        raise
    if _DEFERRAL.leave() and _DEFERRAL.frozen:
        after_last()


def caches_released() -> None:
    """A stopped manager's caches and machinery go back to the collector (`gc.unfreeze`): a process that starts
    managers again and again (the tests) must not keep every stopped one's cycles for good."""
    _DEFERRAL.frozen = False
    gc.unfreeze()
