"""Which resource an informer or a REST call is about, and how objects are keyed.

`Resource` itself is a shared contract (domain.resources, with our own kinds); the core kinds the
runtime uses are named here.
"""

from __future__ import annotations

from typing import Any

from domain.resources import Resource

__all__ = ["CONFIGMAPS", "EVENTS", "LEASES", "SECRETS", "Resource", "object_key", "split_key"]


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
