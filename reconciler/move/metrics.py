"""The move metrics (docs/operations.md, "Metrics and alerts").

Gauges are computed from the DatabaseMove cache at scrape time (every replica agrees with the
cache); the finished-moves counter and the write-pause histogram are counted by the leader's
controller as a move ends. Labels are phases, outcomes, modes and shard names, never a tenant's.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as CounterMetric
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from domain.constants import LABEL_DRAIN, MoveMode, MovePhase
from domain.timefmt import parse_time

UNFINISHED = (MovePhase.PENDING, MovePhase.PREFLIGHT, MovePhase.COPYING, MovePhase.CATCHING_UP, MovePhase.CUTTING_OVER)
OUTCOMES = (MovePhase.COMPLETED, MovePhase.ABORTED, MovePhase.ROLLED_BACK, MovePhase.FAILED)
# Seconds: an online cutover's pause is meant to stay below 5 s; an offline one lasts the whole copy.
PAUSE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


class MoveMetrics:
    """What the move controller counts as moves end."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.finished = CounterMetric(
            "dbprovider_moves_finished_total",
            "DatabaseMoves ended, by outcome (Completed, Aborted, RolledBack, Failed).",
            ["outcome"],
            registry=registry,
        )
        self.write_pause = Histogram(
            "dbprovider_move_write_pause_seconds",
            "How long each completed move paused the database's writes (online: the cutover; offline: the copy).",
            ["mode"],
            buckets=PAUSE_BUCKETS,
            registry=registry,
        )
        for outcome in OUTCOMES:
            self.finished.labels(outcome=outcome.value)
        for mode in (MoveMode.ONLINE, MoveMode.OFFLINE):
            self.write_pause.labels(mode=mode.value)

    def ended(self, outcome: MovePhase) -> None:
        self.finished.labels(outcome=outcome.value).inc()

    def paused(self, mode: MoveMode, seconds: float) -> None:
        self.write_pause.labels(mode=mode.value).observe(seconds)


def _phase(move: Mapping[str, Any]) -> str:
    phase = (move.get("status") or {}).get("phase")
    return phase if isinstance(phase, str) else MovePhase.PENDING.value


@dataclass(eq=False)  # a registry keys its collectors by identity
class MoveCollector(Collector):
    """`moves` lists the DatabaseMoves of the release namespace (the informer's cache); `shard_names`
    the Shards, each of which gets a `dbprovider_drain_moves_failed` sample (0 without a failed move), so
    the alert reading it always finds its series."""

    moves: Callable[[], Iterable[Mapping[str, Any]]]
    shard_names: Callable[[], Iterable[str]] = lambda: ()
    clock: Callable[[], float] = time.time

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.clock()
        per_phase: Counter[str] = Counter()
        oldest: dict[str, float] = {}
        drain_failed: Counter[str] = Counter()
        copy_bytes: dict[str, Counter[str]] = {"sourceBytes": Counter(), "targetBytes": Counter()}
        for move in self.moves():
            phase = _phase(move)
            per_phase[phase] += 1
            if phase in UNFINISHED:
                status = move.get("status") or {}
                for field, sums in copy_bytes.items():
                    if isinstance(size := status.get(field), int):
                        sums[phase] += size
            meta = move.get("metadata") or {}
            created = parse_time(meta.get("creationTimestamp"))
            if phase in UNFINISHED and created is not None:
                oldest[phase] = max(oldest.get(phase, 0.0), now - created.timestamp())
            drained = (meta.get("labels") or {}).get(LABEL_DRAIN)
            if isinstance(drained, str) and phase in OUTCOMES and phase != MovePhase.COMPLETED:
                drain_failed[drained] += 1

        moves = GaugeMetricFamily("dbprovider_moves", "DatabaseMoves per phase.", labels=["phase"])
        for phase in MovePhase:
            moves.add_metric([phase.value], per_phase.get(phase.value, 0))
        yield moves
        age = GaugeMetricFamily(
            "dbprovider_move_oldest_seconds",
            "Age (since it was created) of the oldest DatabaseMove in each unfinished phase (0 if none).",
            labels=["phase"],
        )
        for phase in UNFINISHED:
            age.add_metric([phase.value], max(oldest.get(phase.value, 0.0), 0.0))
        yield age
        for field, name, what in (
            ("sourceBytes", "dbprovider_move_source_bytes", "the databases' sizes on their source shards"),
            ("targetBytes", "dbprovider_move_target_bytes", "the sizes of their copies on the target shards so far"),
        ):
            sizes = GaugeMetricFamily(
                name, f"Summed over the unfinished DatabaseMoves in each phase: {what}.", labels=["phase"]
            )
            for phase in UNFINISHED:
                sizes.add_metric([phase.value], copy_bytes[field].get(phase.value, 0))
            yield sizes
        failed = GaugeMetricFamily(
            "dbprovider_drain_moves_failed",
            "Moves of the shard's drain that ended without completing (not tried again until deleted).",
            labels=["shard"],
        )
        for shard in sorted(set(self.shard_names()) | set(drain_failed)):
            failed.add_metric([shard], drain_failed.get(shard, 0))
        yield failed
