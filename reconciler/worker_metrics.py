"""The Database workers' gauges per shard, read from the work queue's lanes at scrape time.

An SRE reads how many of a shard's `workersPerShard` slots are busy and how many of its databases
wait for one: a shard at its limit with a growing queue is slow or hung, and holds only its own
slots. Labels are shard names (and `unplaced` for placement), never tenant names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from domain.constants import UNPLACED
from reconciler.runtime.metrics import shard_gauges

LaneStats = Callable[[], dict[str, tuple[int, int]]]  # lane -> (keys ready, keys in flight)


@dataclass(eq=False)  # a registry keys its collectors by identity
class DatabaseWorkersCollector(Collector):
    lane_stats: LaneStats
    shard_names: Callable[[], Iterable[str]]
    per_shard: int
    total: int

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self.lane_stats()
        lanes = sorted(set(self.shard_names()) | {UNPLACED} | set(stats))
        yield from shard_gauges(
            lanes,
            (
                "dbprovider_database_workers_in_flight",
                "Database workers busy with the shard's databases (shard=unplaced: placement); "
                "at most workersPerShard.",
                lambda lane: stats.get(lane, (0, 0))[1],
            ),
            (
                "dbprovider_database_queue_depth",
                "Databases of the shard waiting for a worker (not counting retries waiting for their backoff).",
                lambda lane: stats.get(lane, (0, 0))[0],
            ),
        )
        yield GaugeMetricFamily(
            "dbprovider_database_workers_per_shard",
            "workersPerShard: the Database workers one shard may use.",
            value=self.per_shard,
        )
        yield GaugeMetricFamily(
            "dbprovider_database_workers",
            "workersTotal: the Database workers of the leading replica.",
            value=self.total,
        )
