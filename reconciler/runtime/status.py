"""Writing status through the status subresource, and Kubernetes-style conditions.

Choice: status is written with a JSON merge patch (RFC 7386) on `.../status` that carries the
resourceVersion of the object the reconcile read (`metadata.resourceVersion` in the patch is a
precondition: a stale read gives 409 Conflict, which the controller requeues as a conflict).
Why a patch and not a PUT: the body holds only what changed (a few hundred bytes instead of the
whole object) and spec/metadata can never be written back by mistake. Why the precondition:
merge patches replace lists whole, so without it two writers would silently overwrite each
other's `conditions`. Pass `resource_version=None` only for fields no one else writes.

A reconcile that changes nothing must write nothing: parse the object once (domain.objects), change
its typed status, then `write_status(rest, resource, obj)` writes only the difference from the status as
read (or nothing). `update_status` is the same for a status built as a dict.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from domain.metadata import ObjectMeta
from domain.objects import StatusOf
from domain.timefmt import format_time
from informers import Resource, Rest, object_key
from informers.informer import resource_version_of
from reconciler.runtime.controller import ensure_active


def now_rfc3339() -> str:
    return format_time(datetime.now(UTC))


# -- merge patches ---------------------------------------------------------------------------------


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch turning `old` into `new` ({} when equal).

    Nested objects are diffed, lists and scalars are replaced whole, removed keys become null.
    """
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if key not in old:
            patch[key] = copy.deepcopy(value)
        elif isinstance(value, dict) and isinstance(old[key], dict):
            sub = merge_patch(old[key], value)
            if sub:
                patch[key] = sub
        elif value != old[key]:
            patch[key] = copy.deepcopy(value)
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


# -- writing ---------------------------------------------------------------------------------------


def patch_status(
    rest: Rest,
    resource: Resource,
    name: str,
    status_patch: dict[str, Any],
    *,
    namespace: str | None = None,
    resource_version: str | None,
) -> dict[str, Any]:
    """Merge-patch `.status` of one object through the status subresource; returns the object.

    `resource_version` (keyword, required: choose) makes the write conditional: 409 if the object
    changed since it was read. Calls `ensure_active()` first: no writes once the controller stops.
    """
    ensure_active()
    body: dict[str, Any] = {"status": status_patch}
    if resource_version is not None:
        body["metadata"] = {"resourceVersion": resource_version}
    return rest.patch(resource, name, body, namespace, subresource="status")


def update_status(
    rest: Rest,
    resource: Resource,
    obj: dict[str, Any],
    desired_status: dict[str, Any],
    *,
    conditional: bool = True,
) -> dict[str, Any] | None:
    """Write `desired_status` for `obj` (as read from the cache) if it differs; else write nothing.

    Sends only the difference, conditional on obj's resourceVersion unless `conditional=False`.
    Returns the updated object, or None when nothing had to be written.
    """
    patch = merge_patch(obj.get("status") or {}, desired_status)  # the dict form: the status as stored
    if not patch:
        return None
    meta = ObjectMeta.model_validate(obj["metadata"])
    version = meta.resource_version if conditional else None
    return patch_status(rest, resource, meta.name, patch, namespace=meta.namespace, resource_version=version)


def write_status(rest: Rest, resource: Resource, obj: StatusOf[Any]) -> dict[str, Any] | None:
    """Write the typed status of `obj` (parsed from the cache, then changed) if it differs from the status
    as read; else write nothing. Conditional on the resourceVersion read; unknown stored keys are kept
    (domain.objects.status_body). Returns the updated object, or None when nothing had to be written.
    """
    patch = merge_patch(dict(obj.stored_status), obj.status_body())
    if not patch:
        return None
    meta = obj.metadata
    return patch_status(
        rest, resource, meta.name, patch, namespace=meta.namespace, resource_version=meta.resource_version
    )


