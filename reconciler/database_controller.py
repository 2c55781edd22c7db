"""The Database controller: placement, tenant provisioning, credentials, size classes, soft delete.

A reconcile reads as a column of guard clauses (CloudNativePG's order):
  fetch -> finalizer -> held (Kubernetes delete without the delete annotation: no SQL at all)
  -> soft delete (annotation) or recovery -> placement (persisted before any SQL) -> shard
  -> credentials Secret (written before the role, the source of the password) -> Ready fast path
  (no SQL unless the database's own inputs changed) -> provisioning.
SQL failures go into status (sanitized class) and are retried with backoff by raising
`ReconcileError(reason)`; they never escape as driver errors.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from domain.config import InstallConfig, UnknownSizeClass
from domain.constants import (
    ANNOTATION_DELETE_REQUESTED_AT,
    ANNOTATION_RESTORE_TENANT,
    ANNOTATION_ROTATE_END_SESSIONS,
    ANNOTATION_ROTATE_REQUESTED_AT,
    FINALIZER_TENANT,
    DatabaseConditionType,
    DatabaseReason,
    DriftReason,
    EventReason,
    Phase,
)
from domain.naming import PG_IDENTIFIER_RE, credentials_secret_name, tenant_name
from informers import SECRETS, Informer, Rest
from reconciler.admin import AdminEndpointCache, AdminPolicy, AdminSecretInvalid, AdminSessions, parse_shard_spec
from reconciler.credentials import (
    Endpoint,
    SecretState,
    build_secret,
    classify_secret,
    credentials_labels,
    endpoint_patch,
    new_password,
    password_id,
    password_patch,
    secret_values,
)
from reconciler.events import EventRecorder
from reconciler.placement import PlacementIndex
from reconciler.resources import DATABASES, database_shard
from reconciler.runtime import ReconcileError, Result, TerminalError, ensure_active, set_condition, update_status
from reconciler.runtime.status import get_condition, is_condition_true, remove_condition
from reconciler.sql import errors as sqlerrors
from reconciler.sql.errors import SqlFailure
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import (
    OwnerRecord,
    TenantSpec,
    claim_tenant,
    disable_tenant,
    drop_tenant,
    enable_tenant,
    ensure_tenant,
    set_connection_limit,
    set_password,
)

log = logging.getLogger(__name__)

NO_CAPACITY_RETRY = 300.0
# No usable shard, but some are only not Ready (down, being checked): a transient wait, not a
# capacity failure. A Shard turning Ready enqueues unplaced databases at once; this is the fallback.
SHARDS_UNAVAILABLE_RETRY = 30.0
# SQL failures that say more about the shard than about this database.
SHARD_TROUBLE = frozenset({sqlerrors.UNREACHABLE, sqlerrors.CONNECTION_LOST, sqlerrors.TIMEOUT})


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _conditional(patch: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """`patch` applied only to `obj` as read (409 otherwise): a write decided on a stale read, or
    sent late by a replica that was paused mid-request and has lost its Lease since, changes nothing."""
    metadata = {**patch.get("metadata", {}), "resourceVersion": obj["metadata"]["resourceVersion"]}
    return {**patch, "metadata": metadata}


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition_reason(conditions: list[dict[str, Any]], type_: str) -> str | None:
    """The reason of condition `type_` now: a value, not the dict that set_condition will change."""
    condition = get_condition(conditions, type_)
    return None if condition is None else condition.get("reason")


@dataclass
class Pass:
    """One reconcile's working state: the object as last written and the status being built."""

    db: dict[str, Any]
    status: dict[str, Any]

    @property
    def meta(self) -> dict[str, Any]:
        return self.db["metadata"]

    @property
    def spec(self) -> dict[str, Any]:
        return self.db.get("spec") or {}

    @property
    def conditions(self) -> list[dict[str, Any]]:
        return self.status.setdefault("conditions", [])

    @property
    def generation(self) -> int | None:
        return self.meta.get("generation")

    def describe(self) -> str:
        """consumer, externalId and shard: what events and logs say about a database."""
        shard = self.status.get("shard") or "unplaced"
        return f"consumer={self.spec.get('consumer')} externalId={self.spec.get('externalId')} shard={shard}"


