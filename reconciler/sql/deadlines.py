"""One thread that acts at the deadlines of every SQL operation of the process.

Each operation is bounded by a watchdog (reconciler.sql.session) that cuts its session at the
deadline and, after `suspect_after` seconds, asks for a shard check. That used to be a
`threading.Timer` per operation: a new thread started and ended for every statement batch, about
0.2-0.3 ms of CPU each (thread creation, its start handshake, its exit), which the Shard checks of a
large fleet paid several times a second. Here one daemon thread keeps
the deadlines in a heap and sleeps until the earliest.

What runs on it must return at once (cutting a socket): a blocked action would delay every other
deadline of the process. Anything slower is handed to a thread of its own by the caller.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable

# Cancelled entries stay in the heap until they come first; past this many (and half the heap) it is
# rebuilt, so a burst of quick operations with long deadlines keeps no garbage for minutes.
_COMPACT_AFTER = 64


class Deadline:
    """One scheduled action; `cancel()` drops it (and its references) for good."""

    __slots__ = ("action", "when")

    def __init__(self, when: float, action: Callable[[], object]) -> None:
        self.when = when
        self.action: Callable[[], object] | None = action

    @property
    def cancelled(self) -> bool:
        return self.action is None


class Deadlines:
    """A heap of `Deadline`s served by one daemon thread, started on first use (and again in a forked child)."""

    def __init__(self, name: str = "sql-deadlines") -> None:
        self.name = name
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._cancelled = 0
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def at(self, when: float, action: Callable[[], object]) -> Deadline:
        """Call `action()` on the deadline thread once `time.monotonic()` reaches `when`, unless cancelled first."""
        deadline = Deadline(when, action)
        with self._cond:
            self._ensure_thread()
            first = not self._heap or when < self._heap[0][0]
            heapq.heappush(self._heap, (when, next(self._seq), deadline))
            if first:
                self._cond.notify()  # it sleeps until a later deadline, or for good
        return deadline

    def cancel(self, deadline: Deadline) -> None:
        with self._cond:
            if deadline.action is None:
                return
            deadline.action = None
            self._cancelled += 1
            if self._cancelled > _COMPACT_AFTER and 2 * self._cancelled > len(self._heap):
                self._heap = [entry for entry in self._heap if entry[2].action is not None]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def pending(self) -> int:
        """Deadlines not yet due nor cancelled (tests: an operation's bound does not outlive it)."""
        with self._cond:
            return sum(1 for entry in self._heap if entry[2].action is not None)

    def _ensure_thread(self) -> None:
        if self._pid != os.getpid():  # a forked child has the heap but not the thread
            self._pid, self._thread = os.getpid(), None
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()

    def _next_due(self) -> Callable[[], object]:
        """Wait for the earliest live deadline; its action (taken off the heap)."""
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].action is None:
                    heapq.heappop(self._heap)
                    self._cancelled -= 1
                if not self._heap:
                    self._cond.wait()
                    continue
                when, _, deadline = self._heap[0]
                remaining = when - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                heapq.heappop(self._heap)
                action, deadline.action = deadline.action, None
                assert action is not None
                return action

    def _serve(self) -> None:
        while True:
            action = self._next_due()
            try:
                action()
            except Exception:  # noqa: BLE001 - one failed action must not stop the others' deadlines
                pass


DEADLINES = Deadlines()
