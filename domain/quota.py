"""The quota rule, written once, and the per-consumer ledger that makes it exact across replicas.

The rule: a consumer's databases that are not yet Deleted count against `Consumer.spec.maxDatabases`
(Deleting ones count). The Consumer controller's `status.databaseCount`, the API's 429 and the
ledger's pruning all ask `counts_against_quota`.

The ledger: a ConfigMap per consumer in the release namespace (`quota_ledger_name`), one data key per
database the API has counted for that consumer (its externalId), the value the time the slot was
reserved. A replica adds a key with a compare-and-swap on the ConfigMap's resourceVersion *before*
it creates the Database, and only while fewer than maxDatabases are counted, so concurrent creates on
any number of replicas never exceed the quota; only the creates of one consumer contend.

What is counted when a replica decides: the ledger's keys together with the consumer's databases the
replica's own cache shows not yet Deleted (so a database made without the API, or before the ledger
existed, counts as well). A key leaves the ledger when
- its database is Deleted (the cache shows phase Deleted: a terminal phase, so no replica needs to
  agree), or
- it is older than the reservation timeout and the apiserver has no such database (a replica died
  between reserving and creating, or its create failed without an answer), or
- the create was refused by the apiserver (the replica that reserved removes it at once).
Pruning happens in the write of the next reservation of that consumer; nothing else writes the
ledger, so a consumer that creates nothing leaves its ledger untouched (and it counts nothing the
cache would not count too).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from domain.constants import LABEL_CONSUMER, LABEL_MANAGED_BY, MANAGED_BY, Phase
from domain.naming import label_value, quota_ledger_name
from domain.timefmt import format_micro_time, parse_time

Obj = Mapping[str, Any]


def counts_against_quota(db: Obj) -> bool:
    """True while a Database counts against its consumer's quota: until its phase is Deleted."""
    status = db.get("status")
    return not (isinstance(status, Mapping) and status.get("phase") == Phase.DELETED)


@dataclass(frozen=True)
class QuotaLedger:
    """One consumer's ledger as read from the apiserver: externalId -> reservation time."""

    consumer: str
    entries: Mapping[str, datetime] = field(default_factory=dict)
    resource_version: str | None = None  # None: the ConfigMap does not exist yet

    @classmethod
    def parse(cls, consumer: str, obj: Obj | None) -> QuotaLedger:
        """The ledger in ConfigMap `obj` (None: no ConfigMap yet). A value that is not a time counts
        as reserved at the epoch: it still counts, and the first check against the apiserver decides."""
        if obj is None:
            return cls(consumer)
        data = obj.get("data") or {}
        epoch = datetime.fromtimestamp(0, UTC)
        entries = {str(key): parse_time(value) or epoch for key, value in data.items()}
        return cls(consumer, entries, (obj.get("metadata") or {}).get("resourceVersion"))


@dataclass(frozen=True)
class Decision:
    """What one compare-and-swap of the ledger does for a batch of requested externalIds."""

    granted: frozenset[str]  # may be created: counted now (newly reserved, or counted already)
    refused: frozenset[str]  # over the quota: 429
    reserve: frozenset[str]  # keys to add
    prune: frozenset[str]  # keys to remove
    counted: int  # databases counted after the write


def stale_keys(
    ledger: QuotaLedger, cached: Mapping[str, Obj], now: datetime, timeout: timedelta
) -> tuple[set[str], set[str]]:
    """(keys to prune now, keys to check against the apiserver) of `ledger`.

    `cached` holds the consumer's databases in this replica's cache by externalId. A key whose
    database the cache shows Deleted goes; a key the cache does not show and that is older than
    `timeout` is checked (its create may have failed, or its database may be gone); younger ones stay.
    """
    prune, check = set(), set()
    for key, reserved_at in ledger.entries.items():
        db = cached.get(key)
        if db is not None:
            if not counts_against_quota(db):
                prune.add(key)
        elif now - reserved_at >= timeout:
            check.add(key)
    return prune, check


def decide(
    ledger: QuotaLedger,
    counted_in_cache: Iterable[str],
    prune: Iterable[str],
    requested: Iterable[str],
    limit: int | None,
) -> Decision:
    """Grant `requested` externalIds in order while fewer than `limit` databases are counted.

    Counted: the ledger's keys (less `prune`) and the externalIds of the consumer's databases the cache
    shows not yet Deleted. A requested externalId that is counted already is granted without a new key
    (a second PUT of the same database). `limit` None: no quota, everything is granted (the ledger is
    still written, so that a quota set later counts these databases at once).
    """
    pruned = frozenset(prune) & frozenset(ledger.entries)
    used = (set(ledger.entries) - pruned) | set(counted_in_cache)
    granted, refused, reserve = set(), set(), set()
    for key in requested:
        if key in used:
            granted.add(key)
        elif limit is None or len(used) < limit:
            used.add(key)
            granted.add(key)
            reserve.add(key)
        else:
            refused.add(key)
    return Decision(frozenset(granted), frozenset(refused), frozenset(reserve), pruned, len(used))


def ledger_labels(consumer: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONSUMER: label_value(consumer)}


def new_ledger_object(namespace: str, consumer: str, reserve: Iterable[str], now: datetime) -> dict[str, Any]:
    """The ConfigMap of a consumer's first reservation."""
    stamp = format_micro_time(now)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": quota_ledger_name(consumer), "namespace": namespace, "labels": ledger_labels(consumer)},
        "data": {key: stamp for key in sorted(reserve)},
    }


def ledger_patch(ledger: QuotaLedger, decision: Decision, now: datetime) -> dict[str, Any]:
    """A merge patch applying `decision`, conditional on the resourceVersion the ledger was read at
    (the apiserver answers 409 if another replica wrote in between)."""
    stamp = format_micro_time(now)
    data: dict[str, str | None] = {key: None for key in decision.prune}
    data.update({key: stamp for key in decision.reserve})
    return {"metadata": {"resourceVersion": ledger.resource_version}, "data": data}


def release_patch(key: str, reserved_at: datetime) -> list[dict[str, Any]]:
    """A JSON patch removing one reservation, only if it is still the one this replica made."""
    path = "/data/" + key.replace("~", "~0").replace("/", "~1")
    return [{"op": "test", "path": path, "value": format_micro_time(reserved_at)}, {"op": "remove", "path": path}]
