"""How long a Shard remembers its drops (reconciler.shard.dropped.remembered)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from domain.status import MAX_DROPPED_TENANTS, DroppedTenant
from reconciler.shard.dropped import remembered

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def dropped(name: str, ago: timedelta) -> DroppedTenant:
    return DroppedTenant(name=name, dropped_at=NOW - ago)


def test_drops_older_than_the_bound_are_forgotten_the_others_kept_in_order() -> None:
    entries = (
        dropped("t_old_0", timedelta(hours=2)),
        dropped("t_a_1", timedelta(minutes=59)),
        dropped("t_b_2", timedelta(0)),
    )
    assert [entry.name for entry in remembered(entries, NOW, timedelta(hours=1))] == ["t_a_1", "t_b_2"]
    assert remembered(entries, NOW, timedelta(0)) == ()


def test_at_most_the_newest_drops_are_kept() -> None:
    entries = [
        dropped(f"t_{i}_x", timedelta(seconds=MAX_DROPPED_TENANTS + 5 - i)) for i in range(MAX_DROPPED_TENANTS + 5)
    ]
    kept = remembered(entries, NOW, timedelta(days=1))
    assert len(kept) == MAX_DROPPED_TENANTS and kept[0].name == "t_5_x" and kept[-1] == entries[-1]
