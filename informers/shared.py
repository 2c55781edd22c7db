"""One informer per resource for the whole process: the API and the controllers share them."""

from __future__ import annotations

import threading
import time
from typing import Any

from kubernetes.client import ApiClient

from informers.informer import Informer
from informers.resource import Resource
from informers.rest import Rest


class SharedInformers:
    """Registry of informers keyed by (resource, namespace, selectors).

    `informer(...)` returns the existing informer for that key or creates it (and starts it if the
    registry is already started). Register indexes and handlers on the returned informer.

    An informer marked `optional` (an optional engine's kind, whose CRD may be missing or not served)
    runs like the others but is not waited for: `has_synced`, `wait_for_sync` and `unsynced` are about
    the required ones, so a missing CRD keeps no replica from starting and no API from serving.
    """

    def __init__(self, api_client: ApiClient | Rest, **informer_options: Any) -> None:
        self.rest = api_client if isinstance(api_client, Rest) else Rest(api_client)
        self._options = informer_options
        self._informers: dict[tuple[Resource, str | None, str | None, str | None], Informer] = {}
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
    ) -> Informer:
        key = (resource, namespace, label_selector, field_selector)
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
                    **self._options,
                )
                self._informers[key] = informer
                if self._started:
                    informer.start()
            return informer

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

    def start(self) -> None:
        with self._lock:
            self._started = True
            informers = list(self._informers.values())
        for informer in informers:
            informer.start()

    def has_synced(self) -> bool:
        return all(informer.has_synced() for informer in self.required())

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        """Wait until every required informer has listed once; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for informer in self.required():
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not informer.wait_for_sync(remaining):
                return False
        return True

    def unsynced(self) -> list[Informer]:
        return [informer for informer in self.required() if not informer.has_synced()]

    def stop(self, timeout: float | None = 10.0) -> None:
        with self._lock:
            self._stopped = True
            informers = list(self._informers.values())
        for informer in informers:
            informer.signal_stop()  # signal all first, then wait for each
        for informer in informers:
            informer.stop(timeout)
