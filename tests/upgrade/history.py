"""Every version of the provider's objects and of its Lease, as a watch delivers them.

Two releases that fight leave a trace here: a status key one writes and the other removes (then the
first writes it again), a condition that goes back and forth, a Lease that changes hands back to a
replica it already left. `History` records from `start()` on; the checks take a `since` mark.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from domain.resources import CONSUMERS, DATABASES, SHARDS
from informers import LEASES, Informer, Rest
from informers.leader import lease_holder


@dataclass(frozen=True)
class Version:
    when: float
    kind: str
    name: str
    resource_version: int
    obj: dict[str, Any]


class History:
    def __init__(self, rest: Rest, namespace: str) -> None:
        self._lock = threading.Lock()
        self.versions: list[Version] = []
        self._informers = [
            Informer(rest, DATABASES, namespace),
            Informer(rest, SHARDS),
            Informer(rest, CONSUMERS),
            Informer(rest, LEASES, namespace),
        ]

    def start(self) -> History:
        for informer in self._informers:
            kind = informer.resource.plural
            informer.add_handler(lambda event, old, new, kind=kind: self._record(kind, new))
            informer.start()
        for informer in self._informers:
            assert informer.wait_for_sync(30), f"{informer!r} did not sync"
        return self

    def stop(self) -> None:
        for informer in self._informers:
            informer.stop()

    def _record(self, kind: str, obj: dict[str, Any] | None) -> None:
        if obj is None:
            return
        meta = obj["metadata"]
        with self._lock:
            self.versions.append(
                Version(time.monotonic(), kind, meta["name"], int(meta["resourceVersion"]), copy.deepcopy(obj))
            )

    def mark(self) -> float:
        return time.monotonic()

    def _objects(self, kind: str, since: float) -> dict[str, list[dict[str, Any]]]:
        """name -> its versions from `since` on, in resourceVersion order (the last one before `since` first)."""
        with self._lock:
            versions = sorted((v for v in self.versions if v.kind == kind), key=lambda v: v.resource_version)
        by_name: dict[str, list[Version]] = defaultdict(list)
        for version in versions:
            by_name[version.name].append(version)
        out = {}
        for name, seen in by_name.items():
            before = [v for v in seen if v.when < since]
            after = [v for v in seen if v.when >= since]
            out[name] = [v.obj for v in (before[-1:] + after)]
        return out

    # -- checks ----------------------------------------------------------------------------------

    def status_fights(self, since: float) -> list[str]:
        """Status keys and condition statuses of our objects that went A -> B -> A after `since`:
        written by one writer and undone by another, then written again."""
        problems = []
        for kind in ("databases", "shards", "consumers"):
            for name, objs in self._objects(kind, since).items():
                problems += [f"{kind}/{name}: {p}" for p in _back_and_forth(objs)]
        return problems

    def lease_holders(self, since: float = 0.0) -> list[str]:
        """The successive holders of the Lease after `since` (repeats collapsed; released = None)."""
        holders: list[str | None] = []
        for objs in self._objects("leases", since).values():
            for obj in objs:
                holder = lease_holder(obj)
                if not holders or holders[-1] != holder:
                    holders.append(holder)
        return [h for h in holders if h is not None]

    def status_writes(self, kind: str, since: float) -> dict[str, int]:
        """name -> how many times its status changed after `since`."""
        counts = {}
        for name, objs in self._objects(kind, since).items():
            statuses = [o.get("status") for o in objs]
            counts[name] = sum(1 for a, b in zip(statuses, statuses[1:], strict=False) if a != b)
        return counts


def _back_and_forth(objs: list[dict[str, Any]]) -> list[str]:
    """For each status key (and each condition's status and reason): a value that returns after it
    had been changed or removed."""
    tracks: dict[str, list[Any]] = defaultdict(list)
    keys: set[str] = set()
    for obj in objs:
        status = obj.get("status") or {}
        keys |= {k for k in status if k != "conditions"}
        keys |= {f"condition {c['type']}" for c in status.get("conditions") or []}
    for obj in objs:
        status = obj.get("status") or {}
        conditions = {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions") or []}
        for key in keys:
            if key.startswith("condition "):
                value = conditions.get(key[len("condition ") :])
            else:
                value = status.get(key)
            track = tracks[key]
            if not track or track[-1] != value:
                track.append(value)
    problems = []
    for key, track in tracks.items():
        for i, value in enumerate(track):
            if value in track[i + 2 :] and any(other != value for other in track[i + 1 :]):
                problems.append(f"{key} went {' -> '.join(repr(v) for v in track)}")
                break
    return problems
