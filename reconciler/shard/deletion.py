"""The Shard finalizer: a deleted Shard stays until no Database is placed on it.

The admission policy refuses deleting a Shard whose `status.databaseCount` is above 0, but a status can
be written by anyone with `shards/status` access. The finalizer is the second line that does not trust
it: the Shard controller adds FINALIZER_SHARD_DATABASES to every Shard while deletion protection is on
(Shards made before it get it at their next check), and on a deleted Shard removes it only when no
Database is placed there, by the Database cache and then by a live list of the release namespace's
Databases (the cache may lag behind a placement just written). Until then the Shard stays, with its
deletionTimestamp set: condition DeletionHeld=True (reason DatabasesRemain, the count in its message)
and one warning in the log (an Event about a cluster-scoped object would have to go to the `default`
namespace, where the provider has no rights), no placements (placement skips Shards being deleted),
and its databases keep working (the checks and their SQL go on). With deletion protection off the
finalizer is not added, and a deleted Shard's is removed.

    shard = deletion.converge(name, cached)   # None: the Shard is on its way out, nothing more to do
    state = deletion.report(state)            # DeletionHeld while it is held
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from domain.constants import FINALIZER_SHARD_DATABASES, ShardConditionType, ShardReason
from domain.metadata import ListPage, ObjectMeta
from domain.objects import ShardState
from domain.resources import BY_SHARD, DATABASES, SHARDS, database_shard
from informers import Informer, Rest

log = logging.getLogger(__name__)

LIST_PAGE = 500


@dataclass
class ShardDeletion:
    """Adds, holds and removes the Shard finalizer (see the module docstring). `namespace`: the release
    namespace, where the Databases are."""

    rest: Rest
    databases: Informer
    namespace: str
    protect: bool = True  # deletionProtection.enabled
    _held: dict[str, int] = field(default_factory=dict)  # Shards held now -> the Databases still on them

    def converge(self, name: str, shard: dict[str, Any]) -> dict[str, Any] | None:
        """The Shard after the finalizer step (patched, or as given); None once the finalizer is removed
        from a deleted Shard (the apiserver then deletes it)."""
        meta = ObjectMeta.of(shard)
        has = FINALIZER_SHARD_DATABASES in meta.finalizers
        if not self.protect:  # not added; on a deleted Shard removed (protection was turned off)
            self._held.pop(name, None)
            return self._without(shard) if has and meta.deleting else shard
        if not meta.deleting:
            self._held.pop(name, None)
            return shard if has else self._patch(shard, [*meta.finalizers, FINALIZER_SHARD_DATABASES])
        if not has:
            return None  # deleted, and not ours to hold
        remaining = self._placed(name)
        if remaining:
            self._held[name] = remaining
            return shard
        self._held.pop(name, None)
        self._without(shard)
        log.info("shard deleted: no database is placed on it any more", extra={"shard": name})
        return None

    def forget(self, name: str) -> None:
        """Shard `name` is gone."""
        self._held.pop(name, None)

    def report(self, shard: ShardState) -> ShardState:
        """`shard` with condition DeletionHeld while it is held (and a warning in the log when it starts)."""
        remaining = self._held.get(shard.name)
        if remaining is None:
            return shard
        held_before = any(
            c.type == ShardConditionType.DELETION_HELD and c.status == "True" for c in shard.status.conditions
        )
        message = (
            f"deleted while {remaining} database(s) are placed on it: held by the finalizer "
            f"{FINALIZER_SHARD_DATABASES} until they are deleted (status.databaseCount is not trusted); its "
            "databases keep working, no new ones are placed here"
        )
        shard = shard.with_condition(ShardConditionType.DELETION_HELD, True, ShardReason.DATABASES_REMAIN, message)
        if not held_before:
            log.warning("shard deletion held", extra={"shard": shard.name, "databases": remaining})
        return shard

    def _placed(self, name: str) -> int:
        """Databases placed on Shard `name`: the cache's count, or when it shows none, a live list's."""
        cached = self.databases.count_by_index(BY_SHARD, name)
        if cached:
            return cached
        count, token = 0, None
        while True:
            query = [("limit", str(LIST_PAGE)), *([("continue", token)] if token else [])]
            page = ListPage.of(self.rest.list(DATABASES, self.namespace, query=query))
            count += sum(1 for db in page.items if name in database_shard(db))
            token = page.continue_token
            if not token:
                return count

    def _without(self, shard: dict[str, Any]) -> dict[str, Any] | None:
        meta = ObjectMeta.of(shard)
        return self._patch(shard, [f for f in meta.finalizers if f != FINALIZER_SHARD_DATABASES])

    def _patch(self, shard: dict[str, Any], finalizers: list[str]) -> dict[str, Any] | None:
        """The Shard with these finalizers, conditional on the version read; None if it is gone."""
        meta = ObjectMeta.of(shard)
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": meta.resource_version}}
        try:
            patched: dict[str, Any] = self.rest.patch(SHARDS, meta.name, body)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return patched
