"""Which resource an informer or a REST call is about, and how objects are keyed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote


@dataclass(frozen=True)
class Resource:
    """One API resource: `Resource("", "v1", "configmaps")`, `Resource("db.bnerd.com", "v1alpha1", "databases")`.

    The core group is the empty string. Paths are built without knowing the scope: pass a namespace
    for namespaced objects, none for cluster-scoped ones (or to list a namespaced kind everywhere).
    """

    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def _prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def collection_path(self, namespace: str | None = None) -> str:
        if namespace:
            return f"{self._prefix()}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{self._prefix()}/{self.plural}"

    def object_path(self, name: str, namespace: str | None = None, subresource: str | None = None) -> str:
        path = f"{self.collection_path(namespace)}/{quote(name, safe='')}"
        return f"{path}/{subresource}" if subresource else path

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}/{self.version}" if self.group else f"{self.plural}/{self.version}"


CONFIGMAPS = Resource("", "v1", "configmaps")
SECRETS = Resource("", "v1", "secrets")
EVENTS = Resource("", "v1", "events")
LEASES = Resource("coordination.k8s.io", "v1", "leases")


def object_key(obj: dict[str, Any]) -> str:
    """The store key of an object: "namespace/name", or "name" for cluster-scoped objects."""
    metadata = obj["metadata"]
    namespace = metadata.get("namespace")
    return f"{namespace}/{metadata['name']}" if namespace else metadata["name"]


def split_key(key: str) -> tuple[str | None, str]:
    """The inverse of `object_key`: (namespace or None, name)."""
    namespace, sep, name = key.rpartition("/")
    return (namespace if sep else None), name
