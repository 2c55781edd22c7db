"""The fleet gauges of the seed's metrics table, computed from the informer caches at scrape time.

Computing at scrape time keeps reconciles free of metric bookkeeping and makes the numbers always
agree with the cache. No series carries consumer, externalId or role names: only shard, phase and the
Ready condition's reason (a bounded set of constants), which the alerts show to on-call.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from domain.conditions import READY, condition_reason, get_condition, is_condition_true, object_conditions
from domain.connection_budget import Commitments
from domain.constants import UNPLACED, DatabaseConditionType, Phase, ShardConditionType
from domain.timefmt import parse_time
from reconciler.runtime.metrics import shard_gauges

NO_REASON = "Unknown"  # no Ready condition yet
Objects = Callable[[], Iterable[Mapping[str, Any]]]


def _condition_true(obj: Mapping[str, Any], condition_type: str) -> bool:
    return is_condition_true(object_conditions(obj), condition_type)


def _ready_reason(obj: Mapping[str, Any]) -> str:
    """The Ready condition's reason (the same type name on a Shard and a Database)."""
    return condition_reason(object_conditions(obj), READY) or NO_REASON


def _scaling_since(shard: Mapping[str, Any]) -> float | None:
    """When the shard's cloudberry cluster began Scaling (its Scaling condition's transition), or None."""
    condition = get_condition(object_conditions(shard), ShardConditionType.SCALING)
    if condition is None or not _condition_true(shard, ShardConditionType.SCALING):
        return None
    since = parse_time(condition.get("lastTransitionTime"))
    return None if since is None else since.timestamp()


def _created_at(obj: Mapping[str, Any]) -> float | None:
    created = parse_time(obj.get("metadata", {}).get("creationTimestamp"))
    return None if created is None else created.timestamp()


class FleetCollector(Collector):
    """Reads shards and databases from the caches on every scrape."""

    def __init__(
        self,
        shards: Objects,
        databases: Objects,
        clock: Callable[[], float] = time.time,
        connection_limit: Callable[[Mapping[str, Any]], int | None] | None = None,
    ) -> None:
        """`connection_limit`: what a Database commits (domain.connection_budget.database_limit); without
        it no connection gauges are exported."""
        self._shards = shards
        self._databases = databases
        self._clock = clock
        self._connection_limit = connection_limit

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self._clock()
        shard_objects = list(self._shards())
        shard_names = [s["metadata"]["name"] for s in shard_objects]

        per_phase: Counter[tuple[str, str, str]] = Counter()
        in_use: Counter[str] = Counter()
        held: Counter[str] = Counter()
        drift: Counter[str] = Counter()
        oldest: dict[str, float] = defaultdict(float)
        commitments: dict[str, Commitments] = defaultdict(Commitments)
        for db in self._databases():
            status = db.get("status") or {}
            shard = status.get("shard") or UNPLACED
            phase = status.get("phase") or Phase.PROVISIONING
            per_phase[(shard, phase, _ready_reason(db))] += 1
            if shard != UNPLACED and phase != Phase.DELETED:
                in_use[shard] += 1
                if self._connection_limit is not None:
                    commitments[shard] = commitments[shard].plus(self._connection_limit(db))
            if _condition_true(db, DatabaseConditionType.DELETION_HELD):
                held[shard] += 1
            if phase == Phase.READY and _condition_true(db, DatabaseConditionType.CONNECTION_LIMIT_DRIFT):
                drift[shard] += 1
            if phase == Phase.PROVISIONING:
                created = _created_at(db)
                if created is not None:
                    oldest[shard] = max(oldest[shard], now - created)

        databases = GaugeMetricFamily(
            "dbprovider_databases",
            "Databases per shard, phase and Ready reason (shard=unplaced: not yet placed).",
            labels=["shard", "phase", "reason"],
        )
        for (shard, phase, reason), count in sorted(per_phase.items()):
            databases.add_metric([shard, phase, reason], count)
        yield databases

        ready = GaugeMetricFamily(
            "dbprovider_shard_ready",
            "1 if the Shard's Ready condition is True; reason is the condition's reason.",
            labels=["shard", "reason"],
        )
        scaling = GaugeMetricFamily(
            "dbprovider_shard_scaling_seconds",
            "Seconds the shard's cloudberry cluster has been Scaling (0 when it is not).",
            labels=["shard"],
        )
        slots = GaugeMetricFamily("dbprovider_shard_databases", "Database slots in use on the shard.", labels=["shard"])
        limit = GaugeMetricFamily("dbprovider_shard_max_databases", "spec.maxDatabases of the shard.", labels=["shard"])
        for shard in shard_objects:
            name = shard["metadata"]["name"]
            ready.add_metric(
                [name, _ready_reason(shard)], 1.0 if _condition_true(shard, ShardConditionType.READY) else 0.0
            )
            since = _scaling_since(shard)
            scaling.add_metric([name], 0.0 if since is None else max(0.0, now - since))
            slots.add_metric([name], in_use[name])
            limit.add_metric([name], float((shard.get("spec") or {}).get("maxDatabases") or 0))
        yield ready
        yield scaling
        yield slots
        yield limit
        if self._connection_limit is not None:
            yield from self._connection_gauges(shard_objects, commitments)

        labels = sorted(set(shard_names) | {UNPLACED} | set(oldest) | set(held) | set(drift))
        yield from shard_gauges(
            labels,
            (
                "dbprovider_database_provisioning_oldest_seconds",
                "Age of the oldest Database still Provisioning (0 if none).",
                lambda shard: oldest.get(shard, 0.0),
            ),
            (
                "dbprovider_databases_deletion_held",
                "Databases deleted without the delete annotation (held, no SQL).",
                lambda shard: held[shard],
            ),
            (
                "dbprovider_databases_connection_limit_drift",
                "Ready Databases whose applied connection limit differs from the install config.",
                lambda shard: drift[shard],
            ),
        )

    @staticmethod
    def _connection_gauges(
        shard_objects: list[Mapping[str, Any]], commitments: Mapping[str, Commitments]
    ) -> Iterator[GaugeMetricFamily]:
        """Budget (status.connectionBudget, once the shard was checked) and what its databases commit."""
        budget_family, committed_family = (
            GaugeMetricFamily(name, documentation, labels=["shard"])
            for name, documentation in (
                ("dbprovider_shard_connection_budget", "Connections the shard's tenants may commit."),
                (
                    "dbprovider_shard_connections_committed",
                    "Connection limits of the databases placed on the shard (an unlimited one: the whole budget).",
                ),
            )
        )
        for shard in shard_objects:
            name = shard["metadata"]["name"]
            budget = (shard.get("status") or {}).get("connectionBudget")
            if not isinstance(budget, int):
                continue  # not checked yet: no figure rather than a wrong one
            budget_family.add_metric([name], budget)
            committed_family.add_metric([name], commitments.get(name, Commitments()).total(budget))
        yield budget_family
        yield committed_family


class EngineCollector(Collector):
    """`dbprovider_engine_available{engine}`: 1 while an optional engine's objects can be watched (its
    CRD is served and listed), 0 while not; only that engine's shards are affected meanwhile."""

    def __init__(self, engines: Mapping[str, Callable[[], bool]]) -> None:
        self._engines = engines

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "dbprovider_engine_available",
            "1 if the optional shard engine's custom resources can be watched, else 0.",
            labels=["engine"],
        )
        for engine, available in sorted(self._engines.items()):
            family.add_metric([engine], 1.0 if available() else 0.0)
        yield family
