"""A deduplicating, rate-limited work queue with client-go / kopf semantics.

- A key added many times before a worker takes it is handed out once.
- A key being processed is never handed to a second worker; if it is added meanwhile, it is
  queued again when the worker calls `done(key)`.
- `add_after(key, s)` delays (the earliest pending delay of a key wins); `add_rate_limited(key)`
  delays by the key's exponential backoff (SETTINGS.retry.reconcile: base 1 s, doubling, capped
  at 5 min) until `forget(key)` resets it.
- `shutdown()` makes `get()` return None at once (queued keys are dropped, in-flight ones finish).

Lanes (optional, `Lanes(of, limit)`; the Database controller has one per shard):
- every key belongs to a lane, `of(key)`, read again when the key is handed out, so a key that
  changed lane while it waited (a Database just placed) is handed out in its new lane;
- at most `limit` keys of one lane are in flight; a key of a full lane waits while keys of other
  lanes are handed out, and lanes with keys ready take turns (round robin), so one lane's burst
  of 1,000 keys delays another lane's next key by at most one key per busy lane;
- each key in flight holds one of its lane's `limit` numbered slots (`slot(key)`): a worker can
  keep one shard session per slot, so a lane never has more than `limit` sessions either;
- `release(key)` gives a key's slot back before `done(key)`: its pass has finished the lane's work
  (the SQL) and only writes to the apiserver are left, so the lane's next key may start now. The
  key stays in flight until `done` (never handed to a second worker, re-queued if added meanwhile).
Without lanes every key is in one lane without a limit: the queue behaves as before.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from domain.settings import SETTINGS, Backoff

log = logging.getLogger(__name__)
_RECONCILE = SETTINGS.retry.reconcile
DEFAULT_LANE = ""  # the lane of every key when the queue has no lanes, and of keys whose lane is unknown


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


@dataclass(frozen=True)
class Lanes:
    """Which lane a key belongs to (`of`, read from a cache: cheap, never blocking) and how many
    keys of one lane may be in flight at once (`limit`)."""

    of: Callable[[str], str]
    limit: int

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError("a lane needs at least one slot")


@dataclass(frozen=True)
class Slot:
    """Where a key in flight runs: its lane, and which of the lane's numbered slots (0 .. limit-1)."""

    lane: str
    index: int


@dataclass
class _Lane:
    ready: deque[str] = field(default_factory=deque)
    busy: set[int] = field(default_factory=set)  # slot indexes in flight


