"""The Consumer controller: keeps status.databaseCount (shown by `kubectl get consumer`) current.

The count is the consumer's Databases that count against its quota (domain.quota: not yet Deleted),
the rule the API's quota applies to spec.maxDatabases. The Consumer's metadata and status are parsed
once (domain.objects.ConsumerState) and the status is written back from them: an unchanged count writes
nothing, and status keys a newer release wrote are kept. The watch event of our own write wakes no pass
(`echoes`): the next count waits for the next Database change, as counts.py paces it.
"""

from __future__ import annotations

from domain.objects import ConsumerState
from domain.quota import counts_against_quota
from domain.resources import BY_CONSUMER, CONSUMERS
from informers import Informer, Rest
from reconciler.runtime import Result, StatusEchoes, Wakeups


class ConsumerController:
    def __init__(self, rest: Rest, consumers: Informer, databases: Informer, wakeups: Wakeups | None = None) -> None:
        self.rest = rest
        self.consumers = consumers
        self.databases = databases
        self.echoes = StatusEchoes(wakeups.enqueue if wakeups is not None else None)

    def reconcile(self, name: str) -> Result | None:
        cached = self.consumers.get(name)
        if cached is None:
            self.echoes.forget(name)
            return None
        consumer, _ = ConsumerState.parse_lenient_status(cached)
        count = sum(1 for db in self.databases.by_index(BY_CONSUMER, name) if counts_against_quota(db))
        observed = {"database_count": count, "observed_generation": consumer.metadata.generation}
        consumer = consumer.with_status(**{field: value for field, value in observed.items() if value is not None})
        self.echoes.write(self.rest, CONSUMERS, consumer)
        return None
