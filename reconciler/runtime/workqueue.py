"""A deduplicating, rate-limited work queue with client-go / kopf semantics.

- A key added many times before a worker takes it is handed out once.
- A key being processed is never handed to a second worker; if it is added meanwhile, it is
  queued again when the worker calls `done(key)`.
- `add_after(key, s)` delays (the earliest pending delay of a key wins); `add_rate_limited(key)`
  delays by the key's exponential backoff (SETTINGS.retry.reconcile: base 1 s, doubling, capped
  at 5 min) until `forget(key)` resets it.
- `shutdown()` makes `get()` return None at once (queued keys are dropped, in-flight ones finish).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque

from domain.settings import SETTINGS, Backoff

_RECONCILE = SETTINGS.retry.reconcile


class ExponentialBackoff:
    """Per-key failure counts on one `Backoff` scheme: the n-th retry of a key waits scheme.delay(n)."""

    def __init__(
        self, base: float = _RECONCILE.base, max_delay: float = _RECONCILE.cap, factor: float = _RECONCILE.factor
    ) -> None:
        self.scheme = Backoff(base, factor, max_delay)  # replaceable (the manager caps it)
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def when(self, key: str) -> float:
        """The delay for the next retry of key (and count this failure)."""
        with self._lock:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        return self.scheme.delay(failures)

    def forget(self, key: str) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        with self._lock:
            return self._failures.get(key, 0)


class WorkQueue:
    def __init__(self, rate_limiter: ExponentialBackoff | None = None) -> None:
        self.rate_limiter = rate_limiter or ExponentialBackoff()
        self._clock = time.monotonic
        self._cond = threading.Condition()
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()  # queued (or to be re-queued when done)
        self._processing: set[str] = set()
        self._waiting: dict[str, float] = {}  # key -> earliest ready time
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._shutting_down = False

    # -- adding ----------------------------------------------------------------------------------

    def add(self, key: str) -> None:
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: str) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # re-queued by done()
        self._queue.append(key)
        self._cond.notify()

    def add_after(self, key: str, seconds: float) -> None:
        if seconds <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutting_down:
                return
            ready = self._clock() + seconds
            current = self._waiting.get(key)
            if current is not None and current <= ready:
                return
            self._waiting[key] = ready
            heapq.heappush(self._heap, (ready, next(self._seq), key))
            self._cond.notify_all()  # a getter may have to wake earlier now

    def add_rate_limited(self, key: str) -> float:
        """Re-add key after its backoff; returns the delay used."""
        delay = self.rate_limiter.when(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """Reset key's backoff (call on success)."""
        self.rate_limiter.forget(key)

    def num_requeues(self, key: str) -> int:
        return self.rate_limiter.failures(key)

    # -- taking ----------------------------------------------------------------------------------

    def _promote_due_locked(self) -> float | None:
        """Move due delayed keys to the queue; returns seconds until the next one (None = none)."""
        now = self._clock()
        while self._heap:
            ready, _, key = self._heap[0]
            if self._waiting.get(key) != ready:  # superseded by an earlier add_after
                heapq.heappop(self._heap)
                continue
            if ready > now:
                return ready - now
            heapq.heappop(self._heap)
            del self._waiting[key]
            self._add_locked(key)
        return None

    def get(self, timeout: float | None = None) -> str | None:
        """Block for the next key; None once shut down. Raises TimeoutError after `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._shutting_down:
                    return None
                next_due = self._promote_due_locked()
                if self._queue:
                    key = self._queue.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key
                wait = next_due
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError("work queue: nothing to do")
                    wait = remaining if wait is None else min(wait, remaining)
                self._cond.wait(wait)

    def done(self, key: str) -> None:
        """The worker finished key; if it was added meanwhile, queue it again."""
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty and not self._shutting_down:
                self._queue.append(key)
                self._cond.notify()

    # -- lifecycle -------------------------------------------------------------------------------

    def shutdown(self) -> None:
        with self._cond:
            self._shutting_down = True
            self._queue.clear()
            self._dirty.clear()
            self._waiting.clear()
            self._heap.clear()
            self._cond.notify_all()

    @property
    def shutting_down(self) -> bool:
        with self._cond:
            return self._shutting_down

    def __len__(self) -> int:
        """Keys ready to be handed out (not counting delayed or in-flight ones)."""
        with self._cond:
            self._promote_due_locked()
            return len(self._queue)

    def pending(self) -> int:
        """Keys delayed by add_after / add_rate_limited."""
        with self._cond:
            return len(self._waiting)

    def due_in(self, key: str) -> float | None:
        """Seconds until a delayed key is due (None: not delayed): tells a backoff from a slow requeue."""
        with self._cond:
            ready = self._waiting.get(key)
            return None if ready is None else ready - self._clock()

    def processing(self) -> int:
        with self._cond:
            return len(self._processing)
