"""The API's side of the exact quota: a create first takes a free slot in the consumer's ledger.

The rule and the ledger are domain/quota.py's. Here: reading and writing the ledger ConfigMap, and
batching. Per consumer and replica one write is in flight at a time; the requests that arrive
meanwhile are decided together in the next write (group commit), which takes a free slot for each of
them with one JSON patch that tests the slots are free. The request that wrote hands the next write to
the first request waiting for one and goes on with its create; the others of its batch go on as soon as
they are decided, never behind the next batch's write. Each replica fills the ledger from its own
random position and, when it runs into taken slots, continues in the middle of the longest free run,
so the claims of different replicas rarely meet; a claim that loses one slot reads the ledger again and
takes others. So a burst of one consumer costs a few writes per replica, the replicas do not wait for
each other, and different consumers never do. Restructuring the slots (first use, a changed
maxDatabases, freeing slots of databases that are gone, adopting databases made without the API) is a
compare-and-swap on the ConfigMap's resourceVersion. Each replica keeps the ledger as its last request
returned it, and reads it again only after a claim lost or before refusing.

    reservation = ledgers.reserve(consumer, external_id)   # QuotaExceeded (429), Unavailable (503)
    ... create the Database ...
    ledgers.release(reservation)                            # only if the apiserver refused the create

A slot no replica can have written (domain.quota.implausible) is checked against the apiserver at once
and freed unless its database exists, with a warning naming the consumer and the slot (not its value) and
`dbprovider_quota_ledger_repairs_total{reason}` (reason: future, malformed, unknown_holder; never a
consumer or externalId).

A consumer without maxDatabases has no ledger: nothing is reserved. When it gets a quota, its next
create builds the ledger from the databases the replica's cache shows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter

from api.errors import QuotaExceeded, Unavailable
from domain.constants import LABEL_CONSUMER
from domain.metadata import ListPage
from domain.naming import label_value, quota_ledger_name
from domain.objects import Obj
from domain.quota import (
    Holder,
    QuotaLedger,
    choose_free,
    claim_patch,
    counts_against_quota,
    ledger_object,
    random_cursor,
    release_patch,
    restructure,
    restructure_patch,
    stale_holders,
)
from domain.resources import DATABASES
from domain.settings import SETTINGS, QuotaTimings
from domain.specs import database_consumer_name, database_external_id
from informers import CONFIGMAPS, Rest
from informers.rest import JSON_PATCH, MERGE_PATCH

log = logging.getLogger(__name__)

LIST_PAGE = 500
DECISION_TIMEOUT = 60.0  # a safety net: every write gives up within the create deadline


@dataclass(frozen=True)
class Reservation:
    """A slot taken for one create. `slot` is None when nothing was taken: the database holds a slot
    already (a second PUT of it), or the consumer has no quota."""

    consumer: str
    external_id: str
    slot: str | None
    holder: Holder | None
    taken: float  # time.monotonic() when the slot was taken


@dataclass(eq=False)
class _Request:
    external_id: str
    woken: threading.Event = field(default_factory=threading.Event)  # decided, or handed the next write
    writes: bool = False  # this request writes the next batch (guarded by QuotaLedgers._guard)
    reservation: Reservation | None = None
    error: BaseException | None = None


@dataclass
class _Ledger:
    """What a replica knows of one consumer's ledger, and the requests waiting to be written."""

    # One write at a time: two in flight per replica are slower, the apiserver then retrying its own
    # conflicts on the one object (a ledger PATCH takes about twice as long).
    writing: bool = False  # a request of this replica is writing the ledger (guarded by QuotaLedgers._guard)
    pending: list[_Request] = field(default_factory=list)  # waiting for the next write (guarded, too)
    view: QuotaLedger | None = None  # as the last request returned it (None: read it)
    cursor: int = field(default_factory=random_cursor)  # where this replica takes the next free slot