class WorkQueue:
    def __init__(self, rate_limiter: ExponentialBackoff | None = None, lanes: Lanes | None = None) -> None:
        self.rate_limiter = rate_limiter or ExponentialBackoff()
        self.lanes = lanes
        self._clock = time.monotonic
        self._cond = threading.Condition()
        self._lanes: dict[str, _Lane] = {}
        self._turns: deque[str] = deque()  # lanes with a key ready and a free slot, in turn order
        self._in_turns: set[str] = set()
        self._queued = 0  # keys ready in all lanes
        self._dirty: set[str] = set()  # queued (or to be re-queued when done)
        self._processing: dict[str, Slot | None] = {}  # key in flight -> its slot (None: released)
        self._waiting: dict[str, float] = {}  # key -> earliest ready time
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._shutting_down = False
        # When the one idle worker that waits for the next delayed key (the timekeeper) wakes; None: no
        # timekeeper. The other idle workers wait until a key is ready: when every idle worker slept
        # until the next due key, each due key woke all of them (and each add_after too), 14 wake-ups
        # per Shard check with 4 workers.
        self._keeper_until: float | None = None

    # -- lanes -----------------------------------------------------------------------------------

    def _lane_of(self, key: str) -> str:
        if self.lanes is None:
            return DEFAULT_LANE
        try:
            return self.lanes.of(key)
        except Exception:
            log.exception("work queue: no lane for %s; using the default lane", key)
            return DEFAULT_LANE

    def _limit(self) -> int | None:
        return None if self.lanes is None else self.lanes.limit

    def _has_room(self, lane: _Lane) -> bool:
        limit = self._limit()
        return limit is None or len(lane.busy) < limit

    def _offer(self, name: str) -> None:
        """Give lane `name` a turn (once) and wake a worker if it has a key ready and a free slot."""
        lane = self._lanes.get(name)
        if lane is None:
            return
        if lane.ready and self._has_room(lane):
            if name not in self._in_turns:
                self._in_turns.add(name)
                self._turns.append(name)
            self._cond.notify()
        elif not lane.ready and not lane.busy:
            del self._lanes[name]  # an idle lane costs nothing (shards come and go)

    def _enqueue_locked(self, key: str) -> None:
        name = self._lane_of(key)
        self._lanes.setdefault(name, _Lane()).ready.append(key)
        self._queued += 1
        self._offer(name)

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
        self._enqueue_locked(key)

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
            if self._keeper_until is None:
                self._cond.notify()  # an idle worker becomes the timekeeper
            elif ready < self._keeper_until:
                self._cond.notify_all()  # the timekeeper must wake earlier (it cannot be woken alone)

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

    def _take_locked(self) -> str | None:
        """The next key of the lane whose turn it is (re-filed first if its lane changed), or None."""
        while self._turns:
            name = self._turns.popleft()
            self._in_turns.discard(name)
            lane = self._lanes[name]
            key = lane.ready.popleft()
            self._queued -= 1
            actual = self._lane_of(key)
            if actual != name:  # e.g. a Database placed since it was queued: it waits in its shard's lane
                self._lanes.setdefault(actual, _Lane()).ready.append(key)
                self._queued += 1
                self._offer(actual)
                self._offer(name)
                continue
            index = next(i for i in itertools.count() if i not in lane.busy)
            lane.busy.add(index)
            self._processing[key] = Slot(name, index)
            self._dirty.discard(key)
            self._offer(name)  # its next turn comes after the other lanes' (round robin)
            return key
        return None

    def get(self, timeout: float | None = None) -> str | None:
        """Block for the next key; None once shut down. Raises TimeoutError after `timeout`.

        Of the idle callers one (the timekeeper) waits for the next delayed key, the others until a key
        is ready; whoever leaves with no timekeeper left while keys are delayed wakes another."""
        deadline = None if timeout is None else time.monotonic() + timeout
        keeper = False
        with self._cond:
            try:
                while True:
                    if self._shutting_down:
                        return None
                    next_due = self._promote_due_locked()
                    key = self._take_locked()
                    if key is not None:
                        return key
                    wait: float | None = None
                    if next_due is not None and (keeper or self._keeper_until is None):
                        keeper, wait = True, next_due
                        self._keeper_until = self._clock() + next_due
                    elif keeper:  # nothing delayed any more
                        keeper, self._keeper_until = False, None
                    if deadline is not None:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise TimeoutError("work queue: nothing to do")
                        wait = remaining if wait is None else min(wait, remaining)
                    self._cond.wait(wait)
            finally:
                if keeper:
                    self._keeper_until = None
                if self._keeper_until is None and self._heap and not self._shutting_down:
                    self._cond.notify()  # an idle worker keeps the time now

    def done(self, key: str) -> None:
        """The worker finished key: its slot is free; if it was added meanwhile, queue it again."""
        with self._cond:
            self._free_slot_locked(key)
            self._processing.pop(key, None)
            if key in self._dirty and not self._shutting_down:
                self._enqueue_locked(key)

    def release(self, key: str) -> None:
        """The pass of key needs its lane slot no more (see the module docstring): the lane's next key
        may take it now; key stays in flight until `done(key)`. A no-op for a key not in flight or
        released already."""
        with self._cond:
            self._free_slot_locked(key)

    def _free_slot_locked(self, key: str) -> None:
        slot = self._processing.get(key)
        if slot is None:
            return
        self._processing[key] = None
        lane = self._lanes.get(slot.lane)
        if lane is not None:
            lane.busy.discard(slot.index)
            self._offer(slot.lane)

    def slot(self, key: str) -> Slot | None:
        """The lane and slot of a key in flight (None: not in flight, or its slot released)."""
        with self._cond:
            return self._processing.get(key)

    # -- lifecycle -------------------------------------------------------------------------------

    def shutdown(self) -> None:
        with self._cond:
            self._shutting_down = True
            for lane in self._lanes.values():
                lane.ready.clear()
            self._turns.clear()
            self._in_turns.clear()
            self._queued = 0
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
            return self._queued

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

    def lane_stats(self) -> dict[str, tuple[int, int]]:
        """Per lane with keys ready or in flight: (keys ready, keys in flight). Delayed keys are not
        in a lane yet (their lane is read when they are due)."""
        with self._cond:
            self._promote_due_locked()
            return {name: (len(lane.ready), len(lane.busy)) for name, lane in self._lanes.items()}
