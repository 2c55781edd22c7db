"""The fleet gauges (docs/operations.md, "Metrics and alerts"), computed from the informer caches at scrape time.

Computing at scrape time keeps reconciles free of metric bookkeeping and makes the numbers always
agree with the cache. No series carries consumer, externalId or role names: only shard, phase and the
Ready condition's reason (a bounded set of constants), which the alerts show to on-call.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from domain.conditions import READY, condition_is_true, condition_reason, find_condition
from domain.connection_budget import Commitments
from domain.constants import UNPLACED, ConditionStatus, DatabaseConditionType, Phase, ShardConditionType
from domain.objects import DatabaseGlance, ShardState
from domain.timefmt import parse_time
from reconciler.runtime.metrics import shard_gauges

NO_REASON = "Unknown"  # no Ready condition yet
Objects = Callable[[], Iterable[Mapping[str, Any]]]


def _scaling_since(shard: ShardState) -> float | None:
    """When the shard's cloudberry cluster began Scaling (its Scaling condition's transition), or None."""
    condition = find_condition(shard.status.conditions, ShardConditionType.SCALING)
    if condition is None or condition.status != ConditionStatus.TRUE:
        return None
    return condition.last_transition_time.timestamp()


def _created_at(db: DatabaseGlance) -> float | None:
    created = parse_time(db.creation_timestamp)
    return None if created is None else created.timestamp()


@dataclass(eq=False)  # a registry keys its collectors by identity
class FleetCollector(Collector):
    """Reads shards and databases from the caches on every scrape.

    Shards (a few hundred at most) are parsed (metadata and status; a status that does not validate reads
    as empty); Databases (up to 100,000) are not: `DatabaseGlance` reads the few fields the gauges need.
    `connection_limit` is what a Database commits (domain.connection_budget.database_limit); without it
    no connection gauges are exported.
    """

    shards: Objects
    databases: Objects
    clock: Callable[[], float] = time.time
    connection_limit: Callable[[Mapping[str, Any]], int | None] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.clock()
        raw_shards = list(self.shards())
        shard_objects = [ShardState.parse_lenient_status(shard)[0] for shard in raw_shards]
        shard_names = [shard.name for shard in shard_objects]

        per_phase: Counter[tuple[str, str, str]] = Counter()
        in_use: Counter[str] = Counter()
        held: Counter[str] = Counter()
        drift: Counter[str] = Counter()
        oldest: dict[str, float] = defaultdict(float)
        commitments: dict[str, Commitments] = defaultdict(Commitments)
        for db in self.databases():
            glance = DatabaseGlance.of(db)
            shard = glance.shard or UNPLACED
            phase = glance.phase or Phase.PROVISIONING
            per_phase[(shard, phase, glance.reason(READY) or NO_REASON)] += 1
            if shard != UNPLACED and phase != Phase.DELETED:
                in_use[shard] += 1
                if self.connection_limit is not None:
                    commitments[shard] = commitments[shard].plus(self.connection_limit(db))
            if glance.is_true(DatabaseConditionType.DELETION_HELD):
                held[shard] += 1
            if phase == Phase.READY and glance.is_true(DatabaseConditionType.CONNECTION_LIMIT_DRIFT):
                drift[shard] += 1
            if phase == Phase.PROVISIONING:
                created = _created_at(glance)
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
        for state, raw in zip(shard_objects, raw_shards, strict=True):
            name, conditions = state.name, state.status.conditions
            ready.add_metric(
                [name, condition_reason(conditions, READY) or NO_REASON],
                1.0 if condition_is_true(conditions, ShardConditionType.READY) else 0.0,
            )
            since = _scaling_since(state)
            scaling.add_metric([name], 0.0 if since is None else max(0.0, now - since))
            slots.add_metric([name], in_use[name])
            # Read raw: the limit is shown even when another part of the spec does not validate.
            limit.add_metric([name], float((raw.get("spec") or {}).get("maxDatabases") or 0))
        yield ready
        yield scaling
        yield slots
        yield limit
        if self.connection_limit is not None:
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
        shard_objects: list[ShardState], commitments: Mapping[str, Commitments]
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
            name, budget = shard.name, shard.status.connection_budget
            if budget is None:
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
