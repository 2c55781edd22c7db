"""One informer per resource for the whole process: the API and the controllers share them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client import ApiClient

from domain.cached import cached_form
from informers.informer import Informer
from informers.named import NamedObjects
from informers.resource import Resource
from informers.rest import Rest

_Key = tuple[Resource, str | None, str | None, str | None, bool]


class SharedInformers:
    """Registry of informers keyed by (resource, namespace, selectors, metadata only), and of the
    by-name caches (`named`) built on them.

    `informer(...)` returns the existing informer for that key or creates it (and starts it if the
    registry is already started). Register indexes and handlers on the returned informer.

    An informer marked `optional` (an optional engine's kind, whose CRD may be missing or not served)
    runs like the others but is not waited for: `has_synced`, `wait_for_sync` and `unsynced` are about
    the required ones, so a missing CRD keeps no replica from starting and no API from serving.

    Each informer keeps of its kind what `forms` gives for its resource: by default what domain.cached says
    the provider reads (a credentials Secret: its metadata and a digest, never its data). A process that
    reads other fields of the same kinds (the agent: the Secrets it writes, whole) passes its own.
    """

    def __init__(
        self,
        api_client: ApiClient | Rest,
        *,
        forms: Callable[[Resource], Callable[[dict[str, Any]], dict[str, Any]]] = cached_form,
        **informer_options: Any,
    ) -> None:
        self.rest = api_client if isinstance(api_client, Rest) else Rest(api_client)
        self._forms = forms
        self._options = informer_options
        self._informers: dict[_Key, Informer] = {}
        self._named: dict[tuple[Resource, str, str | None], NamedObjects] = {}
        self._optional: set[int] = set()  # id() of the informers nobody waits for
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False

    def informer(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        metadata_only: bool = False,
    ) -> Informer:
        key = (resource, namespace, label_selector, field_selector, metadata_only)
        with self._lock:
            if self._stopped:
                raise RuntimeError("SharedInformers is stopped")
            informer = self._informers.get(key)
            if informer is None:
                informer = Informer(
                    self.rest,
                    resource,
                    namespace,
                    label_selector=label_selector,
                    field_selector=field_selector,
                    metadata_only=metadata_only,
                    **{"transform": self._forms(resource), **self._options},
                )
                self._informers[key] = informer
                if self._started:
                    informer.start()
            return informer

    def named(self, resource: Resource, namespace: str, label_selector: str | None = None) -> NamedObjects:
        """The one cache of named objects of `namespace` (see NamedObjects), started and stopped with the
        informers. `label_selector` narrows the metadata watch it is built on."""
        index = self.informer(resource, namespace, label_selector=label_selector, metadata_only=True)
        with self._lock:
            key = (resource, namespace, label_selector)
            named = self._named.get(key)
            if named is None:
                named = self._named[key] = NamedObjects(self.rest, index)
                if self._started and not self._stopped:
                    named.start()
            return named

    def all_named(self) -> list[NamedObjects]:
        with self._lock:
            return list(self._named.values())

    @property
    def stopped(self) -> bool:
        return self._stopped

    def discard(self, informer: Informer) -> None:
        """Stop an informer nobody needs any more and forget it (without waiting for its thread)."""
        with self._lock:
            for key, registered in list(self._informers.items()):
                if registered is informer:
                    del self._informers[key]
        informer.signal_stop()

    def all(self) -> list[Informer]:
        with self._lock:
            return list(self._informers.values())

    def mark_optional(self, informer: Informer) -> None:
        """Do not wait for `informer` to sync (see the class docstring)."""
        with self._lock:
            self._optional.add(id(informer))

    def required(self) -> list[Informer]:
        with self._lock:
            return [i for i in self._informers.values() if id(i) not in self._optional]

    def optional(self) -> list[Informer]:
        with self._lock:
            return [i for i in self._informers.values() if id(i) in self._optional]

    def _switch(self, *, start: bool = False, stop: bool = False) -> tuple[list[Informer], list[NamedObjects]]:
        """Set the started or stopped flag and take what is registered, in one hold of the lock: one registered
        before is in the list, one registered after sees the flag (and starts itself, or is refused), so none
        is missed or started twice."""
        with self._lock:
            self._started |= start
            self._stopped |= stop
            return list(self._informers.values()), list(self._named.values())

    def start(self) -> None:
        informers, named = self._switch(start=True)
        for informer in informers:
            informer.start()
        for cache in named:
            cache.start()

    def has_synced(self) -> bool:
        return all(informer.has_synced() for informer in self.required()) and all(
            cache.has_synced() for cache in self.all_named()
        )

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        """Wait until every required informer has listed once; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for informer in self.required():
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not informer.wait_for_sync(remaining):
                return False
        return True

    def wait_until_synced(self, stall_timeout: float) -> bool:
        """Wait until every required informer has listed once; False as soon as one that has not received no
        LIST page for `stall_timeout` seconds. A large list (100,000 objects) may take longer than that
        in all, but as long as its pages keep coming it is not stuck."""
        while True:
            waiting = self.unsynced()
            if not waiting:
                return True
            now = time.monotonic()
            if any(now - informer.progressed > stall_timeout for informer in waiting):
                return False
            waiting[0].wait_for_sync(min(0.2, stall_timeout))

    def unsynced(self) -> list[Informer]:
        return [informer for informer in self.required() if not informer.has_synced()]

    def stop(self, timeout: float | None = 10.0) -> None:
        informers, named = self._switch(stop=True)
        for cache in named:
            cache.signal_stop()
        for informer in informers:
            informer.signal_stop()  # signal all first, then wait for each
        for informer in informers:
            informer.stop(timeout)
        for cache in named:
            cache.stop(timeout)
