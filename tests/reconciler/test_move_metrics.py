"""The move gauges follow the cached DatabaseMoves and never carry a tenant's or a database's name."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from domain.constants import LABEL_DRAIN, MoveMode, MovePhase
from reconciler.move.metrics import MoveCollector, MoveMetrics

NOW = 1_800_000_000.0


def move(name: str, phase: str | None, age: float, drain: str | None = None, **status: Any) -> dict[str, Any]:
    created = datetime.fromtimestamp(NOW - age, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta: dict[str, Any] = {"name": name, "namespace": "dbprovider", "creationTimestamp": created}
    if drain is not None:
        meta["labels"] = {LABEL_DRAIN: drain}
    return {
        "metadata": meta,
        "spec": {"database": f"{name}-tenant-db", "target": "any"},
        "status": {"phase": phase, **status} if phase else {},
    }


def scrape(moves: list[dict[str, Any]]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(MoveCollector(lambda: moves, lambda: ["pg-new", "pg-old"], clock=lambda: NOW))
    return registry


def test_moves_per_phase_the_oldest_running_and_the_failed_moves_of_each_drain() -> None:
    moves = [
        move("a", None, 30),  # not looked at yet: Pending
        move("b", "CatchingUp", 600),
        move("c", "CatchingUp", 7200),
        move("d", "Completed", 90_000, drain="pg-old"),
        move("e", "Failed", 80_000, drain="pg-old"),
        move("f", "Aborted", 70_000, drain="pg-old"),
        move("g", "Failed", 60_000),  # not a drain's
    ]
    registry = scrape(moves)
    value = registry.get_sample_value
    assert value("dbprovider_moves", {"phase": "Pending"}) == 1
    assert value("dbprovider_moves", {"phase": "CatchingUp"}) == 2
    assert value("dbprovider_moves", {"phase": "CuttingOver"}) == 0
    assert value("dbprovider_moves", {"phase": "Failed"}) == 2
    assert value("dbprovider_move_oldest_seconds", {"phase": "CatchingUp"}) == 7200
    assert value("dbprovider_move_oldest_seconds", {"phase": "Pending"}) == 30
    assert value("dbprovider_move_oldest_seconds", {"phase": "Copying"}) == 0
    assert value("dbprovider_move_oldest_seconds", {"phase": "Completed"}) is None  # finished: no age
    assert value("dbprovider_drain_moves_failed", {"shard": "pg-old"}) == 2
    assert value("dbprovider_drain_moves_failed", {"shard": "pg-new"}) == 0  # every shard has its sample
    text = generate_latest(registry).decode()
    assert "tenant-db" not in text and "namespace" not in text


def test_the_counter_and_the_histogram_start_at_zero_for_every_outcome_and_mode() -> None:
    registry = CollectorRegistry()
    metrics = MoveMetrics(registry)
    value = registry.get_sample_value
    for outcome in ("Completed", "Aborted", "RolledBack", "Failed"):
        assert value("dbprovider_moves_finished_total", {"outcome": outcome}) == 0
    assert value("dbprovider_move_write_pause_seconds_count", {"mode": "Offline"}) == 0
    metrics.ended(MovePhase.COMPLETED)
    metrics.paused(MoveMode.ONLINE, 1.2)
    assert value("dbprovider_moves_finished_total", {"outcome": "Completed"}) == 1
    assert value("dbprovider_move_write_pause_seconds_bucket", {"mode": "Online", "le": "2.5"}) == 1
    assert value("dbprovider_move_write_pause_seconds_bucket", {"mode": "Online", "le": "1.0"}) == 0


def test_the_copy_sizes_are_summed_per_unfinished_phase() -> None:
    """How much the running moves have to copy and have copied, per phase (never per move)."""
    moves = [
        move("a", "Copying", 60, sourceBytes=100 << 20, targetBytes=10 << 20),
        move("b", "CatchingUp", 60, sourceBytes=300 << 20, targetBytes=250 << 20),
        move("c", "CatchingUp", 60, sourceBytes=50 << 20),  # not looked at the target yet
        move("d", "Completed", 600, sourceBytes=1 << 30, targetBytes=1 << 30),  # finished: not counted
    ]
    value = scrape(moves).get_sample_value
    assert value("dbprovider_move_source_bytes", {"phase": "Copying"}) == 100 << 20
    assert value("dbprovider_move_target_bytes", {"phase": "Copying"}) == 10 << 20
    assert value("dbprovider_move_source_bytes", {"phase": "CatchingUp"}) == 350 << 20
    assert value("dbprovider_move_target_bytes", {"phase": "CatchingUp"}) == 250 << 20
    assert value("dbprovider_move_source_bytes", {"phase": "CuttingOver"}) == 0
    assert value("dbprovider_move_source_bytes", {"phase": "Completed"}) is None
