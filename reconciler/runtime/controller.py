"""Controllers: N worker threads draining a work queue into a level-based `reconcile(key)`.

The contract (controller-runtime's):
- `reconcile(key)` reads the current state (from informers), converges, and returns `Result()`
  (or None). `Result(requeue_after=s)` asks for another pass in s seconds: success only.
- Raising = failure: the key is retried with per-key exponential backoff (1 s .. 5 min) and
  counted in `dbprovider_reconcile_errors_total{controller, reason, retryable="true"}` (reason
  from `ReconcileError.reason`, else "Other"). A `ReconcileError` with `retry_cap` is retried
  with the same backoff but never more than that many seconds apart (a failure caused by a
  flaky shard: the retry after its recovery must not be minutes away). `TerminalError` is counted with
  `retryable="false"` and not retried with backoff: the next event of the object brings it back,
  or its `requeue_after` (a slow fixed requeue, if the raiser gives one).
- An HTTP 409 (an `ApiException` with status 409 anywhere in the exception's cause chain) is a
  write conflict: retried with backoff and counted in `dbprovider_reconcile_conflicts_total`, not
  as an error.
- Success resets the key's backoff.
- A key is never reconciled by two workers at once; different keys run in parallel. With lanes
  (`Lanes`, see workqueue.py) at most `lanes.limit` keys of one lane run at once, the lanes take
  turns, and `workers` bounds them all; `current_slot()` tells a reconcile which lane slot it holds,
  and `release_slot()` gives it back once the pass has no more of the lane's work to do.
- `stop()` hands out no further keys, lets in-flight reconciles finish, then returns. Code that
  writes calls `ensure_active()` before each write: it raises `ControllerStopping` in a worker
  whose controller is stopping or whose leader guard says we no longer lead.
- A blip of leadership loses no key: while the guard says no (a renewal is late) the workers
  hold their next key until it says yes again or the controller stops, and a reconcile cut short
  by `ControllerStopping` in a controller that is still running is queued again. Keys dropped
  because the controller stopped come back with the full resync of the next `start()`, and
  `resync()` (the manager calls it when a late renewal resumes leading) enqueues every key.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from informers import Informer, object_key
from reconciler.runtime.metrics import OTHER_REASON, RuntimeMetrics, retryable_label
from reconciler.runtime.workqueue import ExponentialBackoff, Lanes, Slot, WorkQueue

log = logging.getLogger(__name__)
GUARD_POLL = 0.1  # seconds between looks at the leader guard while a worker holds a key


@dataclass(frozen=True)
class Result:
    """What a successful reconcile asks for: nothing, or another pass after `requeue_after` s."""

    requeue_after: float | None = None


class ReconcileError(Exception):
    """A reconcile failure with a reason (a condition reason: `AdminUnavailable`, ...) for the metric.

    `retry_cap` (seconds) bounds the backoff of this failure's retry (see the module docstring).
    """

    def __init__(self, reason: str, message: str = "", *, retry_cap: float | None = None) -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.reason = reason
        self.message = message
        self.retry_cap = retry_cap


class TerminalError(ReconcileError):
    """A failure retrying cannot fix: counted as an error, not retried with backoff.

    A new event of the object brings it back; `requeue_after` (seconds) adds one slow requeue, for
    causes fixed outside the objects the controller watches (a DBA drops a foreign database).
    """

    def __init__(self, reason: str, message: str = "", *, requeue_after: float | None = None) -> None:
        super().__init__(reason, message)
        self.requeue_after = requeue_after


class ControllerStopping(Exception):
    """Raised by `ensure_active()` when the reconcile must not write any more (stopped / lost lease)."""


_worker = threading.local()


def ensure_active() -> None:
    """Raise `ControllerStopping` if called from a worker of a controller that must stop writing.

    A no-op outside controller workers (the API, tests). Call it before every write (status
    patch, Secret, Event, SQL statement batch); the status helpers call it for you.
    """
    controller: Controller | None = getattr(_worker, "controller", None)
    if controller is not None and not controller.active():
        raise ControllerStopping(f"controller {controller.name} is stopping")


def current_slot() -> Slot | None:
    """The lane slot of the key this worker reconciles (None outside a worker): a worker keeps one
    shard session per slot, so a lane's sessions are bounded like its workers."""
    return getattr(_worker, "slot", None)


