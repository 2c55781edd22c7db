"""A cache of exactly the named objects of one namespace: one field-selected informer per name.

For Secrets the provider must read but does not own and cannot select by label (the consumers'
token-hash Secrets, named by their Consumers): caching them by name keeps every other Secret of
the namespace (admin credentials, TLS keys) out of the process' memory. Each name costs one watch
(`fieldSelector=metadata.name=<name>`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from informers.informer import Handler, Informer, Obj
from informers.resource import Resource
from informers.shared import SharedInformers


class NamedInformers:
    """Keeps one informer per wanted name (`want`); `get` reads the cached object of a name.

    Handlers (`add_handler`, before the first `want`) are registered on every informer, with
    replay. `want` must not be called while holding a lock a handler takes: the replay calls the
    handlers in the caller's thread.
    """

    def __init__(self, shared: SharedInformers, resource: Resource, namespace: str) -> None:
        self.shared = shared
        self.resource = resource
        self.namespace = namespace
        self._handlers: list[Handler] = []
        self._lock = threading.Lock()  # serializes want(); get() reads the dict without it
        self._informers: dict[str, Informer] = {}

    def add_handler(self, handler: Handler) -> None:
        with self._lock:
            self._handlers.append(handler)

    def want(self, names: Iterable[str]) -> None:
        """Cache exactly `names`: start informers for new names, stop those of names no longer wanted."""
        wanted = set(names)
        with self._lock:
            if self.shared.stopped:
                return  # shutting down: no new watches
            for name in sorted(wanted - set(self._informers)):
                informer = self.shared.informer(
                    self.resource, self.namespace, field_selector=f"metadata.name={name}"
                )
                for handler in self._handlers:
                    informer.add_handler(handler)
                self._informers = {**self._informers, name: informer}
            for name in set(self._informers) - wanted:
                informer = self._informers[name]
                self._informers = {k: v for k, v in self._informers.items() if k != name}
                for handler in self._handlers:
                    informer.remove_handler(handler)
                self.shared.discard(informer)

    def get(self, name: str) -> Obj | None:
        informer = self._informers.get(name)
        return informer.get(f"{self.namespace}/{name}") if informer is not None else None

    def names(self) -> list[str]:
        return sorted(self._informers)

    def has_synced(self) -> bool:
        return all(informer.has_synced() for informer in self._informers.values())