@dataclass(eq=False)
class QuotaLedgers:
    """Reserves quota slots for creates (see the module docstring). Thread-safe; one per process.

    `limit_of(consumer)` is the consumer's maxDatabases (None: no quota; it raises to refuse the
    request, e.g. Unauthorized for a consumer that is gone); `cached_of(consumer)` its databases in
    this replica's cache by externalId. Each ledger request gets `request_timeout` as its whole timeout
    (the API's write budget: a second without an answer from the apiserver is an outage, 503).
    """

    rest: Rest
    namespace: str
    limit_of: Callable[[str], int | None]
    cached_of: Callable[[str], Mapping[str, Obj]]
    _: KW_ONLY
    clock: Callable[[], datetime]
    timings: QuotaTimings = SETTINGS.quota
    request_timeout: float = 1.0
    registry: CollectorRegistry | None = None  # where the repairs are counted (None: a registry of its own)
    _guard: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _ledgers: dict[str, _Ledger] = field(default_factory=dict, init=False, repr=False)
    # consumer -> externalId -> when this replica's cache saw its Database removed (guarded by _guard); kept
    # for the reservation timeout, after which an absent database's slot is checked anyway.
    _removed: dict[str, dict[str, datetime]] = field(default_factory=dict, init=False, repr=False)
    repairs: Counter = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.repairs = Counter(
            "dbprovider_quota_ledger_repairs",
            "Quota ledger slots freed because no replica can have written them, by reason "
            "(future, malformed, unknown_holder).",
            ["reason"],
            registry=self.registry if self.registry is not None else CollectorRegistry(),
        )

    @property
    def reservation_timeout(self) -> timedelta:
        return timedelta(seconds=self.timings.reservation_timeout)

    @property
    def clock_skew(self) -> timedelta:
        return timedelta(seconds=self.timings.clock_skew)

    # -- reserving -------------------------------------------------------------------------------

    def reserve(self, consumer: str, external_id: str) -> Reservation:
        """A slot for `external_id`, or QuotaExceeded; Unavailable if the ledger cannot be written now."""
        request = _Request(external_id)
        with self._guard:
            state = self._ledgers.setdefault(consumer, _Ledger())
            state.pending.append(request)
            if not state.writing:  # no write in flight: this request writes at once
                state.writing = request.writes = True
        if not request.writes:
            self._wait(state, request)
        if request.writes:
            self._write_next(consumer, state)
        if request.error is not None:
            raise request.error
        assert request.reservation is not None
        return request.reservation

    def _wait(self, state: _Ledger, request: _Request) -> None:
        """Until `request` is decided by another request's write, or handed the next write itself."""
        if request.woken.wait(DECISION_TIMEOUT):
            return
        with self._guard:  # a safety net: every write gives up within the create deadline
            if request.woken.is_set() or request.writes:
                return
            state.pending = [r for r in state.pending if r is not request]
        raise Unavailable("the quota could not be checked in time; try again")

    def _write_next(self, consumer: str, state: _Ledger) -> None:
        """Write for every request waiting (this one first), then hand the next write to the first request
        that arrived meanwhile: this request goes on with its create, and no decided one waits for a write."""
        with self._guard:
            batch, state.pending = state.pending, []
        try:
            self._decide(consumer, state, batch)
        finally:
            with self._guard:
                if state.pending:
                    following = state.pending[0]
                    following.writes = True
                    following.woken.set()
                else:
                    state.writing = False

    def _decide(self, consumer: str, state: _Ledger, batch: list[_Request]) -> None:
        """Take slots for `batch` (in arrival order) and give each request its answer."""
        try:
            granted, refused = self._claim(consumer, state, [r.external_id for r in batch])
        except Exception as exc:  # noqa: BLE001 - every request of the batch gets the same answer
            for request in batch:
                request.error = exc
                request.woken.set()
            return
        taken = time.monotonic()
        for request in batch:
            slot, holder = granted.get(request.external_id, (None, None))
            if request.external_id in refused:
                request.error = QuotaExceeded(
                    f"the quota of {refused[request.external_id]} databases is reached; "
                    "delete one or ask for a higher quota"
                )
            else:
                request.reservation = Reservation(consumer, request.external_id, slot, holder, taken)
                granted.pop(request.external_id, None)  # a second request for it takes no slot of its own
            request.woken.set()

    def _claim(
        self, consumer: str, state: _Ledger, requested: list[str]
    ) -> tuple[dict[str, tuple[str, Holder]], dict[str, int]]:
        """(externalId -> slot taken for it, externalId -> the limit it was refused at); an externalId that
        holds a slot already, or a consumer without a quota, gets neither (granted without a slot)."""
        limit = self.limit_of(consumer)
        if limit is None:
            return {}, {}
        deadline = time.monotonic() + self.timings.create_deadline  # the waiting requests' patience, not only attempts
        for _ in range(self.timings.write_attempts):
            if time.monotonic() > deadline:
                break
            ledger, fresh = state.view, False
            if ledger is None:
                ledger, fresh = self._read(consumer, state), True
            if self._restructure(consumer, ledger, limit, state):
                continue
            held = ledger.held()
            new = list(dict.fromkeys(ext for ext in requested if ext not in held))
            slots, state.cursor = choose_free(ledger, len(new), state.cursor)
            if len(slots) < len(new) and not fresh:  # too few free slots in an old view: read it again
                state.view = None
                continue
            now = self.clock()
            claims = {slot: Holder(ext, now) for slot, ext in zip(slots, new, strict=False)}
            try:
                if claims:
                    self._remember(consumer, state, self._patch(consumer, claim_patch(claims), JSON_PATCH))
            except ApiException as exc:
                if exc.status not in (404, 409, 422):  # 422: a slot was taken (or removed) meanwhile
                    raise
                state.view = None
                continue
            refused = {ext: limit for ext in new[len(slots) :]}
            if refused:
                log.info(
                    "consumer %s: quota of %d databases reached; refused %d create(s)", consumer, limit, len(refused)
                )
            return {h.external_id: (slot, h) for slot, h in claims.items()}, refused
        raise Unavailable("too many concurrent creates for this consumer; try again")

    def check_deadline(self, reservation: Reservation) -> None:
        """Unavailable (and the slot given back) if the create would be sent too late after the reservation."""
        if time.monotonic() - reservation.taken <= self.timings.create_deadline:
            return
        self.release(reservation)
        raise Unavailable("the request took too long; try again")

    def release(self, reservation: Reservation) -> None:
        """Give a slot back after the apiserver refused its create (best effort: the timeout frees it too)."""
        if reservation.slot is None or reservation.holder is None:
            return
        with self._guard:
            state = self._ledgers.setdefault(reservation.consumer, _Ledger())
        try:
            patch = release_patch(reservation.slot, reservation.holder)
            self._remember(reservation.consumer, state, self._patch(reservation.consumer, patch, JSON_PATCH))
        except ApiException as exc:
            if exc.status not in (404, 422):  # 422: the test failed, the slot is no longer ours
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

    def removed(self, consumer: str, external_id: str) -> None:
        """The cache saw the Database of `external_id` removed (dropped): its slot is checked against the
        apiserver at the consumer's next create and freed if it is gone, not only after the reservation
        timeout. A slot taken after the removal (a new create under that externalId) is left alone."""
        now = self.clock()
        with self._guard:
            entries = self._removed.setdefault(consumer, {})
            entries[external_id] = now
            for old in [ext for ext, at in entries.items() if now - at > self.reservation_timeout]:
                del entries[old]

    def _removed_of(self, consumer: str) -> dict[str, datetime]:
        with self._guard:
            return dict(self._removed.get(consumer, {}))

    # -- the ledger ------------------------------------------------------------------------------

    def _read(self, consumer: str, state: _Ledger) -> QuotaLedger:
        try:
            obj = self.rest.get(CONFIGMAPS, quota_ledger_name(consumer), self.namespace, timeout=self.request_timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise
            obj = None
        ledger = QuotaLedger.parse(consumer, obj)
        state.view = ledger
        return ledger

    def _remember(self, consumer: str, state: _Ledger, obj: Obj) -> None:
        """Keep the ledger a write returned, unless a newer one is known already."""
        ledger = QuotaLedger.parse(consumer, obj)
        known = state.view
        if known is None or _newer(ledger.resource_version, known.resource_version):
            state.view = ledger

    def _patch(self, consumer: str, patch: Any, content_type: str) -> Obj:
        return self.rest.patch(
            CONFIGMAPS,
            quota_ledger_name(consumer),
            patch,
            self.namespace,
            content_type=content_type,
            timeout=self.request_timeout,
        )

    def _restructure(self, consumer: str, ledger: QuotaLedger, limit: int, state: _Ledger) -> bool:
        """Change the slots if they must (see domain/quota.py); True if the ledger was written or must be
        read again (then the caller starts over)."""
        cached = self.cached_of(consumer)
        now = self.clock()
        removed = self._removed_of(consumer)
        stale = stale_holders(ledger, cached, now, self.reservation_timeout, self.clock_skew, removed)
        gone = set(stale.free)
        if stale.check:
            gone |= self._gone(consumer, stale.check)
        counted = [key for key, db in cached.items() if counts_against_quota(db)]
        data = restructure(ledger, counted, gone, limit, now)
        if data is None:
            return False
        try:
            if not ledger.exists:
                body = ledger_object(self.namespace, consumer, data)
                written = self.rest.create(CONFIGMAPS, body, self.namespace, timeout=self.request_timeout)
            else:
                written = self._patch(consumer, restructure_patch(ledger, data), MERGE_PATCH)
        except ApiException as exc:
            state.view = None  # someone else wrote (or removed) it in between: read again
            if exc.status in (404, 409):
                return True
            if exc.status in (413, 422):
                log.error(
                    "consumer %s: the quota ledger %s cannot grow (HTTP %s): ConfigMaps hold at most "
                    "1 MiB, about 10,000 databases",
                    consumer,
                    quota_ledger_name(consumer),
                    exc.status,
                )
            raise
        self._remember(consumer, state, written)
        held = ledger.held()
        for external_id in sorted(gone):
            if reason := stale.implausible.get(external_id):
                log.warning(
                    "consumer %s: freed quota ledger slot %s, which held an entry no replica can have written (%s)",
                    consumer,
                    held[external_id][0],
                    reason,
                )
                self.repairs.labels(reason).inc()
        if gone:
            log.info("consumer %s: freed %d quota slot(s) of databases that are gone", consumer, len(gone))
        return True

    def _gone(self, consumer: str, external_ids: Iterable[str]) -> set[str]:
        """The `external_ids` whose database the apiserver has not (or has as Deleted): one paged LIST."""
        alive: set[str] = set()
        query = [("labelSelector", f"{LABEL_CONSUMER}={label_value(consumer)}"), ("limit", str(LIST_PAGE))]
        token = None
        while True:
            answer = self.rest.list(
                DATABASES,
                self.namespace,
                query=query + ([("continue", token)] if token else []),
                timeout=self.request_timeout,
            )
            page = ListPage.of(answer)
            for db in page.items:
                external_id = database_external_id(db)
                if external_id and database_consumer_name(db) == consumer and counts_against_quota(db):
                    alive.add(external_id)
            token = page.continue_token
            if not token:
                break
        return set(external_ids) - alive


def _newer(candidate: str | None, known: str | None) -> bool:
    """Whether resourceVersion `candidate` is newer than `known` (etcd revisions; unknown: take it)."""
    if candidate is None or known is None or not candidate.isdigit() or not known.isdigit():
        return True
    return int(candidate) > int(known)
