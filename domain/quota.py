"""The quota rule, written once, and the per-consumer ledger of slots that makes it exact across replicas.

The rule: a consumer's databases that are not yet Deleted count against `Consumer.spec.maxDatabases`
(Deleting ones count). The Consumer controller's `status.databaseCount`, the API's 429 and the
ledger all ask `counts_against_quota`.

The ledger: a ConfigMap per consumer in the release namespace (`quota_ledger_name`) with as many slots
as the consumer may have databases: data keys "0", "1", ..., each empty (free) or holding one counted
database, "<externalId> <time reserved>". Before a replica creates a Database it takes a free slot
with a JSON patch that tests the slot is still empty and fills it (`claim_patch`, several slots at
once for the requests that arrived together): the apiserver applies it atomically, so two replicas
never take the same slot, and since there are no more slots than maxDatabases, concurrent creates on
any number of replicas never exceed it. Claims of different slots do not conflict, so replicas do not
wait for each other's reads (and different consumers never wait for each other at all).

Changing the set of slots is rarer and done with a compare-and-swap on the whole ConfigMap's
resourceVersion (`restructure`): the first create of a consumer, a changed maxDatabases, a database
the cache shows that holds no slot (made without the API, or before the ledger existed: it is
adopted), and freeing slots:
- a database the cache shows Deleted frees its slot (a terminal phase, so no replica needs to agree);
- a slot older than the reservation timeout whose database the apiserver does not have is freed (a
  replica died between claiming and creating, or its create failed without an answer);
- a create the apiserver refused frees its slot at once (`release_patch`, by the replica that took it);
- a slot no replica can have written (`implausible`: a holder that is not an externalId, a value that is
  not "<externalId> <time>", a time further ahead than the replicas' clocks can differ) is checked at
  once rather than after the timeout, and freed unless its database exists: a slot edited by hand, or
  by anyone with write access to ConfigMaps in the release namespace, holds no quota for good.
There are max(maxDatabases, databases counted) slots: lowering the quota below what is counted keeps
every counted database's slot and leaves no free one.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from domain.constants import LABEL_CONSUMER, LABEL_MANAGED_BY, MANAGED_BY, Phase
from domain.naming import is_valid_external_id, label_value, quota_ledger_name
from domain.timefmt import format_micro_time, parse_time

Obj = Mapping[str, Any]
FREE = ""
_EPOCH = datetime.fromtimestamp(0, UTC)


def counts_against_quota(db: Obj) -> bool:
    """True while a Database counts against its consumer's quota: until its phase is Deleted."""
    status = db.get("status")
    return not (isinstance(status, Mapping) and status.get("phase") == Phase.DELETED)


@dataclass(frozen=True)
class Holder:
    """The database holding a slot, and when the slot was taken."""

    external_id: str
    reserved_at: datetime
    malformed: bool = field(default=False, compare=False)  # the value was not "<externalId> <time>"

    def value(self) -> str:
        return f"{self.external_id} {format_micro_time(self.reserved_at)}"

    @classmethod
    def parse(cls, value: str) -> Holder | None:
        """None for a free slot; a value that is not ours counts as held since the epoch (checked, not
        dropped blindly)."""
        return _parse_holder(value)


@functools.lru_cache(maxsize=1 << 16)
def _parse_holder(value: str) -> Holder | None:
    """Cached: holders are frozen and a slot's value changes only when it is claimed or freed, so the
    ledger each write returns (the whole ConfigMap: hundreds of slots, milliseconds to parse, under the
    consumer's one writer) costs a parse of its new claims only."""
    if not value:
        return None
    external_id, _, stamp = value.partition(" ")
    reserved_at = parse_time(stamp)
    return Holder(external_id, reserved_at or _EPOCH, malformed=reserved_at is None)


