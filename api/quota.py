"""The API's side of the exact quota: a slot is reserved in the consumer's ledger before each create.

The rule and the ledger are domain/quota.py's. Here: reading and writing the ledger ConfigMap with a
compare-and-swap on its resourceVersion, and batching. Per consumer and replica one thread at a time
writes the ledger; the requests that arrive while it writes are decided together in the next write
(group commit), so a burst of one consumer costs a few ledger writes instead of one per request,
the creates themselves run in parallel, and different consumers never wait for each other.

    reservation = ledgers.reserve(consumer, external_id)   # QuotaExceeded (429), Unavailable (503)
    ... create the Database ...
    ledgers.release(reservation)                            # only if the apiserver refused the create
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException

from api.errors import QuotaExceeded, Unavailable
from api.kube import DATABASES, metadata
from domain.constants import LABEL_CONSUMER
from domain.naming import label_value, quota_ledger_name
from domain.quota import (
    Decision,
    QuotaLedger,
    counts_against_quota,
    decide,
    ledger_patch,
    new_ledger_object,
    release_patch,
    stale_keys,
)
from domain.settings import SETTINGS
from domain.specs import database_consumer_name, database_external_id
from informers import CONFIGMAPS, Rest
from informers.rest import JSON_PATCH

log = logging.getLogger(__name__)

Obj = dict[str, Any]
LIST_PAGE = 500


@dataclass(frozen=True)
class Reservation:
    """A slot granted to one create. `reserved_at` is None when the database was counted already (a
    second PUT of it): then there is nothing of ours to give back."""

    consumer: str
    external_id: str
    reserved_at: datetime | None
    written: float  # time.monotonic() of the ledger write that granted it


@dataclass
class _Request:
    external_id: str
    decided: bool = False
    reservation: Reservation | None = None
    error: BaseException | None = None


@dataclass
class _ConsumerQueue:
    writer: threading.Lock = field(default_factory=threading.Lock)  # one ledger writer per consumer
    pending: list[_Request] = field(default_factory=list)  # guarded by QuotaLedgers._guard


class QuotaLedgers:
    """Reserves quota slots for creates (see the module docstring). Thread-safe; one per process.

    `limit_of(consumer)` is the consumer's maxDatabases (None: no quota; it raises to refuse the
    request, e.g. Unauthorized for a consumer that is gone); `cached_of(consumer)` its databases in
    this replica's cache by externalId.
    """

    def __init__(
        self,
        rest: Rest,
        namespace: str,
        limit_of: Callable[[str], int | None],
        cached_of: Callable[[str], Mapping[str, Obj]],
        *,
        clock: Callable[[], datetime],
        reservation_timeout: float = SETTINGS.quota.reservation_timeout,
        create_deadline: float = SETTINGS.quota.create_deadline,
        write_attempts: int = SETTINGS.quota.write_attempts,
        write_timeout: tuple[float, float] = (2.0, 5.0),
    ) -> None:
        self.rest = rest
        self.namespace = namespace
        self.limit_of = limit_of
        self.cached_of = cached_of
        self.clock = clock
        self.reservation_timeout = timedelta(seconds=reservation_timeout)
        self.create_deadline = create_deadline
        self.write_attempts = write_attempts
        self.write_timeout = write_timeout
        self._guard = threading.Lock()
        self._queues: dict[str, _ConsumerQueue] = {}

    # -- reserving -------------------------------------------------------------------------------

    def reserve(self, consumer: str, external_id: str) -> Reservation:
        """A slot for `external_id`, or QuotaExceeded; Unavailable if the ledger cannot be written now."""
        request = _Request(external_id)
        with self._guard:
            queue = self._queues.setdefault(consumer, _ConsumerQueue())
            queue.pending.append(request)
        with queue.writer:
            if not request.decided:  # nobody took it into a write yet: this thread writes for everyone waiting
                with self._guard:
                    batch, queue.pending = queue.pending, []
                self._decide_batch(consumer, batch)
        if request.error is not None:
            raise request.error
        assert request.reservation is not None
        return request.reservation

    def check_deadline(self, reservation: Reservation) -> None:
        """Unavailable (and the slot given back) if the create would be sent too late after the reservation."""
        if time.monotonic() - reservation.written <= self.create_deadline:
            return
        self.release(reservation)
        raise Unavailable("the request took too long; try again")

    def release(self, reservation: Reservation) -> None:
        """Give a slot back after the apiserver refused its create (best effort: the timeout frees it too)."""
        if reservation.reserved_at is None:
            return
        name = quota_ledger_name(reservation.consumer)
        patch = release_patch(reservation.external_id, reservation.reserved_at)
        try:
            self.rest.patch(
                CONFIGMAPS, name, patch, self.namespace, content_type=JSON_PATCH, timeout=self.write_timeout
            )
        except ApiException as exc:
            if exc.status not in (404, 422):  # 422: the test op failed, the slot is no longer ours
                log.warning(
                    "consumer %s: could not give back the quota slot of %s (HTTP %s); it is freed within %.0f s",
                    reservation.consumer,
                    reservation.external_id,
                    exc.status,
                    self.reservation_timeout.total_seconds(),
                )
        except Exception as exc:  # noqa: BLE001 - any transport error: the timeout frees the slot
            log.warning(
                "consumer %s: could not give back the quota slot of %s (%s)",
                reservation.consumer,
                reservation.external_id,
                type(exc).__name__,
            )

    # -- the ledger write ------------------------------------------------------------------------

    def _decide_batch(self, consumer: str, batch: list[_Request]) -> None:
        try:
            decision, reserved_at = self._write(consumer, [r.external_id for r in batch])
        except Exception as exc:  # noqa: BLE001 - every request of the batch gets the same answer
            for request in batch:
                request.error, request.decided = exc, True
            return
        written = time.monotonic()
        reserved: set[str] = set()
        for request in batch:
            if request.external_id in decision.granted:
                ours = request.external_id in decision.reserve and request.external_id not in reserved
                reserved.add(request.external_id)
                at = reserved_at if ours else None
                request.reservation = Reservation(consumer, request.external_id, at, written)
            else:
                request.error = QuotaExceeded()
            request.decided = True
        if decision.refused:
            log.info(
                "consumer %s: quota reached (%d counted); refused %d create(s)",
                consumer,
                decision.counted,
                len(decision.refused),
            )

    def _write(self, consumer: str, requested: list[str]) -> tuple[Decision, datetime]:
        """One compare-and-swap of the consumer's ledger deciding `requested`, retried on conflicts."""
        limit = self.limit_of(consumer)
        deadline = time.monotonic() + self.create_deadline  # the waiting requests' patience, not only attempts
        for _ in range(self.write_attempts):
            if time.monotonic() > deadline:
                break
            ledger = QuotaLedger.parse(consumer, self._get(consumer))
            cached = self.cached_of(consumer)
            now = self.clock()
            prune, check = stale_keys(ledger, cached, now, self.reservation_timeout)
            if check:
                prune |= self._gone(consumer, check)
            counted = [key for key, db in cached.items() if counts_against_quota(db)]
            decision = decide(ledger, counted, prune, requested, limit)
            if not decision.reserve and not decision.prune:
                return decision, now
            try:
                if ledger.resource_version is None:
                    body = new_ledger_object(self.namespace, consumer, decision.reserve, now)
                    self.rest.create(CONFIGMAPS, body, self.namespace, timeout=self.write_timeout)
                else:
                    patch = ledger_patch(ledger, decision, now)
                    self.rest.patch(
                        CONFIGMAPS, quota_ledger_name(consumer), patch, self.namespace, timeout=self.write_timeout
                    )
            except ApiException as exc:
                if exc.status in (404, 409):  # another replica wrote (or removed) it in between: read again
                    continue
                if exc.status in (413, 422):
                    log.error("consumer %s: the quota ledger %s cannot grow (HTTP %s): ConfigMaps hold at most "
                              "1 MiB, about 10,000 databases", consumer, quota_ledger_name(consumer), exc.status)
                raise
            if decision.prune:
                log.info(
                    "consumer %s: freed %d quota slot(s) of databases that are gone", consumer, len(decision.prune)
                )
            return decision, now
        raise Unavailable("too many concurrent creates for this consumer; try again")

    def _get(self, consumer: str) -> Obj | None:
        try:
            return self.rest.get(CONFIGMAPS, quota_ledger_name(consumer), self.namespace, timeout=self.write_timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _gone(self, consumer: str, keys: Iterable[str]) -> set[str]:
        """The `keys` whose database the apiserver has not (or has as Deleted): one paged LIST."""
        alive: set[str] = set()
        query = [("labelSelector", f"{LABEL_CONSUMER}={label_value(consumer)}"), ("limit", str(LIST_PAGE))]
        token = None
        while True:
            page = self.rest.list(
                DATABASES,
                self.namespace,
                query=query + ([("continue", token)] if token else []),
                timeout=self.write_timeout,
            )
            for db in page.get("items") or ():
                external_id = database_external_id(db)
                if external_id and database_consumer_name(db) == consumer and counts_against_quota(db):
                    alive.add(external_id)
            token = metadata(page).get("continue")
            if not token:
                break
        return set(keys) - alive