def replace_status(rest: Rest, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
    """PUT the whole object to `.../status` (its resourceVersion is the precondition).

    Prefer `update_status`; this exists for callers that already hold a full, fresh object.
    """
    ensure_active()
    return rest.replace(resource, obj, subresource="status")


# -- the echoes of our own writes ----------------------------------------------------------------


@dataclass
class _Write:
    """A status write in flight: the version it is conditional on, and the version of an event that came
    during it right after that one (its echo, unless the write fails)."""

    read: str
    arrived: str | None = None


class StatusEchoes:
    """Status writes whose own watch event, the echo, wakes no pass (`write`, then `Controller.watch(...,
    echo=echoes.echo)`).

    Why nothing is lost: a write is conditional on the version the pass read, so the version that follows
    that one is either ours (all of it the pass had in hand; and the pass asked for its next pass itself) or
    another writer's, and then our write fails with a conflict and the key is retried anyway. The echo is
    told by its versions: the event of exactly the version our write returned, or, while the write is still
    in flight (its event may come first), the event that follows the version it is conditional on; that one
    is checked against the version the write returns, and the key is queued (`enqueue`) if it was not ours
    (a relist that folded our write into a later one). Events of any other version and deletions wake a
    pass as always.

    A pass on the echo found the same as the pass that wrote, except where other inputs moved meanwhile (a
    Shard's database count in a burst), and then wrote again, ahead of the pace those inputs' own triggers
    keep (in a burst, two thirds more Shard status writes than the burst gap allows).
    """

    def __init__(
        self, enqueue: Callable[[str], None] | None = None, on_echo: Callable[[str], None] | None = None
    ) -> None:
        self.enqueue = enqueue  # the controller's queue (its `Wakeups`)
        self.on_echo = on_echo  # told of each echo once it is known to be one
        self._written: dict[str, str] = {}  # key -> the resourceVersion our last write returned
        self._writing: dict[str, _Write] = {}
        self._lock = threading.Lock()

    def write(self, rest: Rest, resource: Resource, obj: StatusOf[Any]) -> dict[str, Any] | None:
        """`write_status`, remembering the write for `echo`."""
        patch = merge_patch(dict(obj.stored_status), obj.status_body())
        if not patch:
            return None
        meta = obj.metadata
        return self.send(
            meta.key,
            meta.resource_version,
            lambda: patch_status(
                rest, resource, meta.name, patch, namespace=meta.namespace, resource_version=meta.resource_version
            ),
        )

    def send(self, key: str, read: str | None, write: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
        """Run `write`, a status write of `key` conditional on version `read` that returns the object written
        (None: nothing was), remembering it for `echo`."""
        if read is not None:
            with self._lock:
                self._writing[key] = _Write(read)
        written: dict[str, Any] | None = None
        try:
            written = write()
        finally:
            version = resource_version_of(written) if written is not None else None
            with self._lock:
                pending = self._writing.pop(key, None)
                arrived = pending.arrived if pending is not None else None
                if version is not None and arrived != version:
                    self._written[key] = version
            if arrived is not None and arrived == version:
                self._echoed(key)  # its echo came already
            elif arrived is not None and self.enqueue is not None:
                self.enqueue(key)  # the event held back was not ours (or the write failed): its pass after all
        return written

    def _echoed(self, key: str) -> None:
        if self.on_echo is not None:
            self.on_echo(key)

    def forget(self, key: str) -> None:
        """The object is gone: nothing to remember."""
        with self._lock:
            self._written.pop(key, None)

    def echo(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
        """True (once) for the watch event of our own write (see the class)."""
        if old is None or new is None or not (self._written or self._writing):
            return False
        version = resource_version_of(new)
        if version is None:
            return False
        key = object_key(new)
        with self._lock:
            if self._written.get(key) != version:
                pending = self._writing.get(key)
                if pending is None or pending.arrived is not None or resource_version_of(old) != pending.read:
                    return False
                pending.arrived = version  # decided when the write returns
                return True
            del self._written[key]
        self._echoed(key)
        return True