def implausible(holder: Holder, now: datetime, skew: timedelta) -> str | None:
    """Why no replica can have written `holder` (the reason a repair is counted by), or None.

    `skew` is how far the replicas' clocks may differ: a reservation dated further ahead was not made
    by a replica's clock."""
    if not is_valid_external_id(holder.external_id):
        return "unknown_holder"
    if holder.malformed:
        return "malformed"
    if holder.reserved_at - now > skew:
        return "future"
    return None


@dataclass(frozen=True)
class QuotaLedger:
    """One consumer's ledger as read from the apiserver: slot key -> holder (None: free)."""

    consumer: str
    slots: Mapping[str, Holder | None] = field(default_factory=dict)
    resource_version: str | None = None  # None: the ConfigMap does not exist yet

    @classmethod
    def parse(cls, consumer: str, obj: Obj | None) -> QuotaLedger:
        if obj is None:
            return cls(consumer)
        data = obj.get("data") or {}
        slots = {str(key): Holder.parse(str(value or "")) for key, value in data.items()}
        return cls(consumer, slots, (obj.get("metadata") or {}).get("resourceVersion"))

    @property
    def exists(self) -> bool:
        return self.resource_version is not None

    def held(self) -> dict[str, tuple[str, Holder]]:
        """externalId -> (slot key, holder) of every held slot."""
        return {h.external_id: (key, h) for key, h in self.slots.items() if h is not None}

    def free(self) -> list[str]:
        return sorted((key for key, h in self.slots.items() if h is None), key=_slot_order)


def _slot_order(key: str) -> tuple[int, str]:
    return (int(key), key) if key.isdigit() else (1 << 62, key)


# -- restructuring (compare-and-swap on the resourceVersion) ---------------------------------------


@dataclass(frozen=True)
class StaleHolders:
    """What a look at the ledger beside the cache found (see `stale_holders`)."""

    free: set[str] = field(default_factory=set)  # externalIds whose slot is freed now
    check: set[str] = field(default_factory=set)  # externalIds to check against the apiserver
    implausible: dict[str, str] = field(default_factory=dict)  # those of `check` no replica wrote -> why


def stale_holders(
    ledger: QuotaLedger,
    cached: Mapping[str, Obj],
    now: datetime,
    timeout: timedelta,
    skew: timedelta,
    removed: Mapping[str, datetime] | None = None,
) -> StaleHolders:
    """The holders to free now and to check against the apiserver.

    `cached` holds the consumer's databases in this replica's cache by externalId; `removed` when the
    cache saw the object of an externalId removed. A holder the cache shows Deleted is freed; one the
    cache does not show is checked when its object was removed after the slot was taken (a database
    dropped soon after its create), when it is older than `timeout` (its create may have failed, or its
    database may be gone) or `implausible` (at once); younger ones stay.
    """
    found = StaleHolders()
    removed = removed or {}
    for external_id, (_, holder) in ledger.held().items():
        db = cached.get(external_id)
        if db is not None:
            if not counts_against_quota(db):
                found.free.add(external_id)
        elif reason := implausible(holder, now, skew):
            found.check.add(external_id)
            found.implausible[external_id] = reason
        elif now - holder.reserved_at >= timeout or removed.get(external_id, holder.reserved_at) > holder.reserved_at:
            found.check.add(external_id)
    return found


def restructure(
    ledger: QuotaLedger, counted_in_cache: Iterable[str], gone: Iterable[str], limit: int, now: datetime
) -> dict[str, str] | None:
    """The ledger's new data when its slots must change, else None.

    Frees the slots of `gone` externalIds, adopts the databases `counted_in_cache` that hold no slot, frees
    all but one slot of a database holding several (two replicas claimed for the same externalId, each
    from a view without the other's claim), and keeps max(limit, counted) slots: held slots keep their
    keys (a claim in flight on a free one fails its test and retries), free ones are added or removed at
    the end.
    """
    held = {ext: pair for ext, pair in ledger.held().items() if ext not in set(gone)}
    adopt = sorted(set(counted_in_cache) - set(held))
    size = max(limit, len(held) + len(adopt))
    held_slots = sum(1 for holder in ledger.slots.values() if holder is not None)  # one database may hold two
    unchanged = not adopt and len(held) == held_slots and len(ledger.slots) == size
    if ledger.exists and unchanged:
        return None
    data = {key: holder.value() for key, holder in held.values()}
    numbers = (str(n) for n in range(1 << 30) if str(n) not in data)
    for external_id in adopt:
        data[next(numbers)] = Holder(external_id, now).value()
    while len(data) < size:
        data[next(numbers)] = FREE
    return data


