"""The API resources the controllers read and write, and the cache indexes they share."""

from __future__ import annotations

from typing import Any

from domain.constants import (
    GROUP,
    KELDON_GROUP,
    KELDON_PLURAL_DATABASE_CLUSTERS,
    KELDON_VERSION,
    PLURAL_CONSUMERS,
    PLURAL_DATABASES,
    PLURAL_SHARDS,
    VERSION,
)
from domain.specs import database_consumer_name
from informers import Resource

SHARDS = Resource(GROUP, VERSION, PLURAL_SHARDS)
CONSUMERS = Resource(GROUP, VERSION, PLURAL_CONSUMERS)
DATABASES = Resource(GROUP, VERSION, PLURAL_DATABASES)
DATABASE_CLUSTERS = Resource(KELDON_GROUP, KELDON_VERSION, KELDON_PLURAL_DATABASE_CLUSTERS)

# Index names on the Database informer (shared with the API, which may register its own).
BY_SHARD = "reconciler-by-shard"
BY_CONSUMER = "reconciler-by-consumer"


def database_shard(db: dict[str, Any]) -> list[str]:
    shard = (db.get("status") or {}).get("shard")
    return [shard] if shard else []


def database_consumer(db: dict[str, Any]) -> list[str]:
    consumer = database_consumer_name(db)
    return [consumer] if consumer else []