def release_slot() -> None:
    """Give the lane slot of the key this worker reconciles back before the pass ends: what is left of
    the pass are apiserver writes, which need no shard session (none may be taken after this), so the
    lane's next key starts now instead of waiting for them. The key stays in flight: no second worker
    takes it before this pass ends. A no-op outside a worker or without a slot."""
    queue: WorkQueue | None = getattr(_worker, "queue", None)
    key: str | None = getattr(_worker, "key", None)
    if queue is None or key is None or getattr(_worker, "slot", None) is None:
        return
    _worker.slot = None
    queue.release(key)


@contextmanager
def holding_slot(slot: Slot | None, queue: WorkQueue | None = None, key: str | None = None) -> Iterator[None]:
    """Run the body as the holder of `slot` (what `current_slot()` answers in this thread), for `key`
    of `queue` (what `release_slot()` gives back)."""
    _worker.slot, _worker.queue, _worker.key = slot, queue, key
    try:
        yield
    finally:
        _worker.slot, _worker.queue, _worker.key = None, None, None


def _in_chain(exc: BaseException, predicate: Callable[[BaseException], bool], implicit: bool = True) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if predicate(current):
            return True
        current = current.__cause__ or (current.__context__ if implicit else None)
    return False


def is_conflict(exc: BaseException) -> bool:
    """True for an HTTP 409 (Conflict or AlreadyExists), raised directly or as the explicit
    `__cause__` of another exception. A `ReconcileError` is never a conflict: raising one is the
    reconciler's own classification (e.g. CredentialsSecretConflict after an AlreadyExists)."""
    if isinstance(exc, ReconcileError):
        return False
    return _in_chain(exc, lambda e: isinstance(e, ApiException) and e.status == 409, implicit=False)


def describe_error(exc: BaseException) -> str:
    """A log-safe description: our sanitized messages, an API error's status only, else the type."""
    if isinstance(exc, ReconcileError):
        return str(exc)
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason or ''}".strip()
    return type(exc).__name__


def _retry_later(queue: WorkQueue, key: str, exc: Exception) -> float:
    """Queue a failed key again after its backoff, at most its error's `retry_cap`; the delay used."""
    cap = exc.retry_cap if isinstance(exc, ReconcileError) else None
    if cap is None:
        return queue.add_rate_limited(key)
    delay = min(cap, queue.rate_limiter.when(key))
    queue.add_after(key, delay)
    return delay


Reconcile = Callable[[str], "Result | None"]
KeyFunc = Callable[[dict[str, Any]], Iterable[str]]
EchoFunc = Callable[[dict[str, Any] | None, dict[str, Any] | None], bool]  # (old, new): our own write's echo?


def _own_key(obj: dict[str, Any]) -> Iterable[str]:
    return (object_key(obj),)


class Wakeups:
    """Keys a controller's own collaborators ask a pass for: a status write's held-back event that was not
    ours, a shard a Database worker suspects. Made first and passed to the collaborators' constructors and
    to the Controller's, which takes the keys from then on; so neither needs the other to exist first.
    A key sent while no controller takes it, or while it is stopped, is dropped: a start resyncs every key.
    """

    def __init__(self) -> None:
        self._controller: Controller | None = None

    def enqueue(self, key: str) -> None:
        controller = self._controller
        if controller is not None:
            controller.enqueue(key)

    def _deliver_to(self, controller: Controller) -> None:
        if self._controller is not None:
            raise ValueError(f"these wakeups go to controller {self._controller.name} already")
        self._controller = controller