def ledger_object(namespace: str, consumer: str, data: Mapping[str, str]) -> dict[str, Any]:
    """The ConfigMap of a consumer's first reservation."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": quota_ledger_name(consumer), "namespace": namespace, "labels": ledger_labels(consumer)},
        "data": dict(data),
    }


def restructure_patch(ledger: QuotaLedger, data: Mapping[str, str]) -> dict[str, Any]:
    """A merge patch from `ledger` to `data`, conditional on the resourceVersion it was read at."""
    changes: dict[str, str | None] = {key: None for key in ledger.slots if key not in data}
    changes.update({key: value for key, value in data.items() if _value(ledger, key) != value})
    return {"metadata": {"resourceVersion": ledger.resource_version}, "data": changes}


def _value(ledger: QuotaLedger, key: str) -> str | None:
    if key not in ledger.slots:
        return None
    holder = ledger.slots[key]
    return holder.value() if holder is not None else FREE


def ledger_labels(consumer: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONSUMER: label_value(consumer)}


# -- claiming and releasing one slot (test-and-set, no resourceVersion) -----------------------------


def choose_free(ledger: QuotaLedger, count: int, cursor: int, taken: Iterable[str] = ()) -> tuple[list[str], int]:
    """Up to `count` free slots not in `taken`, and where to continue next time.

    A replica fills the ledger in order from its own cursor (slot positions in key order). When it runs
    into a slot that is not free, it jumps to the middle of the longest run of free slots: other
    replicas fill their own runs from their beginnings, so claims of different replicas rarely meet
    until the ledger is nearly full (a meeting costs the loser one more read and write).
    """
    keys = sorted(ledger.slots, key=_slot_order)
    excluded = set(taken)
    free = [ledger.slots[key] is None and key not in excluded for key in keys]
    chosen: list[str] = []
    position = cursor % len(keys) if keys else 0
    while len(chosen) < count and any(free):
        if free[position]:
            chosen.append(keys[position])
            free[position] = False
            position = (position + 1) % len(keys)
            continue
        start, length = _longest_run(free)
        position = start + length // 2
    return chosen, position


def _longest_run(flags: list[bool]) -> tuple[int, int]:
    """(start, length) of the longest run of True in `flags` (a non-empty one exists)."""
    best, start, current = (0, 0), 0, 0
    for index, flag in enumerate(flags):
        if flag:
            if current == 0:
                start = index
            current += 1
            if current > best[1]:
                best = (start, current)
        else:
            current = 0
    return best


def random_cursor() -> int:
    return random.randrange(1 << 20)  # spreading replicas over the slots, not security


def _path(key: str) -> str:
    return "/data/" + key.replace("~", "~0").replace("/", "~1")


def claim_patch(claims: Mapping[str, Holder]) -> list[dict[str, Any]]:
    """A JSON patch taking each slot for its holder, all or none: only if every one is still free."""
    patch: list[dict[str, Any]] = []
    for key, holder in claims.items():
        patch.append({"op": "test", "path": _path(key), "value": FREE})
        patch.append({"op": "replace", "path": _path(key), "value": holder.value()})
    return patch


def release_patch(key: str, holder: Holder) -> list[dict[str, Any]]:
    """A JSON patch freeing slot `key`, only if `holder` still holds it."""
    return [
        {"op": "test", "path": _path(key), "value": holder.value()},
        {"op": "replace", "path": _path(key), "value": FREE},
    ]
