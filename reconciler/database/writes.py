"""The controller's own writes to Database objects, and reading past a cache that lags them.

The events of a pass's own writes wake the key again, and the cache may not show the last write
yet (its watch event is in flight): a pass on it would redo recorded work (the SQL of a database
that is Ready already) and fail on a conflict. So, like controller-runtime's expectations, remember
the resourceVersion each pass wrote and skip a pass while the cache lags it: the write's own watch
event wakes the key again, normally within milliseconds. Only when the cache has not shown the write
after CACHE_LAG_WAIT (someone wrote after us, so the cache holds a version we never wrote) is the
object read live. Reading it live at once cost a GET for most databases of a burst on an apiserver
that the burst keeps busy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from domain.metadata import ObjectMeta
from domain.objects import database_placement
from domain.resources import DATABASES
from informers import Rest
from informers.informer import resource_version_of
from reconciler.database.state import Database
from reconciler.runtime import StatusEchoes, ensure_active, update_status

log = logging.getLogger(__name__)

# How long a pass waits for the cache to show our own last write before it reads the object live.
CACHE_LAG_WAIT = 2.0


def _later(version: str | None, than: str) -> bool:
    """True if resourceVersion `version` is known to come after `than`. Kubernetes calls resourceVersions
    opaque, but an etcd-backed apiserver's are the etcd revisions, integers that grow with every write; for
    anything else this says False, and the caller waits, then reads live."""
    return version is not None and version.isdigit() and than.isdigit() and int(version) > int(than)


class CacheLags(Exception):
    """Ends a pass whose cache does not show this replica's last write yet (no failure, nothing written):
    the write's watch event wakes the key; the controller looks again after `requeue_after` at the latest."""

    def __init__(self, requeue_after: float) -> None:
        super().__init__("the cache does not show this replica's last write yet")
        self.requeue_after = requeue_after


def conditional(patch: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """`patch` applied only to `obj` as read (409 otherwise): a write decided on a stale read, or
    sent late by a replica that was paused mid-request and has lost its Lease since, changes nothing."""
    metadata = {**patch.get("metadata", {}), "resourceVersion": _resource_version(ObjectMeta.of(obj))}
    return {**patch, "metadata": metadata}


def _resource_version(meta: ObjectMeta) -> str:
    """The resourceVersion of an object the apiserver sent (it always has one: a KeyError before, a bug)."""
    if meta.resource_version is None:
        raise ValueError(f"{meta.key} has no metadata.resourceVersion")
    return meta.resource_version


@dataclass
class DatabaseWrites:
    """Status and metadata writes, remembering each resourceVersion written (see `caught_up`)."""

    rest: Rest
    enqueue: Callable[[str], None] | None = None  # the Database controller's queue (its Wakeups)
    # key -> (resourceVersion, monotonic time) of our last write
    _written: dict[str, tuple[str, float]] = field(default_factory=dict)
    _placed: dict[str, str] = field(default_factory=dict)  # key -> status.shard of that write, if any
    echoes: StatusEchoes = field(init=False)  # the writes whose events wake no pass

    def __post_init__(self) -> None:
        # An echo seen: the cache shows that write, nothing to wait for.
        self.echoes = StatusEchoes(self.enqueue, on_echo=self.forget)

    def status(self, database: Database, *, last: bool = False) -> None:
        """Write the pass's status if it differs from the stored one (else nothing at all), then send
        the Events that waited for it; a failed write raises and they are never sent (see state.py).

        `last`: the pass ends with this write and needs no pass for its watch event (`echoes`; the Ready
        write of a new database: that pass found it settled, one of the 3 passes of each new database)."""
        waiting: list[Callable[[], None]] = []

        def write() -> dict[str, Any] | None:
            updated = update_status(self.rest, DATABASES, database.db, database.status_body())
            waiting.extend(database.take_after_write())
            if updated is not None:
                database.load(updated)
                self._wrote(database)
            return updated

        if last:
            self.echoes.send(database.key, database.resource_version, write)
        else:
            write()
        for send in waiting:
            send()

    def metadata(self, database: Database, patch: dict[str, Any]) -> bool:
        """Patch metadata (finalizers); False when the object is gone already (404): nothing to do.

        A stale cache (another replica finished the delete, or the watch event of the removal is
        in flight) must not turn a finished delete into a reconcile error.
        """
        ensure_active()
        body = {"metadata": {**patch, "resourceVersion": database.resource_version}}
        try:
            patched = self.rest.patch(DATABASES, database.name, body, database.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.forget(database.key)
            log.info("database already gone", extra={"database": database.name})
            return False
        database.written(patched)
        self._wrote(database)
        return True

    def forget(self, key: str) -> None:
        self._written.pop(key, None)
        self._placed.pop(key, None)

    def gone(self, key: str) -> None:
        """The Database is gone: nothing of it to remember."""
        self.forget(key)
        self.echoes.forget(key)

    def awaiting(self, key: str) -> bool:
        """A write of ours to `key` may not show in the cache yet (`caught_up` decides what to read)."""
        return key in self._written

    def placed_on(self, key: str) -> str | None:
        """The shard our last write of `key` placed it on, while the cache may not show that write."""
        return self._placed.get(key)

    def _wrote(self, database: Database) -> None:
        """Remember the object just written (`database.db`): its resourceVersion, when, and the shard its
        stored status names (not the status the pass may still be building)."""
        self._written[database.key] = (database.resource_version, time.monotonic())
        shard, _ = database_placement(database.db)
        if shard:
            self._placed[database.key] = shard
        else:
            self._placed.pop(database.key, None)

    def caught_up(self, key: str, cached: dict[str, Any]) -> dict[str, Any] | None:
        """The object to reconcile: the cached one once it shows our last write; None if it is gone.

        Raises CacheLags while the cache lags our write (the write's watch event wakes the key); after
        CACHE_LAG_WAIT the live object (someone else wrote since, or the watch is slow).
        """
        written = self._written.get(key)
        if written is None:
            return cached
        version, when = written
        cached_version = resource_version_of(cached)
        if cached_version == version or _later(cached_version, version):
            self.forget(key)  # the cache shows our write, or a later one (another writer's, made after ours)
            return cached
        waited = time.monotonic() - when
        if waited < CACHE_LAG_WAIT:
            raise CacheLags(CACHE_LAG_WAIT - waited)
        namespace, _, name = key.partition("/")
        try:
            live = self.rest.get(DATABASES, name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.forget(key)
            return None
        if resource_version_of(live) != version:
            self.forget(key)  # written again since (by someone else): the live object rules
        return live
