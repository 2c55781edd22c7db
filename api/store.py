"""The consumer's databases: reads from the shared informer caches, writes to the apiserver.

Identity: a consumer's database is found by its object name `database_object_name(consumer, externalId)`
and accepted only if `spec.consumer` and `spec.externalId` match too, so another consumer's database is
exactly as invisible as a missing one.

Reads come from the cache. A miss falls back to one GET (another replica may have created the object an
instant ago), so a 404 is authoritative. This replica's own writes are read back until the cache shows
them (a create, a delete or rotate request): a PUT right after a DELETE answers 409, never 200.
Writes (create, annotations) go to the apiserver; annotation writes carry the resourceVersion they were
decided on and are retried on a conflict.

Availability: writes need the apiserver. When `reachable()` (the replica's recent apiserver contact)
says it is gone, a write answers 503 at once. Before that is known (the first seconds of an outage),
all the apiserver requests of one write share one budget (`request_budget`, 1 s): each gets the time
left as its whole timeout (connect, TLS, answer), on a client that never retries behind our back
(`Rest.without_retries`), so a write answers 503 within a second of the apiserver going silent, and
no DELETE hangs. A read that misses the cache (a database another replica created an instant ago,
credentials the cache lags) asks the apiserver within `read_budget` (5 s): reads are served from the
cache even while the apiserver is gone, so only those rare fallbacks wait, and a slow but working
apiserver does not turn them into errors. The Secrets cache holds no Secret's data (domain.cached): the
credentials route reads the credentials Secret from the apiserver within that budget, and keeps the last
SECRETS_HELD read while the cache shows the same version of them (a repeated fetch needs no request). A
create whose answer timed out may still have been committed: PUT is idempotent, so the client's retry
returns the object (200).

Quota: `Consumer.spec.maxDatabases` bounds the consumer's databases that are not yet Deleted (Deleting
ones count). Each create first reserves a slot in the consumer's ledger on the apiserver
(`api.quota_ledgers.QuotaLedgers`, rules in domain/quota.py), so the count is exact across replicas; a
create the apiserver refuses gives its slot back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from api.errors import (
    KUBE_API_SLOW,
    CredentialsUnavailable,
    DatabaseDeleting,
    DatabaseGone,
    NotFound,
    NotReady,
    QuotaExceeded,
    Unauthorized,
    Unavailable,
    UndeleteNotAllowed,
)
from api.models import CreateDatabase, Credentials, is_delete_requested, is_ready, read_database
from api.quota_ledgers import QuotaLedgers
from domain.conditions import condition_is_true
from domain.config import InstallConfig
from domain.constants import (
    ANNOTATION_DELETE_REQUESTED_AT,
    ANNOTATION_ROTATE_END_SESSIONS,
    ANNOTATION_ROTATE_OVERLAP,
    ANNOTATION_ROTATE_REQUESTED_AT,
    API_VERSION,
    CREDENTIALS_SECRET_SELECTOR,
    FINALIZER_TENANT,
    KIND_DATABASE,
    LABEL_CONSUMER,
    LABEL_EXTERNAL_ID,
    DatabaseConditionType,
    Phase,
)
from domain.credentials import (
    credentials_version,
    decode_secret_data,
    endpoint_problem,
    is_controlled_by,
    missing_key,
    names_tenant,
    password_pending,
)
from domain.metadata import object_name
from domain.naming import credentials_secret_name, database_object_name, label_value, validate_external_id
from domain.objects import DatabaseObject, Obj
from domain.quota import counts_against_quota
from domain.resources import BY_CONSUMER, CONSUMERS, DATABASES, database_consumer
from domain.settings import SETTINGS, QuotaTimings
from domain.specs import DatabaseSpec, database_consumer_name, database_external_id, parse_consumer
from domain.timefmt import format_micro_time, parse_time
from informers import SECRETS, Informer, Resource, Rest, SharedInformers
from informers.informer import resource_version_of

log = logging.getLogger(__name__)

PENDING_TTL_SECONDS = 300.0
# How long this replica's own annotation write (a delete or rotate request) is shown in place of a cache
# that does not show it yet: the watch event normally comes within milliseconds; the bound only matters
# if the cache skipped that version (a relist), when a later one is there already.
WRITTEN_TTL_SECONDS = 10.0
ANNOTATE_ATTEMPTS = 5
PASSWORD_PENDING = "a new password is pending"  # a _read_credentials problem that is not a fault
# Seconds all the apiserver requests of one write may take together: a healthy apiserver answers a
# create or a patch in milliseconds, so a second without an answer is an outage (503).
REQUEST_BUDGET = 1.0
# Seconds of a read's live fallback (a cache miss): as before this budget, a slow answer is still one.
READ_BUDGET = 5.0
# An undelete is refused from this long before dropAfter on: the leader drops the tenant at dropAfter from
# its cache, and the removed annotation must reach that cache first (a watch event takes milliseconds).
UNDELETE_CUTOFF = timedelta(seconds=30)
# Credentials Secrets read for the API kept in memory (the most recently fetched; the cache holds no data).
SECRETS_HELD = 1024

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


def _written(obj: Obj) -> DatabaseObject:
    """A Database the apiserver just wrote for the consumer, parsed (its spec is ours, and immutable)."""
    db = read_database(obj)
    if db is None:
        raise ValueError("the apiserver answered a write with a Database whose spec does not validate")
    return db


@dataclass(frozen=True)
class _Budget:
    """The end (monotonic) of one consumer request's apiserver time; `left()` is a request's timeout."""

    end: float

    def left(self) -> float:
        remaining = self.end - time.monotonic()
        if remaining <= 0:
            raise Unavailable(KUBE_API_SLOW)
        return remaining


@dataclass
class _Pending:
    """A Database this replica created that the cache may not show yet."""

    obj: Obj
    since: float


class DatabaseStore:
    """See the module docstring. Thread-safe; one instance per process."""

    def __init__(
        self,
        config: InstallConfig,
        databases: Informer,
        consumers: Informer,
        secrets: Informer,
        rest: Rest,
        *,
        clock: Clock = utcnow,
        pending_ttl: float = PENDING_TTL_SECONDS,
        reachable: Callable[[], bool] | None = None,
        request_budget: float = REQUEST_BUDGET,
        read_budget: float = READ_BUDGET,
        quota_timings: QuotaTimings = SETTINGS.quota,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.namespace = config.namespace
        self.databases = databases
        self.consumers = consumers
        self.secrets = secrets
        self.rest = rest
        self.clock = clock
        self.pending_ttl = pending_ttl
        self.reachable = reachable
        self.request_budget = request_budget
        self.read_budget = read_budget
        self._pending_lock = threading.Lock()
        self._pending: dict[str, dict[str, _Pending]] = {}  # consumer -> object name -> pending create
        # object name -> this replica's last annotation write, until the cache shows it: a PUT right after
        # this replica's DELETE answers 409 database_deleting, not 200 from a cache a few ms behind.
        self._own_writes: dict[str, _Pending] = {}
        self._held_secrets: OrderedDict[str, Obj] = OrderedDict()  # Secret name -> as last read (with its data)
        self.quota = QuotaLedgers(
            rest,
            self.namespace,
            self._limit_of,
            self._cached_by_external_id,
            clock=clock,
            timings=quota_timings,
            request_timeout=request_budget,  # each ledger request, as each of a write's: a silent apiserver is 503
            registry=registry,
        )
        # domain.resources: the index the Consumer controller reads too (one index on the shared informer)
        databases.add_index(BY_CONSUMER, database_consumer)
        databases.add_handler(self._on_database, replay=False)

    @classmethod
    def register(cls, config: InstallConfig, informers: SharedInformers, **kwargs: Any) -> DatabaseStore:
        """Create the store on the shared informers: Databases and Secrets (release namespace), Consumers."""
        return cls(
            config,
            informers.informer(DATABASES, config.namespace),
            informers.informer(CONSUMERS),
            informers.informer(SECRETS, config.namespace, label_selector=CREDENTIALS_SECRET_SELECTOR),
            informers.rest.without_retries(),
            **kwargs,
        )

    def ready(self) -> bool:
        """The caches are synced and the apiserver answers (else /readyz is 503)."""
        synced = self.databases.has_synced() and self.consumers.has_synced() and self.secrets.has_synced()
        return synced and (self.reachable is None or self.reachable())

    def _require_apiserver(self) -> None:
        """503 at once (no hung request) while this replica has lost touch with the apiserver."""
        if self.reachable is not None and not self.reachable():
            raise Unavailable("the Kubernetes API is unreachable; try again")

    # -- reads -----------------------------------------------------------------------------------

    def get(self, consumer: str, external_id: str) -> DatabaseObject:
        """The consumer's database, or NotFound (also for another consumer's database)."""
        name = self._object_name(consumer, external_id)
        obj = self._cached(consumer, name)
        if obj is None:
            obj = self._get_live(name, self._budget(self.read_budget))
        db = self._mine(obj, consumer, external_id)
        if db is None:
            raise NotFound()
        return db

    def list(self, consumer: str) -> list[DatabaseObject]:
        """The consumer's databases, ordered by externalId: each object parsed once."""
        parsed = (read_database(obj) for obj in self.databases.by_index(BY_CONSUMER, consumer))
        found = {db.name: db for db in parsed if db is not None}
        for name, pending in self._pending_of(consumer).items():
            if name not in found and (db := read_database(pending.obj)) is not None:
                found[name] = db
        mine = [db for db in found.values() if db.spec.consumer == consumer]
        return sorted(mine, key=lambda db: db.spec.external_id)

    def credentials_version(self, db: DatabaseObject) -> str | None:
        """The version of the credentials a Ready database hands out (None before, or without its Secret):
        from the cached Secret and status, so a consumer can tell without fetching that they changed."""
        if not is_ready(db):
            return None
        secret = self.secrets.get(f"{self.namespace}/{credentials_secret_name(db.name)}")
        if secret is None or not is_controlled_by(secret, db.metadata.uid):
            return None
        return credentials_version(secret, db.status.password_applied)

    def credentials(self, consumer: str, external_id: str) -> Credentials:
        """The connection details of a Ready database; NotReady before, CredentialsUnavailable if unusable."""
        db = self.get(consumer, external_id)
        if not is_ready(db):
            raise NotReady()
        name = credentials_secret_name(db.name)
        budget = self._budget(self.read_budget)
        secret, live = self._credentials_secret(name, budget)
        credentials, problem = self._read_credentials(secret, db)
        if problem is not None:  # the caches may lag writes of the reconciler: ask the apiserver once
            db = self._mine(self._get_live(db.name, budget), consumer, external_id) or db
            if not live:
                secret = self._get_live(name, budget, SECRETS)
            credentials, problem = self._read_credentials(secret, db)
        if problem == PASSWORD_PENDING:
            raise CredentialsUnavailable("a new password is being set; retry in a few seconds")
        if problem is not None or credentials is None:
            log.warning("credentials of database %s unavailable: %s", db.name, problem)
            raise CredentialsUnavailable()
        return credentials

    # -- writes ----------------------------------------------------------------------------------

    def ensure(self, consumer: str, external_id: str, request: CreateDatabase) -> tuple[DatabaseObject, bool]:
        """Create the database (True) or return the existing one (False; the request is not applied)."""
        name = self._object_name(consumer, external_id)
        existing = self._cached(consumer, name)
        if existing is not None:
            return self._existing(existing, name, consumer, external_id), False
        self.config.resolve_connection_limit(request.size_class)  # UnknownSizeClass -> 400
        self._require_apiserver()
        reservation = self.quota.reserve(consumer, external_id)  # QuotaExceeded -> 429
        existing = self._cached(consumer, name)  # created meanwhile by another request of this replica
        if existing is not None:
            return self._existing(existing, name, consumer, external_id), False
        self.quota.check_deadline(reservation)
        budget = self._budget()
        try:
            created = self.rest.create(
                DATABASES, self._new_object(name, consumer, external_id, request), timeout=budget.left()
            )
        except ApiException as exc:
            if exc.status != 409:
                if 400 <= exc.status < 500:  # refused, so not created: the slot goes back at once
                    self.quota.release(reservation)
                raise  # a 5xx may still have been committed: the slot stays until the timeout checks
            live = self._get_live(name, budget)  # created meanwhile (another request or replica): the existing one
            if live is None:
                raise Unavailable("the database is being replaced; try again") from None
            return self._existing(live, name, consumer, external_id), False
        with self._pending_lock:
            self._pending.setdefault(consumer, {})[name] = _Pending(created, time.monotonic())
        log.info("consumer %s created database %s", consumer, name)
        return _written(created), True

    def request_deletion(self, consumer: str, external_id: str) -> DatabaseObject:
        """Set the delete annotation (with the request time) unless set; never deletes the object."""

        def decide(db: DatabaseObject) -> dict[str, str | None] | None:
            if ANNOTATION_DELETE_REQUESTED_AT in db.metadata.annotations:
                return None
            return {ANNOTATION_DELETE_REQUESTED_AT: format_micro_time(self.clock())}

        return self._annotate(consumer, external_id, decide)

    def request_rotation(
        self, consumer: str, external_id: str, end_sessions: bool = False, overlap_seconds: int = 0
    ) -> DatabaseObject:
        """Set the rotate annotation to the request time (a new value asks the reconciler for a new password).

        `end_sessions` also asks the reconciler to end the sessions opened with the old password,
        by naming the same request time in the end-sessions annotation. `overlap_seconds` (above 0)
        asks for the new password on the tenant's other login role, the previous one working that long.
        """

        def decide(db: DatabaseObject) -> dict[str, str | None] | None:
            if not is_ready(db):
                raise NotReady()
            moment = self.clock()
            value = format_micro_time(moment)
            if value == db.metadata.annotations.get(ANNOTATION_ROTATE_REQUESTED_AT):  # same microsecond: still new
                value = format_micro_time(moment + timedelta(microseconds=1))
            end = value if end_sessions else None  # None removes a flag left by an earlier request
            overlap = str(overlap_seconds) if overlap_seconds > 0 and not end_sessions else None
            return {
                ANNOTATION_ROTATE_REQUESTED_AT: value,
                ANNOTATION_ROTATE_END_SESSIONS: end,
                ANNOTATION_ROTATE_OVERLAP: overlap,
            }

        return self._annotate(consumer, external_id, decide)

    def request_undelete(self, consumer: str, external_id: str) -> DatabaseObject:
        """Remove the delete annotation of a soft-deleted database within its retention window, so the
        reconciler re-enables the same tenant (same role, password and data); idempotent.

        Refused: UndeleteNotAllowed unless softDelete.allowUndelete; NotFound once the object is gone;
        DatabaseGone once it is dropped, being removed, or within UNDELETE_CUTOFF of dropAfter; QuotaExceeded
        if the consumer's other counted databases already fill maxDatabases (a lowered quota): a soft-deleted
        database keeps its quota slot, so within the quota an undelete needs no new one.
        """
        self._object_name(consumer, external_id)  # InvalidExternalId -> 400 before anything else
        if not self.config.soft_delete.allow_undelete:
            raise UndeleteNotAllowed()

        def decide(db: DatabaseObject) -> dict[str, str | None] | None:
            gone = db.status.phase == Phase.DELETED or condition_is_true(
                db.status.conditions, DatabaseConditionType.TENANT_DROPPED
            )
            if gone or db.metadata.deleting:
                raise DatabaseGone()
            requested = db.metadata.annotations.get(ANNOTATION_DELETE_REQUESTED_AT)
            if requested is None:
                return None  # not being deleted, or already brought back: nothing to undo
            now = self.clock()
            drop_after = db.status.drop_after or (parse_time(requested) or now) + self.config.soft_delete.retention
            if now >= drop_after - UNDELETE_CUTOFF:
                raise DatabaseGone()
            self._check_quota_for_undelete(consumer, external_id)
            return {ANNOTATION_DELETE_REQUESTED_AT: None}

        return self._annotate(consumer, external_id, decide)

    def _check_quota_for_undelete(self, consumer: str, external_id: str) -> None:
        """QuotaExceeded if the consumer's other databases (Deleting ones count) already fill maxDatabases.

        No ledger write: the database keeps its slot while it is deleted and a concurrent create can only
        take a free one, so an undelete never brings the count past maxDatabases on any replica."""
        limit = self._limit_of(consumer)
        if limit is None:
            return
        others = sum(
            1
            for other_id, obj in self._cached_by_external_id(consumer).items()
            if other_id != external_id and counts_against_quota(obj)
        )
        if others >= limit:
            raise QuotaExceeded(
                f"the quota of {limit} databases is reached; delete one or ask for a higher quota before undeleting"
            )

    # -- helpers ---------------------------------------------------------------------------------

    def _object_name(self, consumer: str, external_id: str) -> str:
        validate_external_id(external_id)  # InvalidExternalId -> 400
        return database_object_name(consumer, external_id)

    @staticmethod
    def _mine(obj: Obj | None, consumer: str, external_id: str) -> DatabaseObject | None:
        """The object parsed, if it is the consumer's database (its spec validates and names both)."""
        db = read_database(obj) if obj is not None else None
        if db is None or db.spec.consumer != consumer or db.spec.external_id != external_id:
            return None
        return db

    def _cached(self, consumer: str, name: str) -> Obj | None:
        obj = self.databases.get(f"{self.namespace}/{name}")
        own = self._own_write_after(name, obj)
        if own is not None:
            return own
        if obj is not None:
            return obj
        pending = self._pending_of(consumer).get(name)
        return pending.obj if pending is not None else None

    def _budget(self, seconds: float | None = None) -> _Budget:
        """The deadline of one consumer request's apiserver requests (a write's by default)."""
        return _Budget(time.monotonic() + (self.request_budget if seconds is None else seconds))

    def _get_live(self, name: str, budget: _Budget, resource: Resource = DATABASES) -> Obj | None:
        """The object from the apiserver now (a Database unless said otherwise); None if there is none."""
        try:
            return self.rest.get(resource, name, self.namespace, timeout=budget.left())
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _existing(self, obj: Obj, name: str, consumer: str, external_id: str) -> DatabaseObject:
        """The object at the database's name, parsed: the consumer's own (else 503), not going away (else 409)."""
        db = self._mine(obj, consumer, external_id)
        if db is None:
            # Only a hand-made object can take the name of another consumer's database.
            log.error("Database %s exists but does not belong to consumer %s", name, consumer)
            raise Unavailable("this database cannot be created; contact the provider's operators")
        if is_delete_requested(db):
            raise DatabaseDeleting()
        return db

    def _new_object(self, name: str, consumer: str, external_id: str, request: CreateDatabase) -> Obj:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND_DATABASE,
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {LABEL_CONSUMER: label_value(consumer), LABEL_EXTERNAL_ID: label_value(external_id)},
                # Held from birth (a kubectl delete right after the PUT is a DeletionHeld too), and
                # the controller does not need a write of its own to add it.
                "finalizers": [FINALIZER_TENANT],
            },
            "spec": DatabaseSpec(
                consumer=consumer, external_id=external_id, size_class=request.size_class, engine=request.engine
            ).model_dump(by_alias=True, mode="json"),
        }

    def _limit_of(self, consumer: str) -> int | None:
        """The consumer's maxDatabases (None: no quota); Unauthorized if it is gone or invalid."""
        obj = self.consumers.get(consumer)
        if obj is None:
            raise Unauthorized()
        try:
            return parse_consumer(obj).max_databases
        except ValidationError:
            raise Unauthorized() from None

    def _cached_by_external_id(self, consumer: str) -> dict[str, Obj]:
        """The consumer's databases in this replica's cache, by externalId (what the quota counts besides
        its ledger)."""
        found = {}
        for db in self.databases.by_index(BY_CONSUMER, consumer):
            external_id = database_external_id(db)
            if external_id is not None:
                found[external_id] = db
        return found

    def _pending_of(self, consumer: str) -> dict[str, _Pending]:
        """This replica's creates for `consumer` the cache has not shown yet (expired ones dropped)."""
        deadline = time.monotonic() - self.pending_ttl
        with self._pending_lock:
            entries = self._pending.get(consumer)
            if not entries:
                return {}
            for name in [n for n, p in entries.items() if p.since < deadline or self._in_cache(n)]:
                del entries[name]
            if not entries:
                del self._pending[consumer]
                return {}
            return dict(entries)

    def _own_write_after(self, name: str, cached: Obj | None) -> Obj | None:
        """This replica's last annotation write of `name` while the cache does not show it yet, else None."""
        with self._pending_lock:
            entry = self._own_writes.get(name)
            if entry is None:
                return None
            shown = cached is not None and self._same_version(cached, entry.obj)
            if shown or entry.since < time.monotonic() - WRITTEN_TTL_SECONDS:
                del self._own_writes[name]
                return None
            return entry.obj

    def _in_cache(self, name: str) -> bool:
        return self.databases.get(f"{self.namespace}/{name}") is not None

    def _on_database(self, event_type: str, old: Obj | None, new: Obj | None) -> None:
        """The cache has seen the object: it no longer needs to be counted as pending."""
        obj = new if new is not None else old
        if obj is None:
            return
        consumer, name = database_consumer_name(obj), object_name(obj)
        with self._pending_lock:
            own = self._own_writes.get(name or "")
            if own is not None and (new is None or self._same_version(new, own.obj)):
                del self._own_writes[name or ""]
        if consumer is None:
            return
        external_id = database_external_id(obj)
        if new is None and external_id is not None:
            self.quota.removed(consumer, external_id)
        with self._pending_lock:
            entries = self._pending.get(consumer)
            if entries and name in entries:
                del entries[name]
                if not entries:
                    del self._pending[consumer]

    def _annotate(
        self, consumer: str, external_id: str, decide: Callable[[DatabaseObject], dict[str, str | None] | None]
    ) -> DatabaseObject:
        """Set (None: remove) annotations on the consumer's database from a fresh read; retried on write conflicts."""
        name = self._object_name(consumer, external_id)
        self._require_apiserver()
        budget = self._budget()
        for _ in range(ANNOTATE_ATTEMPTS):
            db = self._mine(self._get_live(name, budget), consumer, external_id)
            if db is None:
                raise NotFound()
            values = decide(db)
            if values is None:
                return db
            patch = {"metadata": {"resourceVersion": db.metadata.resource_version, "annotations": values}}
            try:
                patched = self.rest.patch(DATABASES, name, patch, self.namespace, timeout=budget.left())
            except ApiException as exc:
                if exc.status == 404:
                    raise NotFound() from None
                if exc.status != 409:
                    raise
                continue
            with self._pending_lock:
                self._own_writes[name] = _Pending(patched, time.monotonic())
            self._own_write_after(name, self.databases.get(f"{self.namespace}/{name}"))  # its event may be in already
            return _written(patched)
        raise Unavailable("the database is changing too often; try again")

    @staticmethod
    def _same_version(one: Obj, other: Obj) -> bool:
        return resource_version_of(one) == resource_version_of(other)

    def _credentials_secret(self, name: str, budget: _Budget) -> tuple[Obj | None, bool]:
        """The credentials Secret `name` with its data, and whether it was read from the apiserver just now.

        The cache holds no Secret's data (domain.cached): the Secret is read from the apiserver, and the last
        SECRETS_HELD read are kept while the cache shows the same version of them, so a consumer fetching its
        credentials again is answered from memory (and while the apiserver is gone)."""
        cached = self.secrets.get(f"{self.namespace}/{name}")
        with self._pending_lock:
            held = self._held_secrets.get(name)
            if held is not None and cached is not None and self._same_version(held, cached):
                self._held_secrets.move_to_end(name)
                return held, False
        secret = self._get_live(name, budget, SECRETS)
        with self._pending_lock:
            if secret is None:
                self._held_secrets.pop(name, None)
            else:
                secret.get("metadata", {}).pop("managedFields", None)  # never read: not worth holding
                self._held_secrets[name] = secret
                self._held_secrets.move_to_end(name)
                while len(self._held_secrets) > SECRETS_HELD:
                    self._held_secrets.popitem(last=False)
        return secret, True

    def _read_credentials(self, secret: Obj | None, db: DatabaseObject) -> tuple[Credentials | None, str | None]:
        """(credentials, None) if the Secret is present, owned by the Database and consistent; else a reason."""
        if secret is None:
            return None, "the credentials Secret is missing"
        if not is_controlled_by(secret, db.metadata.uid):
            return None, "the credentials Secret is not controlled by the Database"
        values = decode_secret_data(secret)
        key = missing_key(values)
        if key is not None:
            return None, f"the credentials Secret lacks key {key}"
        db_status = db.status
        if password_pending(secret, db_status.password_applied):
            return None, PASSWORD_PENDING  # not on the role yet: the old password still works
        tenant = db_status.tenant_name
        if tenant and not names_tenant(values, tenant):
            return None, "the credentials Secret does not match the tenant"
        problem = endpoint_problem(values)
        if problem is not None:
            return None, problem
        return Credentials.of_secret(values), None
