"""Capacity-aware placement: pick the shard a new Database goes to, from the informer cache alone.

Pure functions over what the cache holds, so placement costs no API call and no SQL. The count per
shard is the number of Database objects placed there (Deleting ones included: they still hold a
slot until they are dropped).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from domain.constants import ConditionStatus, Engine, ShardConditionType


@dataclass(frozen=True)
class ShardCandidate:
    """What placement needs to know about one Shard."""

    name: str
    engine: str
    accepting: bool
    ready: bool
    max_databases: int
    being_deleted: bool = False

    @classmethod
    def from_object(cls, shard: Mapping[str, Any]) -> ShardCandidate:
        spec = shard.get("spec") or {}
        conditions = (shard.get("status") or {}).get("conditions") or []
        ready = any(
            c.get("type") == ShardConditionType.READY and c.get("status") == ConditionStatus.TRUE for c in conditions
        )
        return cls(
            name=shard["metadata"]["name"],
            engine=spec.get("engine") or Engine.POSTGRES,
            accepting=spec.get("accepting", True) is True,
            ready=ready,
            max_databases=int(spec.get("maxDatabases") or 0),
            being_deleted=bool(shard["metadata"].get("deletionTimestamp")),
        )

    def usable_for(self, engine: str, count: int) -> bool:
        """Accepting, Ready, of the engine, not being deleted, and below its (soft) limit."""
        return (
            self.engine == engine
            and self.accepting
            and self.ready
            and not self.being_deleted
            and count < self.max_databases
        )


def choose_shard(candidates: Iterable[ShardCandidate], counts: Mapping[str, int], engine: str) -> str | None:
    """The usable shard with the fewest databases; ties go to the smallest name. None = no capacity."""
    best: tuple[int, str] | None = None
    for shard in candidates:
        count = counts.get(shard.name, 0)
        if shard.usable_for(engine, count) and (best is None or (count, shard.name) < best):
            best = (count, shard.name)
    return None if best is None else best[1]
