"""Settled verdicts reached while a start's lists page in, so the start's resync only has to confirm them.

A start lists every Database and credentials Secret (at 100,000: 200 pages each, most of the time waiting for
the apiserver) and then resyncs: `settled()` on every key, 20-60 us each, seconds of one core after the
lists. Here each Database is looked at as soon as its page, its Secret's page and
its Shard have all arrived (the lists run side by side, in any order), in the informers' threads, while the
next pages are on their way. A verdict records what it was reached on: the resourceBasis of the Database
and its Secret, and the Shard's client endpoint (all the check reads of a Shard: its status writes, the
Shard checks', change nothing here). The resync takes it only if the caches hold exactly those then (a list
is one snapshot, and a resourceVersion names one content of one object), else it looks again as before.
Only "settled" verdicts are kept: anything else, or anything not looked at in time, takes the resync's own
look.

Only the first lists count: once all three are complete, later pages (a relist) are not looked at, and the
verdicts are dropped as the resync takes them. Memory: an entry of the Database's own name, two shared strings
and a shared endpoint per settled Database (about 10 MB at 100,000) until the resync; a replica that never
leads keeps them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from domain.credentials import Endpoint
from domain.objects import Obj
from informers import Informer, object_key, split_key
from informers.informer import resource_version_of

log = logging.getLogger(__name__)
Basis = tuple[str | None, str | None, Endpoint]  # what a verdict was reached on
Pair = tuple[Obj, Obj]


class EarlyVerdicts:
    """Joins the Database, Secret and Shard pages of the first lists and records which Databases are settled.

    `secret_key(db)`: the cache key of its credentials Secret; `shard_name(db)`: the Shard its status names
    (None: unplaced, no verdict); `endpoint(shard)`: the Shard's client endpoint (None: its spec does not
    parse); `settled(db, endpoint, secret)`: the question of settled.py."""

    def __init__(
        self,
        databases: Informer,
        secrets: Informer,
        shards: Informer,
        secret_key: Callable[[Obj], str],
        shard_name: Callable[[Obj], str | None],
        endpoint: Callable[[Obj], Endpoint | None],
        settled: Callable[[Obj, Endpoint, Obj], bool],
    ) -> None:
        self._secret_key, self._shard_name, self._endpoint, self._settled = secret_key, shard_name, endpoint, settled
        self._shards = shards
        self._lock = threading.Lock()
        self._secrets: dict[str, Obj] = {}  # Secrets listed whose Database has not been listed yet
        self._databases: dict[str, Obj] = {}  # Databases listed whose Secret has not been listed yet, by its key
        self._listed_shards: dict[str, Obj] = {}  # the Shards' first list, as it arrives (kept: a few hundred)
        self._shardless: list[Pair] = []  # pairs whose Shard has not been listed yet
        # By the Database's name, its own string (no key string per Database): a namesake in another namespace has
        # another resourceVersion (unique in the cluster), so `take` never confirms one with the other's verdict.
        self._verdicts: dict[str, Basis] = {}
        self.looked = self.found = self.taken = 0  # Databases judged, found settled, verdicts used by a resync
        # A list already complete sends no first pages: its objects are in its store.
        self._complete = {"databases": False, "secrets": False, "shards": False}
        for which, informer, observer in (
            ("databases", databases, self._database_page),
            ("secrets", secrets, self._secret_page),
            ("shards", shards, self._shard_page),
        ):
            informer.add_page_observer(observer)
            self._complete[which] = informer.has_synced()

    def _database_page(self, objects: list[Obj], last: bool) -> None:
        self._join("databases", objects, last, self._secret_key, self._databases, self._secrets)

    def _secret_page(self, objects: list[Obj], last: bool) -> None:
        self._join("secrets", objects, last, object_key, self._secrets, self._databases)

    def _join(
        self,
        which: str,
        objects: list[Obj],
        last: bool,
        key_of: Callable[[Obj], str],
        unmatched: dict[str, Obj],
        partners: dict[str, Obj],
    ) -> None:
        """Pair each object of a Database or Secret page (keyed by the Secret's key) with its partner listed
        before, or keep it until the partner comes."""
        pairs: list[Pair] = []
        with self._lock:
            if self._closed():
                return
            for obj in objects:
                key = key_of(obj)
                partner = partners.pop(key, None)
                if partner is None:
                    unmatched[key] = obj
                else:
                    pairs.append((obj, partner) if which == "databases" else (partner, obj))
            closing = self._finished(which, last)
        self._judge(pairs, closing)

    def _shard_page(self, objects: list[Obj], last: bool) -> None:
        with self._lock:
            if self._closed():
                return
            for shard in objects:
                self._listed_shards[object_key(shard)] = shard
            pairs, self._shardless = (self._shardless, []) if last else ([], self._shardless)
            closing = self._finished("shards", last)
        self._judge(pairs, closing)

    def _closed(self) -> bool:
        return all(self._complete.values())

    def _finished(self, which: str, last: bool) -> bool:
        """Record a list's last page; once all are in, the unmatched Databases and Secrets are of no further
        use. True when this page completed them."""
        if last:
            self._complete[which] = True
        if not self._closed():
            return False
        self._secrets.clear()
        self._databases.clear()
        self._shardless.clear()
        return True

    def _judge(self, pairs: list[Pair], closing: bool) -> None:
        """Outside the lock: the other lists' threads go on joining meanwhile."""
        verdicts: dict[str, Basis] = {}
        shardless: list[Pair] = []
        looked = 0
        for db, secret in pairs:
            shard = self._shard_of(db)
            if shard is None:
                shardless.append((db, secret))
                continue
            looked += 1
            endpoint = self._endpoint(shard)
            basis = _basis(db, secret, endpoint)
            if basis is not None and self._settled(db, basis[2], secret):
                verdicts[db["metadata"]["name"]] = basis
        with self._lock:
            self._verdicts.update(verdicts)
            self.looked += looked
            self.found += len(verdicts)
            if not self._complete["shards"]:
                self._shardless.extend(shardless)  # judged when the Shards' list is in
        if closing:
            log.info(
                "Databases looked at while the lists paged in", extra={"databases": self.looked, "settled": self.found}
            )

    def _shard_of(self, db: Obj) -> Obj | None:
        name = self._shard_name(db)
        if not name:
            return None
        with self._lock:
            shard = self._listed_shards.get(name)
        return shard if shard is not None else self._shards.get(name)

    def take(self, key: str, db: Obj, secret: Obj | None, endpoint: Endpoint | None) -> bool:
        """True when `key` was found settled on exactly these versions and this endpoint (the verdict is used
        up either way)."""
        with self._lock:
            found = self._verdicts.pop(split_key(key)[1], None)
            if found is None or secret is None or found != _basis(db, secret, endpoint):
                return False
            self.taken += 1
        return True


def _basis(db: Obj, secret: Obj, endpoint: Endpoint | None) -> Basis | None:
    """What a verdict on `db` rests on; None when something is missing (no verdict then)."""
    db_version, secret_version = resource_version_of(db), resource_version_of(secret)
    if db_version is None or secret_version is None or endpoint is None:
        return None
    return db_version, secret_version, endpoint
