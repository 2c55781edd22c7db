"""The controller manager: shared informers on every replica, controllers on the leader only.

manager = ControllerManager(api_client, lease_namespace="databases")
databases = manager.informers.informer(DATABASES, "databases")   # the API reads these too
controller = Controller("database", reconcile, workers=4)
controller.watch(databases)
manager.add_controller(controller)
manager.start()      # informers, wait for sync, then campaign for the lease
...                  # SIGTERM handler of the caller:
manager.stop()       # controllers stop (in-flight reconciles finish), lease released, informers stop
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kubernetes.client import ApiClient

from domain.settings import SETTINGS
from informers import Rest, SharedInformers
from informers.heap import caches_filling, caches_released
from informers.leader import LeaderElector
from reconciler.runtime.controller import Controller, ControllerStopping, ensure_active
from reconciler.runtime.metrics import RuntimeMetrics

log = logging.getLogger(__name__)
OPTIONAL_SYNC_WAIT = 5.0  # seconds an optional informer may delay the start


class ControllerManager:
    def __init__(
        self,
        api_client: ApiClient | Rest,
        *,
        lease_namespace: str,
        lease_name: str = "dbprovider-manager",
        identity: str | None = None,
        leader_election: bool = True,
        lease_duration: float = SETTINGS.lease.duration,
        renew_deadline: float = SETTINGS.lease.renew_deadline,
        retry_period: float = SETTINGS.lease.retry_period,
        informers: SharedInformers | None = None,
        metrics: RuntimeMetrics | None = None,
        sync_timeout: float = SETTINGS.retry.sync_timeout,
        max_backoff: float | None = None,
    ) -> None:
        self.rest = api_client if isinstance(api_client, Rest) else Rest(api_client)
        self.informers = informers if informers is not None else SharedInformers(self.rest)
        self.metrics = metrics if metrics is not None else RuntimeMetrics()
        self.sync_timeout = sync_timeout
        # Caps every controller's retry backoff (default: SETTINGS.retry.reconcile's 5 minutes); tests shorten it
        # along with the alert rules' windows.
        self.max_backoff = max_backoff
        self.controllers: list[Controller] = []
        self._on_stopping: list[Callable[[], None]] = []
        self._after_stop: list[Callable[[], None]] = []
        self._lock = threading.Lock()  # serializes starting and stopping controllers
        self._started = False
        self._controllers_running = threading.Event()  # set once every controller started and resynced
        self.elector: LeaderElector | None = None
        if leader_election:
            self.elector = LeaderElector(
                self.rest,
                lease_namespace,
                lease_name,
                identity=identity,
                lease_duration=lease_duration,
                renew_deadline=renew_deadline,
                retry_period=retry_period,
                on_started_leading=self._start_controllers,
                on_stopped_leading=self._lost_lease,
                on_resumed_leading=self.resync,
            )

    def add_controller(self, controller: Controller) -> Controller:
        """Register a controller (before `start()`); it runs only while this replica leads."""
        if self._started:
            raise RuntimeError("add controllers before starting the manager")
        if controller.metrics is None:
            controller.metrics = self.metrics
        if self.max_backoff is not None:
            limiter = controller.queue.rate_limiter
            limiter.scheme = limiter.scheme.capped(self.max_backoff)
        if self.elector is not None:
            controller.guard = self.elector.is_leading
        self.controllers.append(controller)
        return controller

    def when_controllers_stopping(self, hook: Callable[[], None]) -> None:
        """Call `hook` as soon as the controllers are told to stop, before waiting for their in-flight
        reconciles (e.g. cut the shards' admin sessions, so a worker blocked on a hung shard returns
        now and a replica that lost its Lease holds no session past its renew deadline)."""
        self._on_stopping.append(hook)

    def after_controllers_stop(self, hook: Callable[[], None]) -> None:
        """Call `hook` each time the controllers have stopped: on a lost Lease as on shutdown
        (e.g. close the shards' admin sessions, so no connection outlives a leader term)."""
        self._after_stop.append(hook)

    def is_leading(self) -> bool:
        return self.elector.is_leading() if self.elector is not None else self._started

    def controllers_running(self) -> bool:
        """Leading, and every controller started with its first full pass queued: what a leader's start
        does is done (`is_leading` turns true before it)."""
        return self._controllers_running.is_set() and self.is_leading()

    def apiserver_reachable(self) -> bool:
        """Did the apiserver answer this replica's lease requests (every retry_period) lately?

        The API's readiness and its writes follow it: while the apiserver is down or paused this
        replica leaves the Service's endpoints and writes answer 503 at once instead of hanging.
        Without leader election there is no such signal: always True.
        """
        if self.elector is None:
            return True
        timings = self.elector.timings
        window = max(timings.contact_periods * timings.retry_period, timings.min_contact_window)
        return time.monotonic() - self.elector.last_contact < window

    def write_timeout(self) -> tuple[float, float]:
        """(connect, read) seconds for a controller's apiserver write: together at most the Lease's renew
        deadline, so a write the fence let through cannot still be on its way a whole renew deadline
        later (the defaults, 10 s and 60 s, allowed 70 s). Without leader election: the defaults."""
        connect, read = SETTINGS.watch.request_timeout
        if self.elector is None:
            return connect, read
        deadline = self.elector.timings.renew_deadline
        return min(connect, deadline / 3), min(read, deadline * 2 / 3)

    def fence(self) -> None:
        """Raise `ControllerStopping` unless this replica may write (SQL or apiserver) right now.

        The check every write makes first, from any thread: the Lease is held and its renew
        deadline has not passed (time-based, so a paused or partitioned replica fails it before
        the elector notices), and in a controller worker, that controller is not stopping.
        """
        ensure_active()
        if not self.is_leading():
            raise ControllerStopping("this replica does not hold the Lease")

    def resync(self) -> None:
        """Enqueue every object of every running controller (after a late renewal resumed leading), in a thread
        of its own: the elector calls this between renewals, and a pass over 100,000 Databases must not delay
        the next one."""
        threading.Thread(target=self._resync, name="resync", daemon=True).start()

    def _resync(self) -> None:
        with self._lock:
            counts = {controller.name: controller.resync() for controller in self.controllers}
        log.info("resync after leading resumed", extra={"keys": counts})

    def start(self) -> None:
        """Start the informers, wait until they have synced (TimeoutError if a list makes no progress for
        `sync_timeout`), then lead.

        Non-blocking afterwards: the elector runs in its own thread.
        """
        self._started = True
        started = time.monotonic()
        with caches_filling():  # no full collection over the growing caches; frozen once they are full
            self.informers.start()
            if not self.informers.wait_until_synced(self.sync_timeout):
                problems = "; ".join(f"{i!r}: {i.sync_problem()}" for i in self.informers.unsynced())
                raise TimeoutError(f"informers not synced, no list progress for {self.sync_timeout:.0f}s: {problems}")
        lists = {repr(i): i.last_list.describe() for i in self.informers.required() if i.last_list is not None}
        # Where a large fleet's start goes: the apiserver, decoding, storing.
        log.info("informers synced", extra={"seconds": round(time.monotonic() - started, 2), "lists": str(lists)})
        # An optional engine's kind: give it a moment (its CRD is usually there), but never wait for
        # it long; while it is not synced its shards say so and everything else runs.
        deadline = time.monotonic() + min(self.sync_timeout, OPTIONAL_SYNC_WAIT)
        for informer in self.informers.optional():
            if not informer.wait_for_sync(max(0.0, deadline - time.monotonic())):
                log.warning("optional informer %r not synced: %s", informer, informer.sync_problem())
        if self.elector is not None:
            self.elector.start()
        else:
            self._start_controllers()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the controllers (in-flight reconciles finish), release the lease, stop the informers."""
        if self.elector is not None:
            self.elector.stop(release=True, timeout=timeout)
        self._stop_controllers(timeout)
        self.informers.stop()
        caches_released()

    def _start_controllers(self) -> None:
        with self._lock:
            if self.elector is not None and not self.elector.is_leading():
                return  # lost again before we got here
            for controller in self.controllers:
                controller.start()
            self._controllers_running.set()

    def _lost_lease(self) -> None:
        """The elector stopped leading: stop at once, and wait for in-flight reconciles only so long
        (one blocked on a cut-off apiserver must not keep this replica from campaigning again)."""
        self._stop_controllers(timeout=self.elector.timings.renew_deadline if self.elector is not None else None)

    def _stop_controllers(self, timeout: float | None = None) -> None:
        # Signal everyone first (no further keys, ensure_active() raises), then wait.
        self._controllers_running.clear()
        for controller in self.controllers:
            controller.signal_stop()
        self._run_hooks(self._on_stopping)
        with self._lock:
            for controller in self.controllers:
                if not controller.stop(timeout):
                    log.warning("controller %s: reconciles still running after stop", controller.name)
            self._run_hooks(self._after_stop)

    @staticmethod
    def _run_hooks(hooks: list[Callable[[], None]]) -> None:
        for hook in hooks:
            try:
                hook()
            except Exception:  # a failing hook must not keep the others from running
                log.exception("stop hook %r failed", hook)
