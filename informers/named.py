"""A cache of exactly the named objects of one namespace, on one metadata-only watch of the namespace.

For Secrets the provider must read but does not own and cannot select by label (the consumers'
token-hash Secrets, named by their Consumers): the namespace's Secrets are watched as metadata only
(names and resourceVersions: the apiserver never sends their data), and a wanted name is read with a
GET when it appears or its resourceVersion changes. So the number of watches is one, whatever the
number of names, and no other Secret's data (admin credentials, TLS keys) enters the process.

    named = shared.named(SECRETS, namespace, label_selector=...)    # started with the informers
    named.add_handler(handler)                                       # before the first want
    named.want({"team-a-token", "team-b-token"})
    named.get("team-a-token")                                        # the whole Secret, or None

A change is seen one GET after its watch event. A GET that fails is retried with the informers'
relist backoff (the last object read stays in the cache meanwhile); `has_synced` is true once the
metadata list is in and every wanted name present there has been read once.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable

from kubernetes.client.exceptions import ApiException

from domain.cached import without_bookkeeping
from domain.objects import Obj
from domain.settings import SETTINGS, Backoff
from informers.informer import (
    ADDED,
    DELETED,
    MODIFIED,
    Handler,
    Informer,
    resource_version_of,
)
from informers.rest import Rest

log = logging.getLogger(__name__)

FETCH_WORKERS = 4  # parallel GETs: 1,000 names are read in about a second at start
FETCH_TIMEOUT: tuple[float, float] = (5.0, 10.0)


class NamedObjects:
    """See the module docstring. `index` is the metadata-only informer of the namespace (shared)."""

    def __init__(
        self,
        rest: Rest,
        index: Informer,
        *,
        workers: int = FETCH_WORKERS,
        backoff: Backoff = SETTINGS.watch.relist,
        timeout: tuple[float, float] = FETCH_TIMEOUT,
    ) -> None:
        if not index.metadata_only or not index.namespace:
            raise ValueError("NamedObjects needs a metadata-only informer of one namespace")
        self.rest = rest
        self.index = index
        self.resource = index.resource
        self.namespace = index.namespace
        self._workers = workers
        self._backoff = backoff
        self._timeout = timeout
        self._handlers: list[Handler] = []
        self._cond = threading.Condition()
        self._wanted: frozenset[str] = frozenset()
        self._objects: dict[str, Obj] = {}  # wanted name -> the object as last read
        self._unsynced: set[str] = set()  # wanted names not read once yet
        self._queue: deque[str] = deque()  # names to read, in order (each at most once in _queued)
        self._queued: set[str] = set()
        self._busy: set[str] = set()  # names being read now
        self._again: set[str] = set()  # names that changed while being read
        self._retries: list[tuple[float, str]] = []  # (due, name): a heap of failed reads
        self._failures: dict[str, int] = {}
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        index.add_handler(self._on_metadata)

    def __repr__(self) -> str:
        return f"<NamedObjects {self.resource} in {self.namespace}>"

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> NamedObjects:
        with self._cond:
            if self._threads or self._stop.is_set():
                return self
            for n in range(self._workers):
                thread = threading.Thread(target=self._run, name=f"named-{self.resource.plural}-{n}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return self

    def signal_stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def stop(self, timeout: float | None = 10.0) -> None:
        self.signal_stop()
        for thread in self._threads:
            thread.join(timeout)

    def has_synced(self) -> bool:
        with self._cond:
            return self.index.has_synced() and not self._unsynced

    # -- reading ---------------------------------------------------------------------------------

    def add_handler(self, handler: Handler) -> None:
        """`handler(event_type, old, new)` after a wanted object was read anew or is gone (worker threads)."""
        with self._cond:
            self._handlers.append(handler)

    def want(self, names: Iterable[str]) -> None:
        """Cache exactly `names`: read the new ones, forget the others."""
        wanted = frozenset(names)
        with self._cond:
            added, removed = wanted - self._wanted, self._wanted - wanted
            self._wanted = wanted
            for name in removed:
                self._objects.pop(name, None)
                self._unsynced.discard(name)
                self._failures.pop(name, None)
            for name in added:
                self._unsynced.add(name)
                self._enqueue(name)

    def get(self, name: str) -> Obj | None:
        with self._cond:
            return self._objects.get(name)

    def names(self) -> list[str]:
        """The wanted names held now (read and present)."""
        with self._cond:
            return sorted(self._objects)

    # -- keeping current -------------------------------------------------------------------------

    def _on_metadata(self, event_type: str, old: Obj | None, new: Obj | None) -> None:
        name = (new if new is not None else old or {}).get("metadata", {}).get("name")
        with self._cond:
            if name in self._wanted:
                self._enqueue(name)
                self._cond.notify()  # also when it was queued before the index synced

    def _enqueue(self, name: str) -> None:
        """(caller holds the condition)"""
        if name in self._busy:
            self._again.add(name)
        elif name not in self._queued:
            self._queued.add(name)
            self._queue.append(name)
            self._cond.notify()

    def _next(self) -> str | None:
        """The next name to read, waiting for one (None: stopping). Due retries go first."""
        with self._cond:
            while not self._stop.is_set():
                now = time.monotonic()
                while self._retries and self._retries[0][0] <= now:
                    _, name = heapq.heappop(self._retries)
                    if name in self._wanted:
                        self._enqueue(name)
                if self._queue and self.index.has_synced():  # a name missing from an unsynced index is no news
                    name = self._queue.popleft()
                    self._queued.discard(name)
                    self._busy.add(name)
                    return name
                wait = self._retries[0][0] - now if self._retries else 0.5
                if self._queue:  # queued by the index's first list, which syncs after its events: wait for that
                    self._cond.release()
                    try:
                        self.index.wait_for_sync(min(max(wait, 0.01), 0.5))
                    finally:
                        self._cond.acquire()
                    continue
                self._cond.wait(min(max(wait, 0.01), 0.5))
        return None

    def _run(self) -> None:
        while (name := self._next()) is not None:
            try:
                self._read(name)
            except Exception:  # a broken handler must not end the worker
                log.exception("%r: reading %s failed", self, name)
            finally:
                with self._cond:
                    self._busy.discard(name)
                    if name in self._again:
                        self._again.discard(name)
                        self._enqueue(name)

    def _read(self, name: str) -> None:
        """Bring `name` up to the version the metadata index shows (a GET only if it differs)."""
        with self._cond:
            if name not in self._wanted:
                return
            held = self._objects.get(name)
        listed = self.index.get(f"{self.namespace}/{name}")
        if listed is None:
            fresh = None
        elif held is not None and resource_version_of(held) == resource_version_of(listed):
            fresh = held
        else:
            try:
                fresh = without_bookkeeping(self.rest.get(self.resource, name, self.namespace, timeout=self._timeout))
            except ApiException as exc:
                if exc.status != 404:
                    self._failed(name, f"HTTP {exc.status}")
                    return
                fresh = None  # deleted since the event: its DELETED event follows
            except Exception as exc:  # noqa: BLE001 - a transport error: retried like an HTTP one
                self._failed(name, type(exc).__name__)
                return
        with self._cond:
            if name not in self._wanted:
                return
            self._unsynced.discard(name)
            if self._failures.pop(name, 0):
                log.info("%r: read %s again", self, name)
            if fresh is held:
                return
            if fresh is None:
                self._objects.pop(name, None)
            else:
                self._objects[name] = fresh
            handlers = list(self._handlers)
        event = DELETED if fresh is None else (ADDED if held is None else MODIFIED)
        for handler in handlers:
            handler(event, held, fresh)

    def _failed(self, name: str, why: str) -> None:
        with self._cond:
            failures = self._failures[name] = self._failures.get(name, 0) + 1
            delay = self._backoff.delay(failures - 1)
            heapq.heappush(self._retries, (time.monotonic() + delay, name))
            self._cond.notify()
        level = logging.WARNING if failures == 1 else logging.DEBUG
        log.log(level, "%r: reading %s failed (%s); retrying in %.1fs", self, name, why, delay)