class DatabaseController:
    def __init__(
        self,
        rest: Rest,
        config: InstallConfig,
        namespace: str,
        databases: Informer,
        shards: Informer,
        secrets: Informer,
        events: EventRecorder,
        sessions: AdminSessions | None = None,
        admin_host_override: str | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        policy: AdminPolicy | None = None,
    ) -> None:
        self.rest = rest
        self.config = config
        self.namespace = namespace
        self.databases = databases
        self.shards = shards
        self.secrets = secrets
        self.events = events
        self.sessions = sessions or AdminSessions()
        self.admin_host_override = admin_host_override
        self.admin_endpoints = AdminEndpointCache(rest, policy or AdminPolicy.from_config(config), admin_host_override)
        self._written: dict[str, str] = {}  # key -> resourceVersion of this replica's last write
        self.clock = clock
        # Called with a shard's name when its SQL failed as if the shard were down (set by setup).
        self.on_shard_trouble: Callable[[str], None] | None = None
        # Before any handler that enqueues Databases: a woken worker places with the event applied.
        self.placement = PlacementIndex(database_shard).watch(shards, databases)

    # -- writes ----------------------------------------------------------------------------------

    def _write_status(self, p: Pass) -> None:
        updated = update_status(self.rest, DATABASES, p.db, p.status)
        if updated is not None:
            p.db = updated
            p.status = copy.deepcopy(updated.get("status") or {})
            self._wrote(updated)

    def _wrote(self, db: dict[str, Any]) -> None:
        meta = db["metadata"]
        self._written[f"{meta['namespace']}/{meta['name']}"] = meta["resourceVersion"]

    def _caught_up(self, key: str, cached: dict[str, Any]) -> dict[str, Any] | None:
        """The object to reconcile: the cached one, or the live one while the cache lags our own write.

        The events of a pass's own writes wake the key again, and the cache may not show the last
        write yet (its watch event is in flight): a pass on it would redo recorded work (the SQL
        of a database that is Ready already) and fail on a conflict. So, like controller-runtime's
        expectations, remember the resourceVersion each pass wrote and read the object live until
        the cache has caught up with it.
        """
        written = self._written.get(key)
        if written is None:
            return cached
        if cached["metadata"].get("resourceVersion") == written:
            del self._written[key]
            return cached
        namespace, _, name = key.partition("/")
        try:
            live = self.rest.get(DATABASES, name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._written.pop(key, None)
            return None
        if live["metadata"].get("resourceVersion") != written:
            self._written.pop(key, None)  # written again since (by someone else): the live object rules
        return live

    def _set_ready(self, p: Pass, ready: bool, reason: str, message: str) -> bool:
        """Set the Ready condition; a new failure reason also becomes a Warning event."""
        # Read the old reason before set_condition mutates the condition dict in place.
        before = _condition_reason(p.conditions, DatabaseConditionType.READY)
        changed = set_condition(p.conditions, DatabaseConditionType.READY, ready, reason, message, p.generation)
        if not ready and before != reason and reason not in (DatabaseReason.PROVISIONING, DatabaseReason.DELETING):
            self.events.record(p.db, reason, f"{message} ({p.describe()})", warning=True)
        return changed

    def _fail(self, p: Pass, phase: str, reason: str, message: str, *, terminal: bool = False) -> None:
        """Record a failure in status, then raise so the key is retried with backoff (or not)."""
        p.status["phase"] = phase
        self._set_ready(p, False, reason, message)
        self._write_status(p)
        log.warning("database not ready", extra={"database": p.meta["name"], "reason": reason, "detail": message})
        if terminal:
            raise TerminalError(reason, message)
        raise ReconcileError(reason, message)

    def _patch_metadata(self, p: Pass, patch: dict[str, Any]) -> bool:
        """Patch metadata (finalizers); False when the object is gone already (404): nothing to do.

        A stale cache (another replica finished the delete, or the watch event of the removal is
        in flight) must not turn a finished delete into a reconcile error.
        """
        ensure_active()
        body = {"metadata": {**patch, "resourceVersion": p.meta["resourceVersion"]}}
        try:
            p.db = self.rest.patch(DATABASES, p.meta["name"], body, p.meta["namespace"])
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._written.pop(f"{p.meta['namespace']}/{p.meta['name']}", None)
            log.info("database already gone", extra={"database": p.meta["name"]})
            return False
        self._wrote(p.db)
        return True

    # -- reconcile -------------------------------------------------------------------------------

    def reconcile(self, key: str) -> Result | None:
        db = self.databases.get(key)
        if db is None:
            self._written.pop(key, None)
            return None
        db = self._caught_up(key, db)
        if db is None:
            return None
        p = Pass(db, copy.deepcopy(db.get("status") or {}))
        finalizers = p.meta.get("finalizers") or []
        k8s_deleting = bool(p.meta.get("deletionTimestamp"))
        delete_requested = ANNOTATION_DELETE_REQUESTED_AT in (p.meta.get("annotations") or {})

        if FINALIZER_TENANT not in finalizers:
            if k8s_deleting:
                return None  # nothing of ours is left on it
            if not self._patch_metadata(p, {"finalizers": [*finalizers, FINALIZER_TENANT]}):
                return None
            p.status = copy.deepcopy(p.db.get("status") or {})
        if k8s_deleting and not delete_requested:
            return self._hold(p)
        remove_condition(p.conditions, DatabaseConditionType.DELETION_HELD)  # the hold is over
        if delete_requested or is_condition_true(p.conditions, DatabaseConditionType.TENANT_DROPPED):
            return self._soft_delete(p)  # once dropped, never recovered or provisioned anew
        if p.status.get("phase") in (Phase.DELETING, Phase.DELETED) or p.status.get("dropAfter"):
            self._recover(p)

        if not p.status.get("shard"):
            result = self._place(p)
            if result is not None:
                return result
        shard = self.shards.get(p.status["shard"])
        if shard is None:
            self._fail(p, Phase.FAILED, DatabaseReason.SHARD_NOT_FOUND, f"shard {p.status['shard']} not found")
        endpoint = self._client_endpoint(shard)
        secret = self._ensure_secret(p, endpoint)

        if p.status.get("phase") == Phase.READY:
            return self._ready(p, shard, secret)
        return self._provision(p, shard, secret)

    # -- placement -------------------------------------------------------------------------------

    def _place(self, p: Pass) -> Result | None:
        """Choose the shard and the tenant name and persist both before any SQL."""
        try:
            self.config.resolve_connection_limit(p.spec.get("sizeClass") or "")
        except UnknownSizeClass:
            self._fail(
                p,
                Phase.FAILED,
                DatabaseReason.INVALID_SIZE_CLASS,
                f"size class {p.spec.get('sizeClass')!r} is not in sizeClasses",
                terminal=True,
            )
        restore = (p.meta.get("annotations") or {}).get(ANNOTATION_RESTORE_TENANT)
        if restore is not None:
            return self._adopt(p, restore)
        engine = p.spec.get("engine") or "postgres"
        chosen = self.placement.choose(engine)
        if chosen is None and (waiting := self.placement.not_ready(engine)):
            p.status["phase"] = Phase.PROVISIONING
            self._set_ready(
                p,
                False,
                DatabaseReason.SHARDS_UNAVAILABLE,
                f"no {engine} shard usable right now: {len(waiting)} not Ready ({', '.join(waiting[:3])}); "
                "placed as soon as one is Ready",
            )
            self._write_status(p)
            return Result(requeue_after=SHARDS_UNAVAILABLE_RETRY)
        if chosen is None:
            p.status["phase"] = Phase.FAILED
            self._set_ready(
                p,
                False,
                DatabaseReason.NO_CAPACITY,
                f"no accepting, ready {engine} shard below maxDatabases; retrying every 5 minutes",
            )
            self._write_status(p)
            return Result(requeue_after=NO_CAPACITY_RETRY)
        p.status.update(
            shard=chosen,
            tenantName=tenant_name(p.spec["externalId"], p.meta["uid"]),
            phase=Phase.PROVISIONING,
        )
        self._set_ready(p, False, DatabaseReason.PROVISIONING, "placed, SQL pending")
        self._write_status(p)
        self.events.record(p.db, EventReason.CREATED, f"placed ({p.describe()})")
        log.info("database placed", extra={"database": p.meta["name"], "shard": chosen})
        return None

    def _adopt(self, p: Pass, restore: str) -> Result | None:
        """An operator re-creates a lost Database on its existing tenant: no placement, same data."""
        shard, _, tenant = restore.partition("/")
        if not shard or len(tenant) > 63 or not re.fullmatch(PG_IDENTIFIER_RE, tenant):
            self._fail(
                p,
                Phase.FAILED,
                DatabaseReason.ENSURE_FAILED,
                f"annotation {ANNOTATION_RESTORE_TENANT} must be <shard>/<tenant name>",
                terminal=True,
            )
        self._claim(p, shard, tenant)
        p.status.update(shard=shard, tenantName=tenant, phase=Phase.PROVISIONING)
        self._set_ready(p, False, DatabaseReason.PROVISIONING, "restoring an existing tenant, SQL pending")
        self._write_status(p)
        self.events.record(p.db, EventReason.CREATED, f"restored onto its existing tenant ({p.describe()})")
        return None

    def _claim(self, p: Pass, shard_name: str, tenant: str) -> None:
        """Adopt only a tenant of this consumer whose owning Database is gone (RestoreRefused otherwise).

        Checked before anything is written: no other Database may name the tenant in its status,
        and the role's ownership record must name this consumer and a Database that no longer
        exists (read live, under the shard-side lock of `claim_tenant`).
        """
        uid = p.meta["uid"]

        def holder(items: list[dict[str, Any]]) -> str | None:
            for other in items:
                named = ((other.get("status") or {}).get("shard"), (other.get("status") or {}).get("tenantName"))
                if other["metadata"]["uid"] != uid and named == (shard_name, tenant):
                    return str(other["metadata"]["name"])
            return None

        def live() -> list[dict[str, Any]]:
            return self.rest.list(DATABASES, p.meta["namespace"]).get("items") or []

        def released(record: OwnerRecord) -> bool:
            items = live()
            return holder(items) is None and all(o["metadata"]["uid"] != record.database_uid for o in items)

        other = holder(live())
        if other is not None:
            self._refuse_restore(p, f"Database {other} owns tenant {shard_name}/{tenant}")
        shard = self.shards.get(shard_name)
        if shard is None:
            self._fail(p, Phase.FAILED, DatabaseReason.SHARD_NOT_FOUND, f"shard {shard_name} not found")
        session = self._session(p, shard, Phase.PROVISIONING, DatabaseReason.ADMIN_UNAVAILABLE)
        try:
            claim_tenant(session, tenant, self._owner(p), released)
        except SqlFailure as failure:
            if failure.error_class in (sqlerrors.RESTORE_REFUSED, sqlerrors.NAME_TAKEN):
                self._refuse_restore(p, f"{failure}: {shard_name}/{tenant}")
            self.sessions.drop(shard_name)
            self.admin_endpoints.forget(shard_name)
            self._fail(p, Phase.PROVISIONING, DatabaseReason.ADMIN_UNAVAILABLE, str(failure))

    def _refuse_restore(self, p: Pass, message: str) -> None:
        self._fail(
            p,
            Phase.FAILED,
            DatabaseReason.RESTORE_REFUSED,
            f"annotation {ANNOTATION_RESTORE_TENANT} refused, nothing was changed: {message}",
            terminal=True,
        )

    @staticmethod
    def _owner(p: Pass) -> OwnerRecord:
        """The ownership record this Database writes into its tenant role's comment."""
        return OwnerRecord(str(p.spec.get("consumer") or ""), str(p.meta["uid"]))

    @staticmethod
    def _client_endpoint(shard: dict[str, Any]) -> Endpoint:
        client = (shard.get("spec") or {}).get("client") or {}
        return Endpoint(
            str(client.get("host", "")), int(client.get("port", 5432)), str(client.get("sslmode", "require"))
        )

    # -- credentials -----------------------------------------------------------------------------

    def _secret_name(self, p: Pass) -> str:
        return credentials_secret_name(p.meta["name"])

    def _ensure_secret(self, p: Pass, endpoint: Endpoint) -> dict[str, Any]:
        """The credentials Secret: created before the role exists; endpoint keys follow the shard."""
        tenant = p.status["tenantName"]
        secret = self.secrets.get(f"{p.meta['namespace']}/{self._secret_name(p)}")
        state = classify_secret(secret, p.meta["uid"], tenant)
        if state is SecretState.MISSING:
            # Its new password (a new id) is pending until status.passwordApplied names it: the role
            # may exist already (the Secret was deleted, an existing tenant is adopted, or a crash hit
            # between the SQL and the status write), and ensure_tenant leaves a finished tenant's
            # password alone.
            body = build_secret(p.db, tenant, new_password(), endpoint)
            ensure_active()
            try:
                return self.rest.create(SECRETS, body, p.meta["namespace"])
            except ApiException as exc:
                if exc.status != 409:
                    raise
            secret, state = self._uncached_secret(p, tenant)
        if state is not SecretState.OURS:
            what = "is not owned by this Database" if state is SecretState.FOREIGN else "is inconsistent"
            self._fail(
                p,
                p.status.get("phase") or Phase.PROVISIONING,
                DatabaseReason.CREDENTIALS_SECRET_CONFLICT,
                f"Secret {self._secret_name(p)} {what}; it is never overwritten",
            )
        assert secret is not None
        patch = endpoint_patch(secret, endpoint)
        if patch is not None:
            ensure_active()
            patch = _conditional(patch, secret)
            secret = self.rest.patch(SECRETS, secret["metadata"]["name"], patch, p.meta["namespace"])
        return secret

    def _uncached_secret(self, p: Pass, tenant: str) -> tuple[dict[str, Any], SecretState]:
        """The Secret of that name that the label-selected cache does not hold (or not yet).

        One written before its labels were the cache's selector (or stripped of them) is ours
        again once labelled; anyone else's stays untouched and is reported as a conflict.
        """
        secret = self.rest.get(SECRETS, self._secret_name(p), p.meta["namespace"])
        state = classify_secret(secret, p.meta["uid"], tenant)
        labels = credentials_labels(p.db)
        if state is SecretState.OURS and any(
            (secret["metadata"].get("labels") or {}).get(k) != v for k, v in labels.items()
        ):
            ensure_active()
            patch = {"metadata": {"labels": labels, "resourceVersion": secret["metadata"]["resourceVersion"]}}
            secret = self.rest.patch(SECRETS, secret["metadata"]["name"], patch, p.meta["namespace"])
        return secret, state

    def _password(self, secret: dict[str, Any]) -> str:
        return secret_values(secret)["password"]

    @staticmethod
    def _password_pending(p: Pass, secret: dict[str, Any]) -> bool:
        """The Secret holds a password that may not be set on the role yet."""
        current = password_id(secret)
        return current is not None and current != p.status.get("passwordApplied")

    @staticmethod
    def _password_applied(p: Pass, secret: dict[str, Any]) -> None:
        """Record (with the next status write) that the Secret's password is the role's."""
        current = password_id(secret)
        if current is not None:
            p.status["passwordApplied"] = current

    # -- shard access ----------------------------------------------------------------------------

    def _session(self, p: Pass, shard: dict[str, Any], failure_phase: str, reason: str) -> AdminSession:
        """An admin session for the placed shard, or a recorded failure (retried with backoff)."""
        name = shard["metadata"]["name"]
        if not is_condition_true((shard.get("status") or {}).get("conditions"), "Ready"):
            self._fail(p, failure_phase, reason, f"shard {name} is not Ready; retrying")
        try:
            endpoint = self.admin_endpoints.get(name, parse_shard_spec(shard))
        except (AdminSecretInvalid, ApiException) as exc:
            detail = str(exc) if isinstance(exc, AdminSecretInvalid) else f"HTTP {exc.status}"
            self._fail(p, failure_phase, reason, f"no usable admin connection to shard {name}: {detail}")
        return self.sessions.get(name, endpoint)

    def _sql(self, p: Pass, failure_phase: str, reason: str, operation: Callable[[], None], shard: str) -> None:
        try:
            operation()
        except SqlFailure as failure:
            self.sessions.drop(shard)
            self.admin_endpoints.forget(shard)  # the retry reads the admin Secret again
            if failure.error_class in SHARD_TROUBLE and self.on_shard_trouble is not None:
                self.on_shard_trouble(shard)  # let the Shard controller look now, not at its next ping
            self._fail(p, failure_phase, reason, str(failure))

    # -- provisioning ----------------------------------------------------------------------------

    def _provision(self, p: Pass, shard: dict[str, Any], secret: dict[str, Any]) -> Result | None:
        shard_name = shard["metadata"]["name"]
        size_class = p.spec.get("sizeClass") or ""
        try:
            limit = self.config.resolve_connection_limit(size_class)
        except UnknownSizeClass:
            self._fail(
                p,
                Phase.FAILED,
                DatabaseReason.INVALID_SIZE_CLASS,
                f"size class {size_class!r} is not in sizeClasses",
                terminal=True,
            )
        session = self._session(p, shard, Phase.PROVISIONING, DatabaseReason.ADMIN_UNAVAILABLE)
        tenant = TenantSpec(p.status["tenantName"], self._password(secret), limit, self._owner(p))

        pending = self._password_pending(p, secret)

        def run() -> None:
            # A finished tenant keeps its old password through ensure_tenant: set the pending one.
            if ensure_tenant(session, tenant) and pending:
                set_password(session, tenant.name, tenant.password)

        self._sql(p, Phase.PROVISIONING, DatabaseReason.ENSURE_FAILED, run, shard_name)
        self._password_applied(p, secret)
        annotations = p.meta.get("annotations") or {}
        p.status.update(
            phase=Phase.READY,
            appliedSizeClass=size_class,
            appliedConnectionLimit=limit,
            observedGeneration=p.generation,
        )
        if ANNOTATION_ROTATE_REQUESTED_AT in annotations:
            p.status["rotationApplied"] = annotations[ANNOTATION_ROTATE_REQUESTED_AT]
        self._set_ready(p, True, DatabaseReason.PROVISIONED, "tenant exists on the shard")
        self._set_drift(p)
        self._write_status(p)
        self.events.record(p.db, EventReason.READY, f"ready ({p.describe()})")
        log.info("database ready", extra={"database": p.meta["name"], "shard": shard_name})
        return None

    # -- Ready: SQL only for the database's own inputs -------------------------------------------

    @classmethod
    def _ready_work(cls, p: Pass, secret: dict[str, Any]) -> tuple[bool, str | None, bool, bool]:
        """(password pending, rotation request, rotation requested, resize): the SQL a Ready database needs."""
        pending = cls._password_pending(p, secret)
        rotation = (p.meta.get("annotations") or {}).get(ANNOTATION_ROTATE_REQUESTED_AT)
        rotate_requested = rotation is not None and rotation != p.status.get("rotationApplied")
        resize = (p.spec.get("sizeClass") or "") != (p.status.get("appliedSizeClass") or "")
        return pending, rotation, rotate_requested, resize

    def _refresh(self, p: Pass, secret: dict[str, Any]) -> dict[str, Any]:
        """Re-read the Database and its Secret from the apiserver before SQL that must run once.

        The caches may not show this replica's own last writes yet (another watch stream); acting
        on them could rotate a password or alter a limit a second time.
        """
        p.db = self.rest.get(DATABASES, p.meta["name"], p.meta["namespace"])
        p.status = copy.deepcopy(p.db.get("status") or {})
        return self.rest.get(SECRETS, secret["metadata"]["name"], p.meta["namespace"])

    def _ready(self, p: Pass, shard: dict[str, Any], secret: dict[str, Any]) -> Result | None:
        shard_name = shard["metadata"]["name"]
        pending, rotation, rotate_requested, resize = self._ready_work(p, secret)
        if pending or rotate_requested or resize:
            secret = self._refresh(p, secret)
            pending, rotation, rotate_requested, resize = self._ready_work(p, secret)
        size_class = p.spec.get("sizeClass") or ""

        if rotate_requested and not pending:
            ensure_active()
            patch = _conditional(password_patch(new_password()), secret)
            secret = self.rest.patch(SECRETS, secret["metadata"]["name"], patch, p.meta["namespace"])
            pending = True
        if pending:
            session = self._session(p, shard, Phase.READY, DatabaseReason.ADMIN_UNAVAILABLE)
            tenant, password = p.status["tenantName"], self._password(secret)
            annotations = p.meta.get("annotations") or {}
            end_sessions = rotate_requested and annotations.get(ANNOTATION_ROTATE_END_SESSIONS) == rotation

            def rotate() -> None:
                set_password(session, tenant, password, end_sessions=end_sessions)

            self._sql(p, Phase.READY, DatabaseReason.ADMIN_UNAVAILABLE, rotate, shard_name)
            self._password_applied(p, secret)
            if rotation is not None:
                p.status["rotationApplied"] = rotation
            log.info("credentials rotated", extra={"database": p.meta["name"], "shard": shard_name})
        if resize:
            try:
                limit = self.config.resolve_connection_limit(size_class)
            except UnknownSizeClass:
                limit = None  # reported as drift (UnknownSizeClass); nothing to apply
            if limit is not None and limit != p.status.get("appliedConnectionLimit"):
                session = self._session(p, shard, Phase.READY, DatabaseReason.SET_LIMIT_FAILED)
                tenant = p.status["tenantName"]

                def resize_role() -> None:
                    set_connection_limit(session, tenant, limit)

                self._sql(p, Phase.READY, DatabaseReason.SET_LIMIT_FAILED, resize_role, shard_name)
            if limit is not None:
                p.status.update(appliedSizeClass=size_class, appliedConnectionLimit=limit)
        p.status["observedGeneration"] = p.generation
        self._set_ready(p, True, DatabaseReason.PROVISIONED, "tenant exists on the shard")
        self._set_drift(p)
        self._write_status(p)
        return None

    def _set_drift(self, p: Pass) -> None:
        """ConnectionLimitDrift: the install config now resolves another limit (or no class at all)."""
        size_class = p.spec.get("sizeClass") or ""
        applied = p.status.get("appliedConnectionLimit")
        try:
            wanted = self.config.resolve_connection_limit(size_class)
        except UnknownSizeClass:
            reason, message = DriftReason.UNKNOWN_SIZE_CLASS, f"size class {size_class!r} is no longer configured"
        else:
            if applied is None or wanted == applied:
                remove_condition(p.conditions, DatabaseConditionType.CONNECTION_LIMIT_DRIFT)
                return
            reason = DriftReason.CONFIG_CHANGED
            message = (
                f"install config resolves connection limit {wanted}, the role has {applied}; change "
                "spec.sizeClass to apply a new limit"
            )
        before = _condition_reason(p.conditions, DatabaseConditionType.CONNECTION_LIMIT_DRIFT)
        set_condition(p.conditions, DatabaseConditionType.CONNECTION_LIMIT_DRIFT, True, reason, message, p.generation)
        if before != reason:  # the database stays Ready, but the operator should know once
            self.events.record(p.db, reason, f"{message} ({p.describe()})", warning=True)

    # -- deletion --------------------------------------------------------------------------------

    def _hold(self, p: Pass) -> Result | None:
        """Deleted in Kubernetes without a delete request: keep everything, run no SQL, say so."""
        changed = set_condition(
            p.conditions,
            DatabaseConditionType.DELETION_HELD,
            True,
            "DeletionHeld",
            f"deleted without the {ANNOTATION_DELETE_REQUESTED_AT} annotation: held by the finalizer, "
            "nothing is dropped; set the annotation to soft-delete or see the docs to restore",
            p.generation,
        )
        if changed:
            self._write_status(p)
            self.events.record(
                p.db,
                EventReason.DELETION_HELD,
                f"deletion held, no delete annotation ({p.describe()})",
                warning=True,
            )
        return None

    def _retention_deadline(self, p: Pass) -> datetime:
        requested = _parse_time((p.meta.get("annotations") or {}).get(ANNOTATION_DELETE_REQUESTED_AT))
        return (requested or self.clock()) + self.config.soft_delete.retention

    def _soft_delete(self, p: Pass) -> Result | None:
        if (
            not p.status.get("shard")
            or p.status.get("phase") == Phase.DELETED
            or is_condition_true(p.conditions, DatabaseConditionType.TENANT_DROPPED)
        ):
            return self._finish_delete(p)
        if p.status.get("phase") != Phase.DELETING or not p.status.get("dropAfter"):
            p.status.update(phase=Phase.DELETING, dropAfter=_rfc3339(self._retention_deadline(p)))
            self._set_ready(p, False, DatabaseReason.DELETING, "soft delete in progress")
            self._write_status(p)
            self.events.record(p.db, EventReason.DELETE_REQUESTED, f"delete requested ({p.describe()})")
        shard = self.shards.get(p.status["shard"])
        if shard is None:
            self._fail(
                p,
                Phase.DELETING,
                DatabaseReason.SHARD_NOT_FOUND,
                f"shard {p.status['shard']} not found: the tenant can be neither disabled nor dropped",
            )
        tenant = p.status["tenantName"]
        shard_name = shard["metadata"]["name"]
        if not is_condition_true(p.conditions, DatabaseConditionType.TENANT_DISABLED):
            session = self._session(p, shard, Phase.DELETING, DatabaseReason.DISABLE_FAILED)

            def disable() -> None:
                disable_tenant(session, tenant)

            self._sql(p, Phase.DELETING, DatabaseReason.DISABLE_FAILED, disable, shard_name)
            set_condition(
                p.conditions,
                DatabaseConditionType.TENANT_DISABLED,
                True,
                "Disabled",
                "login and connections disabled, sessions ended; remove the delete annotation to recover",
                p.generation,
            )
            self._set_ready(p, False, DatabaseReason.DELETING, "soft delete in progress")
            self._write_status(p)
            self.events.record(p.db, EventReason.DISABLED, f"tenant disabled ({p.describe()})")
        drop_after = _parse_time(p.status.get("dropAfter")) or self.clock()
        wait = (drop_after - self.clock()).total_seconds()
        if wait > 0:
            return Result(requeue_after=wait)
        session = self._session(p, shard, Phase.DELETING, DatabaseReason.DROP_FAILED)

        def drop() -> None:
            drop_tenant(session, tenant)

        self._sql(p, Phase.DELETING, DatabaseReason.DROP_FAILED, drop, shard_name)
        set_condition(
            p.conditions,
            DatabaseConditionType.TENANT_DROPPED,
            True,
            "Dropped",
            "database and role dropped",
            p.generation,
        )
        p.status["phase"] = Phase.DELETED
        self._set_ready(p, False, DatabaseReason.DELETING, "tenant dropped")
        self._write_status(p)
        self.events.record(p.db, EventReason.DROPPED, f"tenant dropped ({p.describe()})")
        return self._finish_delete(p)

    def _finish_delete(self, p: Pass) -> Result | None:
        """Remove the credentials Secret and the object itself (no garbage collector is relied on)."""
        ensure_active()
        try:
            self.rest.delete(SECRETS, self._secret_name(p), p.meta["namespace"])
        except ApiException as exc:
            if exc.status != 404:
                raise
        finalizers = [f for f in p.meta.get("finalizers") or [] if f != FINALIZER_TENANT]
        if not self._patch_metadata(p, {"finalizers": finalizers}):
            return None  # deleted meanwhile: the delete is done
        if not p.db["metadata"].get("deletionTimestamp"):
            try:
                self.rest.delete(DATABASES, p.meta["name"], p.meta["namespace"])
            except ApiException as exc:
                if exc.status != 404:
                    raise
        log.info("database deleted", extra={"database": p.meta["name"]})
        return None

    def _recover(self, p: Pass) -> None:
        """The delete annotation was removed before the drop: re-enable the same tenant."""
        if p.status.get("phase") == Phase.DELETED:
            return
        if is_condition_true(p.conditions, DatabaseConditionType.TENANT_DISABLED):
            shard = self.shards.get(p.status["shard"])
            if shard is None:
                self._fail(p, Phase.DELETING, DatabaseReason.SHARD_NOT_FOUND, f"shard {p.status['shard']} not found")
            session = self._session(p, shard, Phase.DELETING, DatabaseReason.ADMIN_UNAVAILABLE)
            tenant = p.status["tenantName"]

            def enable() -> None:
                enable_tenant(session, tenant)

            self._sql(p, Phase.DELETING, DatabaseReason.ADMIN_UNAVAILABLE, enable, shard["metadata"]["name"])
        remove_condition(p.conditions, DatabaseConditionType.TENANT_DISABLED)
        p.status.pop("dropAfter", None)
        p.status["phase"] = Phase.READY if p.status.get("appliedConnectionLimit") is not None else Phase.PROVISIONING
        self._write_status(p)
        self.events.record(p.db, EventReason.READY, f"recovered from soft delete ({p.describe()})")
