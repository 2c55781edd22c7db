"""The API resources of the provider and the cache indexes the API and the controllers share: written once.

`Resource` names one REST resource (group, version, plural) and builds its paths; the informers and the
REST client take it (informers re-exports it). Our kinds and the Keldon DatabaseCluster are declared here
from domain.constants, so the API, the controllers and the tests call exactly the paths the CRDs serve.

The indexes on the Database informer are named and computed here, so the API and the reconciler register
the same function under the same name on the shared informer (a second registration is a no-op: one index
in memory, not one per side). Index functions run on every event of every Database: they read the one
field they need, without parsing the whole object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from domain.constants import (
    CLAIM_NAMES,
    GROUP,
    KELDON_GROUP,
    KELDON_PLURAL_DATABASE_CLUSTERS,
    KELDON_VERSION,
    PLURAL_CONSUMERS,
    PLURAL_DATABASE_MOVES,
    PLURAL_DATABASES,
    PLURAL_SHARDS,
    VERSION,
)
from domain.objects import database_placement
from domain.specs import database_consumer_name

__all__ = [
    "BY_CONSUMER",
    "BY_SHARD",
    "CLAIMS",
    "CONSUMERS",
    "DATABASES",
    "DATABASE_MOVES",
    "DATABASE_CLUSTERS",
    "SHARDS",
    "Resource",
    "database_consumer",
    "database_shard",
]


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


SHARDS = Resource(GROUP, VERSION, PLURAL_SHARDS)
CONSUMERS = Resource(GROUP, VERSION, PLURAL_CONSUMERS)
DATABASES = Resource(GROUP, VERSION, PLURAL_DATABASES)
DATABASE_MOVES = Resource(GROUP, VERSION, PLURAL_DATABASE_MOVES)
DATABASE_CLUSTERS = Resource(KELDON_GROUP, KELDON_VERSION, KELDON_PLURAL_DATABASE_CLUSTERS)
CLAIMS = Resource(GROUP, VERSION, CLAIM_NAMES.plural)  # in consumer clusters (the agent's)

# Index names on the Database informer.
BY_SHARD = "databases-by-shard"
BY_CONSUMER = "databases-by-consumer"


def database_shard(db: Mapping[str, Any]) -> list[str]:
    """Index function: the shard a Database is placed on (`status.shard`), if any."""
    shard, _ = database_placement(db)
    return [shard] if shard else []


def database_consumer(db: Mapping[str, Any]) -> list[str]:
    """Index function: the owning consumer (`spec.consumer`: a label is not an identity)."""
    consumer = database_consumer_name(db)
    return [consumer] if consumer else []
