"""The Consumer controller: keeps status.databaseCount (shown by `kubectl get consumer`) current.

The count is the consumer's Databases that count against its quota (domain.quota: not yet Deleted),
the rule the API's quota applies to spec.maxDatabases.
"""

from __future__ import annotations

import copy

from domain.quota import counts_against_quota
from domain.status import ConsumerStatus
from domain.validation import dump_set_fields
from informers import Informer, Rest
from reconciler.resources import BY_CONSUMER, CONSUMERS
from reconciler.runtime import Result, update_status


class ConsumerController:
    def __init__(self, rest: Rest, consumers: Informer, databases: Informer) -> None:
        self.rest = rest
        self.consumers = consumers
        self.databases = databases

    def reconcile(self, name: str) -> Result | None:
        consumer = self.consumers.get(name)
        if consumer is None:
            return None
        count = sum(1 for db in self.databases.by_index(BY_CONSUMER, name) if counts_against_quota(db))
        observed = ConsumerStatus(database_count=count, observed_generation=consumer["metadata"].get("generation"))
        status = {**copy.deepcopy(consumer.get("status") or {}), **dump_set_fields(observed)}
        update_status(self.rest, CONSUMERS, consumer, status)
        return None