class Controller:
    """Runs `reconcile(key)` on `workers` threads while started.

    Keys come from `enqueue(key)`, from the `wakeups` given, and from informers registered with
    `watch(informer, keys)`.
    Enqueues while the controller is not running are dropped: every `start()` enqueues every
    key of the watched informers (a fresh, level-based pass), which covers anything missed.
    A stopped controller can be started again (the manager does so when it leads again).
    """

    def __init__(
        self,
        name: str,
        reconcile: Reconcile,
        workers: int = 1,
        queue: WorkQueue | None = None,
        metrics: RuntimeMetrics | None = None,
        lanes: Lanes | None = None,
        settled: Callable[[str], bool] | None = None,
        wakeups: Wakeups | None = None,
    ) -> None:
        """`workers` threads in all; with `lanes`, at most `lanes.limit` of them on one lane's keys.
        A `queue` given brings its own lanes.

        `settled(key)`: a cheap look at the caches, True when a reconcile of key would find nothing to do.
        A resync then counts the key as reconciled without queueing it: handing each of 100,000 settled
        keys to a worker thread costs more than looking at it."""
        if workers < 1:
            raise ValueError("workers must be at least 1")
        if queue is not None and lanes is not None:
            raise ValueError("pass lanes to the WorkQueue you give, not to the Controller")
        self.name = name
        self.reconcile = reconcile
        self.workers = workers
        self.metrics = metrics
        self.guard: Callable[[], bool] | None = None  # set by the manager: "do we still lead?"
        self.settled = settled
        self._backoff = queue.rate_limiter if queue is not None else ExponentialBackoff()
        self._queue = queue if queue is not None else WorkQueue(self._backoff, lanes)
        self._watches: list[tuple[Informer, KeyFunc]] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._running = False
        self._stopping = threading.Event()
        if wakeups is not None:
            wakeups._deliver_to(self)

    def __repr__(self) -> str:
        return f"<Controller {self.name} workers={self.workers}>"

    # -- inputs ----------------------------------------------------------------------------------

    @property
    def queue(self) -> WorkQueue:
        return self._queue

    def enqueue(self, key: str) -> None:
        if self._running:
            self._queue.add(key)

    def enqueue_after(self, key: str, seconds: float) -> None:
        if self._running:
            self._queue.add_after(key, seconds)

    def watch(self, informer: Informer, keys: KeyFunc | None = None, *, echo: EchoFunc | None = None) -> None:
        """Enqueue keys(obj) for the old and the new object of every event of informer.

        Without `keys` the object's own key ("namespace/name") is enqueued: use that for the
        controller's primary kind. For a secondary kind map to the affected primary keys, e.g.
        a Shard to the keys of the Databases on it via an index. An event that `echo(old, new)` calls
        the echo of the controller's own write (see `StatusEchoes`) enqueues nothing; a resync still
        covers the object.
        """
        mapper = keys or _own_key

        def handler(event_type: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
            if not self._running:
                return
            if echo is not None and echo(old, new):
                return
            # Each key once: the old and the new object of an update mostly map to the same keys, and a
            # worker that took the key after the first add would be made to run it again by the second.
            keys = dict.fromkeys(key for obj in (old, new) if obj is not None for key in mapper(obj))
            for key in keys:
                self._queue.add(key)

        self._watches.append((informer, mapper))
        informer.add_handler(handler, replay=False)

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running

    def active(self) -> bool:
        """May a reconcile of this controller write right now?"""
        if not self._running or self._stopping.is_set():
            return False
        return self.guard is None or self.guard()

    def start(self) -> None:
        with self._lock:
            if self._running:
                return
            for thread in self._threads:  # a previous term's in-flight reconciles must be done
                thread.join()
            self._threads = []
            if self._queue.shutting_down:
                self._queue = WorkQueue(self._backoff, self._queue.lanes)
            if self.metrics is None:
                self.metrics = RuntimeMetrics()
            self.metrics.init_controller(self.name)
            self._stopping.clear()
            self._running = True
            for i in range(self.workers):
                thread = threading.Thread(target=self._work, name=f"{self.name}-worker-{i}", daemon=True)
                self._threads.append(thread)
                thread.start()
        self.resync()
        log.info("controller %s started with %d workers", self.name, self.workers)

    def resync(self) -> int:
        """Enqueue the key of every object of the watched informers (level-based: a full pass); a key
        `settled` says needs nothing is counted as reconciled instead (in this thread, at once).

        Returns how many keys were looked at (0 while the controller is not running).
        """
        if not self._running:
            return 0
        started = time.monotonic()
        keys: dict[str, None] = {}
        for informer, mapper in self._watches:
            if mapper is _own_key:  # the store's keys are the objects' own: no key to build for 100,000 objects
                keys.update(dict.fromkeys(informer.keys()))
            else:
                keys.update(dict.fromkeys(key for obj in informer.list() for key in mapper(obj)))
        settled = 0
        for key in keys:
            if self._stopping.is_set():
                break  # stopping (a lost Lease): the next start resyncs
            if self._is_settled(key):
                settled += 1
            else:
                self._queue.add(key)
        if settled and self.metrics is not None:
            self.metrics.reconciles.labels(controller=self.name).inc(settled)
        if self.settled is not None:
            log.info(
                "controller %s: resync of %d keys: %d settled, %d queued, in %.1fs",
                self.name,
                len(keys),
                settled,
                len(keys) - settled,
                time.monotonic() - started,
            )
        return len(keys)

    def _is_settled(self, key: str) -> bool:
        if self.settled is None:
            return False
        try:
            return self.settled(key)
        except Exception:  # a bug in the shortcut must not cost the pass: the worker decides
            log.exception("controller %s: the settled check of %s failed", self.name, key)
            return False

    def signal_stop(self) -> None:
        """Stop handing out keys and make `ensure_active()` raise; returns at once."""
        self._stopping.set()
        self._running = False
        self._queue.shutdown()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop and wait for in-flight reconciles; True if all workers finished within timeout."""
        self.signal_stop()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)
        finished = not any(thread.is_alive() for thread in threads)
        log.info("controller %s stopped%s", self.name, "" if finished else " (reconciles still running)")
        return finished

    # -- workers ---------------------------------------------------------------------------------

    def _work(self) -> None:
        queue = self._queue
        _worker.controller = self
        try:
            while True:
                key = queue.get()
                if key is None:
                    return
                try:
                    with holding_slot(queue.slot(key), queue, key):
                        if self._wait_for_guard():
                            self._process(queue, key)
                finally:
                    queue.done(key)
        finally:
            _worker.controller = None

    def _wait_for_guard(self) -> bool:
        """Hold the key while the guard says no (a late renewal); False once the controller stops."""
        while not self.active():
            if not self._running or self._stopping.is_set():
                return False
            self._stopping.wait(GUARD_POLL)
        return True

    def _process(self, queue: WorkQueue, key: str) -> None:
        assert self.metrics is not None
        self.metrics.reconciles.labels(controller=self.name).inc()
        try:
            result = self.reconcile(key)
            if result is not None and not isinstance(result, Result):
                raise TypeError(f"reconcile returned {type(result).__name__}, expected Result or None")
        except Exception as exc:  # every failure is requeued or counted
            if _in_chain(exc, lambda e: isinstance(e, ControllerStopping)):
                if self._running and not self._stopping.is_set():
                    # Only the guard said no (leadership blipped): the key must not be lost.
                    queue.add(key)
                    log.info("controller %s: reconcile of %s paused: not leading; queued again", self.name, key)
                else:
                    log.info("controller %s: reconcile of %s interrupted: stopping", self.name, key)
                return
            if is_conflict(exc):
                self.metrics.reconcile_conflicts.labels(controller=self.name).inc()
                delay = queue.add_rate_limited(key)
                log.info("controller %s: write conflict on %s, retry in %.0fs", self.name, key, delay)
                return
            reason = exc.reason if isinstance(exc, ReconcileError) else OTHER_REASON
            terminal = isinstance(exc, TerminalError)
            self.metrics.reconcile_errors.labels(
                controller=self.name, reason=reason, retryable=retryable_label(not terminal)
            ).inc()
            if isinstance(exc, TerminalError):
                queue.forget(key)
                log.error("controller %s: %s failed for good (%s): %s", self.name, key, reason, describe_error(exc))
                if exc.requeue_after is not None:
                    queue.add_after(key, exc.requeue_after)
                return
            delay = _retry_later(queue, key, exc)
            log.warning(
                "controller %s: reconcile of %s failed (%s), retry in %.0fs: %s",
                self.name,
                key,
                reason,
                delay,
                describe_error(exc),
                # A traceback only for bugs: API errors carry response bodies, ours are sanitized.
                exc_info=not isinstance(exc, ReconcileError | ApiException),
            )
            return
        queue.forget(key)
        if result is not None and result.requeue_after is not None:
            queue.add_after(key, result.requeue_after)
